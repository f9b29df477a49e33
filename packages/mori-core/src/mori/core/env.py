# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori's environment variables, read with the native parser's syntax and errors.

Every variable mori reads is listed in ``docs/configuration.md``. An unset or empty
variable means "not set" (the default applies); a malformed or out-of-range value
raises :class:`mori.core.InvalidArgumentError` naming the variable and the value.

- booleans: ``1/0``, ``true/false``, ``on/off``, ``yes/no`` (any case);
- integers: decimal, within the bounds the reader gives;
- sizes: bytes, a decimal number with an optional unit ``K``, ``M``, ``G`` or ``T``
  (powers of 1024; ``KiB`` and ``KB`` alike).

The functions read ``os.environ`` as the process sees it now (Python's
``os.environ[...] = ...`` reaches them).
"""

from __future__ import annotations

from . import _C

_INT64 = (-(1 << 63), (1 << 63) - 1)


def get(name: str) -> str | None:
    """The variable's value, or None when it is unset or empty."""
    return _C.env_get(name)


def parse_bool(name: str, value: str) -> bool:
    """``value`` read as variable ``name``'s boolean (raises naming both if it is none)."""
    return _C.env_parse_bool(name, value)


def get_bool(name: str, default: bool) -> bool:
    """A boolean variable, or ``default`` when it is not set."""
    return _C.env_bool(name, bool(default))


def get_int(name: str, default: int, lo: int = _INT64[0], hi: int = _INT64[1]) -> int:
    """An integer variable in ``[lo, hi]``, or ``default`` when it is not set."""
    return _C.env_int(name, int(default), int(lo), int(hi))


def get_size(name: str, default: int, lo: int = 0, hi: int = (1 << 64) - 1) -> int:
    """A byte count (``4096``, ``2M``, ``1GiB``) in ``[lo, hi]``, or ``default``."""
    return _C.env_size(name, int(default), int(lo), int(hi))


def get_str(name: str, default: str | None = None) -> str | None:
    """A string variable, or ``default`` when it is not set."""
    value = get(name)
    return default if value is None else value


__all__ = ["get", "get_bool", "get_int", "get_size", "get_str", "parse_bool"]
