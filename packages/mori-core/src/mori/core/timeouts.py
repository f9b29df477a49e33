# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The one set of rules for every timeout a caller gives mori, in every package.

The native code applies the same rules (``mori/core/timeout.hpp``); these wrap it for
Python code that keeps or forwards a timeout itself:

- NaN, zero and negative timeouts are refused with
  :class:`mori.core.InvalidArgumentError` naming the argument and the value (where 0
  or a negative value has a documented meaning, such as MORI's ``wait_all(statuses,
  timeout_ms=-1)``, that meaning stays);
- ``inf`` and anything above :data:`MAX_TIMEOUT_S` (a year) saturate to it: "practically
  forever", without any deadline overflowing;
- a positive timeout below the unit it is counted in rounds up to one unit.
"""

from __future__ import annotations

import math
import numbers

from . import _C
from .errors import InvalidArgumentError

#: Longer timeouts mean "practically forever" and are clamped to this (a year).
MAX_TIMEOUT_S: float = _C.max_timeout_s

_INT32_MAX = (1 << 31) - 1


def _number(value, name: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(
            f"{name} {value!r} must be a number of {unit} (inf means practically forever)"
        )
    try:
        return float(value)
    except OverflowError:  # an int beyond a double's range
        return math.inf if value > 0 else -math.inf


def seconds(value, name: str = "timeout_s") -> float:
    """``value`` seconds checked (> 0, not NaN) and saturated at MAX_TIMEOUT_S."""
    return _C.timeout_seconds(_number(value, name, "seconds"), name)


def milliseconds(
    value, name: str, *, max_ms: int = _INT32_MAX, zero_means_never: bool = False
) -> int:
    """A timeout in whole milliseconds (config fields): checked (> 0, or 0 where
    ``zero_means_never``), rounded up and saturated at ``max_ms`` (default: the
    largest int32, about 24.8 days, the native fields' range)."""
    return _C.timeout_ms(_number(value, name, "milliseconds"), name, int(max_ms), zero_means_never)


def wait_milliseconds(value, name: str = "timeout_ms") -> int:
    """MORI's wait timeouts: negative waits without a limit (returns -1), 0 polls once,
    a positive one is rounded up and saturated at MAX_TIMEOUT_S; NaN is refused."""
    return _C.wait_timeout_ms(_number(value, name, "milliseconds"), name)


__all__ = ["MAX_TIMEOUT_S", "milliseconds", "seconds", "wait_milliseconds"]
