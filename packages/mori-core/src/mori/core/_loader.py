# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Loads libmori_core.so before any mori extension is imported.

Each extension (mori.core._C, mori.io._C, ...) records libmori_core.so as a needed
library. Loading it here first, from this package's lib/ directory, means the
dynamic loader finds it by soname and every extension shares this one copy and
its process-wide state (loggers, heap, transports).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
LIB_DIR = _PACKAGE_DIR / "lib"
LIBRARY_PATH = LIB_DIR / "libmori_core.so"

_handle: ctypes.CDLL | None = None


def load_native() -> ctypes.CDLL:
    """Load libmori_core.so once per process and return its handle."""
    global _handle
    if _handle is None:
        if not LIBRARY_PATH.exists():
            raise ImportError(
                f"libmori_core.so not found at {LIBRARY_PATH}; the mori-core installation is "
                "incomplete (reinstall the mori-core wheel)"
            )
        mode = getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0)
        _handle = ctypes.CDLL(str(LIBRARY_PATH), mode=mode)
    return _handle
