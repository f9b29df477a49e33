# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's raw local-expert-count launcher (``mori.ops.local_expert_count`` there
and here): how many (received token, slot) pairs name each expert of a rank, over
raw addresses, on a CUDA stream.

It is the count :class:`~mori.ep.EpDispatchCombineOp` makes for
``dispatch(..., call_local_expert_count=True)`` (one native implementation, CPU and
CUDA, ``csrc/layout.*``), callable on any buffers.
"""

from __future__ import annotations

import torch

from mori.core import InvalidArgumentError, NotSupportedError

from ._C import EpDispatchCombineConfig as RawConfig
from ._C import launch_local_expert_count as _launch
from ._C import with_cuda
from .config import EpDispatchCombineConfig


def launch_local_expert_count(
    config,
    indices_ptr: int,
    total_recv_token_num_ptr: int,
    local_expert_count_ptr: int,
    block_num: int = -1,
    warp_per_block: int = -1,
    stream: int = 0,
) -> None:
    """Count the (row, slot) pairs of received expert indices per local expert.

    Args:
        config: ``mori.cpp.EpDispatchCombineConfig`` (MORI's raw config; its ``rank``,
            ``num_experts_per_rank``, ``num_experts_per_token``, ``warp_num_per_block``
            and ``block_num`` are read) or a :class:`mori.ep.EpDispatchCombineConfig`.
        indices_ptr: address (int, ``tensor.data_ptr()``) of int32 ``[rows,
            num_experts_per_token]`` global expert ids, row-major.
        total_recv_token_num_ptr: address of one int32: the rows counted (read where
            the count runs, so on the device for the kernel; <= 0 counts nothing).
        local_expert_count_ptr: address of int32 ``[num_experts_per_rank]``: zeroed,
            then entry e = the pairs naming expert ``rank * num_experts_per_rank + e``.
            Other ids (other ranks' experts, -1) are not counted.
        block_num, warp_per_block: grid blocks and warps (32 threads) per block;
            <= 0 takes the config's ``block_num`` / ``warp_num_per_block``.
        stream: the CUDA stream (``torch.cuda.current_stream().cuda_stream``).

    Where it runs: device-accessible addresses (device, managed or pinned memory):
    a zeroing memset and one kernel on ``stream``, no host synchronisation (MORI's
    behaviour). Pageable host addresses: counted on the calling thread once
    ``stream``'s earlier work has finished (every address must then be
    host-accessible). A mori-ep built without CUDA counts host memory and ignores
    ``stream``; it refuses to run where torch sees a CUDA device, since it could not
    tell a device address from a host one.

    Raises:
        RuntimeError (InvalidArgumentError): MORI's "requires positive block and warp
            settings" when the resolved block or warp count is <= 0; more than 32
            warps; a null address; ``num_experts_per_rank`` < 1, ``rank`` < 0;
            addresses of mixed kinds (device and pageable host); a config of another
            type or a non-int address.
        NotSupportedError: a build without CUDA on a machine with a CUDA device.
    """
    if isinstance(config, EpDispatchCombineConfig):
        config = config.to_cpp_config()
    elif not isinstance(config, RawConfig):
        raise InvalidArgumentError(
            "config must be a mori.cpp.EpDispatchCombineConfig or a mori.ep."
            f"EpDispatchCombineConfig, got {type(config).__name__}"
        )
    for name, value in (("block_num", block_num), ("warp_per_block", warp_per_block)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__}")
    for name, value in (
        ("indices_ptr", indices_ptr),
        ("total_recv_token_num_ptr", total_recv_token_num_ptr),
        ("local_expert_count_ptr", local_expert_count_ptr),
        ("stream", stream),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidArgumentError(
                f"{name} must be an address, an int >= 0 (tensor.data_ptr(), "
                f"stream.cuda_stream), got {value!r}"
            )
    if not with_cuda and torch.cuda.is_available():
        raise NotSupportedError(
            "launch_local_expert_count: mori-ep was built without CUDA, so it reads the "
            "addresses as host memory, but torch sees a CUDA device here and device "
            "addresses cannot be told apart; rebuild mori-ep with MORI_CUDA=on"
        )
    _launch(
        config,
        indices_ptr,
        total_recv_token_num_ptr,
        local_expert_count_ptr,
        block_num,
        warp_per_block,
        stream,
    )


__all__ = ["launch_local_expert_count"]
