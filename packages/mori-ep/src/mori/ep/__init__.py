# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ep: MoE expert-parallel dispatch and combine.

MORI's dispatch/combine API (:class:`EpDispatchCombineOp`) with the intra-node
protocol implemented twice: on CPU over mori.core's host symmetric heap, and as CUDA
kernels (sm_90, NVLink P2P) over a CUDA heap when the package is built with CUDA;
and the routing layout step (:func:`get_dispatch_layout`) on CPU and CUDA; MORI's raw
local expert count (:func:`launch_local_expert_count`, config
``mori.cpp.EpDispatchCombineConfig``).
"""

from __future__ import annotations

import mori.core  # noqa: F401  (loads libmori_core before the extension)

from . import _C  # noqa: F401  (the extension, for mori.ep._C users)
from ._version import __version__
from .config import (
    EpDispatchCombineConfig,
    EpDispatchCombineKernelType,
    EpDispatchCombineQuantType,
)
from .layout import get_dispatch_layout
from .local_expert_count import launch_local_expert_count
from .op import EpDispatchCombineOp
from .routing import EpDispatchRoutingHandle

__all__ = [
    "EpDispatchCombineConfig",
    "EpDispatchCombineKernelType",
    "EpDispatchCombineOp",
    "EpDispatchCombineQuantType",
    "EpDispatchRoutingHandle",
    "__version__",
    "get_dispatch_layout",
    "launch_local_expert_count",
]
