# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's symmetric-tensor helpers (torch), over :mod:`mori.core.shmem`.

Tensors made here are views of explicit allocations, as in ROCm/mori: they do not
free their memory when dropped; :func:`mori_shmem_free_tensor` does. (For tensors
that free themselves use :func:`mori.core.shmem.empty`.) They live on the heap's
device: the CUDA device for CUDA heaps, the CPU for host heaps.
"""

from __future__ import annotations

import torch

from mori.core import _C
from mori.core import shmem as _shmem
from mori.core.errors import InvalidArgumentError

from . import api


def _cuda_heap() -> bool:
    return _shmem.info()["kind"] == "cuda"


class MoriShmemBuffer:
    """``nbytes`` bytes at symmetric address ``ptr`` as a 1-D uint8 array interface:
    ``__cuda_array_interface__`` on a CUDA heap, ``__array_interface__`` on a host
    heap (numpy and torch read either without a copy). ``dtype`` is recorded for the
    caller, as in ROCm/mori."""

    def __init__(self, ptr: int, nbytes: int, dtype: torch.dtype):
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)
        self.dtype = dtype
        interface = {
            "data": (self.ptr, False),
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "strides": None,
            "version": 3,
        }
        if _cuda_heap():
            self.__cuda_array_interface__ = interface
        else:
            self.__array_interface__ = interface


def _view(ptr: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    code, bits = _shmem._dlpack_code(dtype)
    return torch.from_dlpack(_C.shmem_dlpack(ptr, list(shape), code, bits, False))


def _require_symm(tensor: torch.Tensor, what: str) -> None:
    if not getattr(tensor, "__symm_tensor__", False):
        raise InvalidArgumentError(
            f"{what}: the tensor (shape {tuple(tensor.shape)}, {tensor.dtype}) was not made by "
            "mori_shmem_create_tensor"
        )


def mori_shmem_create_tensor(shape, dtype: torch.dtype) -> torch.Tensor:
    """Collective: an uninitialized symmetric tensor of ``shape`` and ``dtype`` on the
    heap's device, marked ``__symm_tensor__``. Free it with
    :func:`mori_shmem_free_tensor` (dropping it does not)."""
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise InvalidArgumentError(f"negative dimension in shape {shape}")
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    ptr = api.shmem_malloc(max(nbytes, 1))
    try:
        tensor = _view(ptr, shape, dtype)
    except BaseException:
        api.shmem_free(ptr)
        raise
    tensor.__symm_tensor__ = True
    return tensor


def symm_mori_shmem_tensor(tensor: torch.Tensor, peer: int) -> torch.Tensor:
    """``peer``'s copy of symmetric ``tensor`` (same shape and dtype), to load and
    store through; ``tensor`` itself for this pe. Raises NotSupportedError when
    ``peer`` is not load/store reachable (another node)."""
    _require_symm(tensor, "symm_mori_shmem_tensor")
    if peer == api.shmem_mype():
        return tensor
    return _shmem.peer_view(tensor, peer)


def mori_shmem_free_tensor(tensor: torch.Tensor) -> None:
    """Free a tensor from :func:`mori_shmem_create_tensor` (after the device has
    finished with it: CUDA heaps synchronize first). Its peer views dangle."""
    _require_symm(tensor, "mori_shmem_free_tensor")
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)
    api.shmem_free(tensor.data_ptr())


def mori_shmem_create_tensor_list_intra_node(shape, dtype: torch.dtype, num_ranks: int):
    """Collective: one symmetric tensor and its views on pes ``0 .. num_ranks-1``
    (element ``shmem_mype()`` is the tensor itself). Free it with
    ``mori_shmem_free_tensor(views[shmem_mype()])``."""
    tensor = mori_shmem_create_tensor(shape, dtype)
    return [symm_mori_shmem_tensor(tensor, pe) for pe in range(num_ranks)]


__all__ = [
    "MoriShmemBuffer",
    "mori_shmem_create_tensor",
    "mori_shmem_create_tensor_list_intra_node",
    "mori_shmem_free_tensor",
    "symm_mori_shmem_tensor",
]
