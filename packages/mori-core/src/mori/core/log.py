# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Module loggers of libmori_core (core, shmem, io, ep, ccl).

Thresholds start from MORI_LOG_LEVEL and MORI_LOG_LEVEL_<MODULE> (the latter wins)
and can be changed at run time; the change is seen by every extension because the
loggers live in the one libmori_core of the process.
"""

from __future__ import annotations

from . import _C

MODULES = ("core", "shmem", "io", "ep", "ccl")
LEVELS = ("trace", "debug", "info", "warn", "error", "off")


def set_log_level(level: str, module: str | None = None) -> None:
    """Set the threshold of ``module`` (or of every module when None) to ``level``."""
    for m in MODULES if module is None else (module,):
        _C.set_log_level(m, level)


def get_log_level(module: str) -> str:
    """Current threshold of ``module`` ("trace" ... "off")."""
    return _C.get_log_level(module)


def log(module: str, level: str, message: str) -> None:
    """Write ``message`` through a module logger, as native code does."""
    _C.log(module, level, message)
