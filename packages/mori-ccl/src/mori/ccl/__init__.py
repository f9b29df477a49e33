# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ccl: lightweight collectives for latency-sensitive, few-SM use.

:class:`Communicator` runs all-reduce (one-shot, two-shot), all-gather,
reduce-scatter, all-to-all(v), broadcast and barrier over mori's symmetric heap, with
functional shortcuts (:func:`all_reduce`, ...) over one cached communicator per
group: on host heaps with CPU tensors, on CUDA heaps as kernels on the current stream
(capturable in CUDA graphs; see the package README for what has run on a GPU).
:func:`reduce_sum` and :func:`cpu_all_reduce` are the host reduction and a reference
all-reduce over any mori bootstrap.
"""

from __future__ import annotations

import mori.core  # noqa: F401  (loads libmori_core before the extension)

from . import _C  # noqa: F401
from ._version import __version__
from .communicator import Communicator
from .functional import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    reduce_scatter,
)
from .reference import cpu_all_reduce, reduce_sum
from .sdma import All2allSdma, AllgatherSdma, AllreduceSdma

__all__ = [
    "All2allSdma",
    "AllgatherSdma",
    "AllreduceSdma",
    "Communicator",
    "__version__",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "cpu_all_reduce",
    "reduce_scatter",
    "reduce_sum",
]
