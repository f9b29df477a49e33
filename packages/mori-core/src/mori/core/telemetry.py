# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Scoped timers of libmori_core.

Off by default: a timer then costs one predicted-not-taken branch. Switch a module
on with MORI_TELEMETRY=io,ep (or all) or :func:`enable`, read with :func:`stats`.
"""

from __future__ import annotations

from . import _C
from .log import MODULES


def enable(module: str | None = None, on: bool = True) -> None:
    """Switch the timers of ``module`` (every module when None) on or off."""
    for m in MODULES if module is None else (module,):
        _C.telemetry_enable(m, on)


def disable(module: str | None = None) -> None:
    """Switch the timers of ``module`` (every module when None) off."""
    enable(module, on=False)


def enabled(module: str) -> bool:
    """Whether ``module``'s timers are on."""
    return _C.telemetry_enabled(module)


def stats() -> list[dict]:
    """Per timer site: module, name, count, total_ns, min_ns, max_ns, mean_ns."""
    out = []
    for s in _C.telemetry_snapshot():
        s = dict(s)
        s["mean_ns"] = s["total_ns"] / s["count"] if s["count"] else 0.0
        out.append(s)
    return out


def reset() -> None:
    """Zero every timer site's statistics."""
    _C.telemetry_reset()
