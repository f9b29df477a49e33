# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.shmem: ROCm/mori's shmem module names over :mod:`mori.core.shmem`.

For code ported from ROCm/mori (``mori.shmem.shmem_torch_process_group_init("default")``,
``shmem_malloc``, ``shmem_ptr_p2p``, ``mori_shmem_create_tensor``, ...). New code can
use :mod:`mori.core.shmem` directly, whose tensors free themselves. The functions are
in :mod:`mori.shmem.api`; the torch tensor helpers in :mod:`mori.shmem.tensor_utils`
load on first use, so ``import mori.shmem`` does not import torch.
"""

from __future__ import annotations

import importlib

from .api import *  # noqa: F403
from .api import __all__ as _api_all

_TENSOR_UTILS = (
    "MoriShmemBuffer",
    "mori_shmem_create_tensor",
    "mori_shmem_create_tensor_list_intra_node",
    "mori_shmem_free_tensor",
    "symm_mori_shmem_tensor",
)


def __getattr__(name: str):
    if name in _TENSOR_UTILS:
        return getattr(importlib.import_module(".tensor_utils", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TENSOR_UTILS))


# The tensor helpers stay out of __all__ so that a star import does not import torch.
__all__ = list(_api_all)
