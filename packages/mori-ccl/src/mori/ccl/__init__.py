# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ccl: lightweight collectives for latency-sensitive, few-SM use.

This release has the host reduction (:func:`reduce_sum`) and a reference all-reduce
over any mori bootstrap (:func:`cpu_all_reduce`); the GPU collectives over
symmetric memory follow (see the package README).
"""

from __future__ import annotations

import mori.core  # noqa: F401  (loads libmori_core before the extension)

from . import _C  # noqa: F401
from ._version import __version__
from .reference import cpu_all_reduce, reduce_sum

__all__ = ["__version__", "cpu_all_reduce", "reduce_sum"]
