# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Routing layout: which ranks and experts each token goes to."""

from __future__ import annotations

import torch

from mori.core import InvalidArgumentError

from ._C import dispatch_layout_cpu, with_cuda

try:  # a build with CUDA
    from ._C import dispatch_layout_cuda
except ImportError:
    dispatch_layout_cuda = None


def get_dispatch_layout(
    indices: torch.Tensor, num_experts: int, world_size: int, *, check: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Count where a rank's tokens are routed.

    Args:
        indices: int32 ``[num_tokens, top_k]`` global expert ids on CPU or CUDA;
            ``-1`` marks an unused slot. Experts are placed rank-major: expert ``e``
            lives on rank ``e // (num_experts // world_size)``.
        num_experts: total experts, a positive multiple of ``world_size``.
        world_size: number of expert-parallel ranks.
        check: on CUDA, synchronize the stream and raise on an out-of-range id (on
            CPU the check is always made). With ``check=False`` on CUDA, ids out of
            range are skipped by the kernel and not reported.

    Returns:
        ``(tokens_per_rank int32 [world_size], tokens_per_expert int32 [num_experts],
        token_in_rank bool [num_tokens, world_size])`` on ``indices``' device. A token
        counts once per rank however many of its experts live there.

    Raises:
        InvalidArgumentError: wrong dtype/shape/layout, or (host-side on CPU, after a
            stream sync on CUDA when ``check``) an expert id outside
            ``[-1, num_experts)``, naming the id, token and slot.
    """
    if not isinstance(indices, torch.Tensor):
        raise InvalidArgumentError(f"indices must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype != torch.int32:
        raise InvalidArgumentError(f"indices must be int32, got {indices.dtype}")
    if indices.dim() != 2:
        raise InvalidArgumentError(
            f"indices must be 2-D [num_tokens, top_k], got shape {tuple(indices.shape)}"
        )
    if indices.size(1) < 1:
        raise InvalidArgumentError(f"indices has top_k {indices.size(1)}, must be >= 1")
    indices = indices.contiguous()
    num_tokens, top_k = indices.shape
    dev = indices.device
    tokens_per_rank = torch.empty(world_size, dtype=torch.int32, device=dev)
    tokens_per_expert = torch.empty(num_experts, dtype=torch.int32, device=dev)
    token_in_rank = torch.empty((num_tokens, world_size), dtype=torch.bool, device=dev)
    args = (
        indices.data_ptr(),
        num_tokens,
        top_k,
        num_experts,
        world_size,
        tokens_per_rank.data_ptr(),
        tokens_per_expert.data_ptr(),
        token_in_rank.data_ptr(),
    )
    if dev.type == "cpu":
        dispatch_layout_cpu(*args)
    elif dev.type == "cuda":
        if not with_cuda:
            raise InvalidArgumentError(
                "indices is on CUDA but mori-ep was built without CUDA (MORI_CUDA=off or no nvcc)"
            )
        error_record = torch.empty(4, dtype=torch.int32, device=dev)
        with torch.cuda.device(dev):
            stream = torch.cuda.current_stream(dev).cuda_stream
            dispatch_layout_cuda(*args, error_record.data_ptr(), stream)
        if check:
            flag, token, slot, value = error_record.tolist()
            if flag:
                raise InvalidArgumentError(
                    f"expert id {value} out of range [-1, {num_experts}) at token {token} "
                    f"slot {slot}"
                )
    else:
        raise InvalidArgumentError(f"indices on unsupported device {dev}")
    return tokens_per_rank, tokens_per_expert, token_in_rank
