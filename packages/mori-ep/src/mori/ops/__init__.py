# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ops: ROCm/mori's module name for the expert-parallel API.

A re-export of :mod:`mori.ep`, name for name (``EpDispatchCombineConfig``,
``EpDispatchCombineOp``, ``EpDispatchCombineKernelType``, ...), so code ported
from ROCm/mori keeps ``mori.ops.X``. Whatever :mod:`mori.ep` exports, this module
exports; nothing is defined here. MORI's submodule ``mori.ops.local_expert_count``
re-exports :mod:`mori.ep.local_expert_count`.
"""

from mori.ep import *  # noqa: F403
from mori.ep import __all__ as _ep_all

__all__ = list(_ep_all)
