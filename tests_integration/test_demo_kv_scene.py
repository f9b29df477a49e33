# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The demo's KV-cache scene (examples/demo.py --scene kv) runs in the test
environment, with numpy installed as users have it: it exits 0, verifies every
request's blocks and prints no warning."""

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def test_kv_scene_exits_cleanly_without_warnings():
    import numpy  # noqa: F401  (the case that used to crash: numpy importable)

    out = subprocess.run(
        [sys.executable, str(DEMO), "--scene", "kv"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Warning" not in out.stderr and "Warning" not in out.stdout, out.stdout + out.stderr
    assert "decode cache: 11 blocks outside the requests unchanged: yes" in out.stdout
    assert out.stdout.count(" yes\n") >= 6, out.stdout  # every request's row: verified
    assert " NO" not in out.stdout and "backend: " in out.stdout
