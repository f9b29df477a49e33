# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Descriptor exchange between the two-process test workers through files in a
shared temporary directory (published by atomic rename, so a reader never sees a
partial file)."""

import os
import sys
import time


def wait_file(path, timeout_s=60.0):
    """Contents of ``path`` once it exists; exits the worker after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {path}")
        time.sleep(0.01)
    with open(path, "rb") as f:
        return f.read()


def publish(path, data):
    """Write ``data`` to ``path`` atomically."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
