# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MORI's dispatch/combine names under their earlier module: the config and its enums
live in :mod:`mori.ep.config`, the op in :mod:`mori.ep.op` (its modes in
:mod:`mori.ep.intranode` and :mod:`mori.ep.low_latency`)."""

from .config import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineQuantType
from .op import EpDispatchCombineOp

__all__ = [
    "EpDispatchCombineConfig",
    "EpDispatchCombineKernelType",
    "EpDispatchCombineOp",
    "EpDispatchCombineQuantType",
]
