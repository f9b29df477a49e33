# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The host-side checks of dispatch and combine inputs that every mode makes.

Each returns the first problem as a message naming the values, or None; a mode then
fails the call on every rank with it (``reject_dispatch`` / ``reject_combine``), so a
bad input on one rank never leaves the others waiting. ``m`` is the mode: its
``config``, ``device``, ``place`` and ``quant`` are read.
"""

from __future__ import annotations

import functools

import torch

from .config import EpDispatchCombineQuantType

# torch's packed fp4 (two e2m1 values per byte, the first in the low nibble): a row of
# hidden_dim elements is hidden_dim bytes, moved bit for bit (MORI's float4_e2m1fn_x2;
# torch 2.8 and later have it).
FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)
_FP4 = () if FP4X2 is None else (FP4X2,)
TOKEN_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float16, torch.float32, *_FP4)
INDEX_DTYPES = (torch.int32, torch.int64)
# Combine's element types and the native code for each (csrc/common/dtype.hpp's
# CombineDtype); fp4x2 on host heaps only.
COMBINE_DTYPE_CODES = {
    torch.bfloat16: 0,
    torch.float32: 1,
    torch.float8_e4m3fn: 2,
    **{d: 3 for d in _FP4},
}
# Token dtype codes posted with dispatch's counts or flags (csrc/common/dtype.hpp,
# DtypeTagName; fp4x2's is kDtypeTagFp4x2): every rank compares every rank's.
ROW_TAGS = {
    torch.bfloat16: 1,
    torch.float8_e4m3fn: 2,
    torch.float16: 3,
    torch.float32: 4,
    **{d: 15 for d in _FP4},
}
# fp4x2 rows of hidden_dim // 2 bytes (hidden_dim e2m1 values: MORI's fp4 dispatch
# beside a combine of hidden_dim columns) have their own code: ranks passing the two
# widths fail like two dtypes.
FP4X2_HALF_TAG = 16


def row_tag(c, x) -> int:
    """The dtype code of dispatch rows ``x`` (checked by :func:`tokens_problem`)."""
    if x.dtype == FP4X2 and x.size(1) != c.hidden_dim:
        return FP4X2_HALF_TAG
    return ROW_TAGS[x.dtype]


# What combine_problem says of quant_type fp4_blockwise (MORI's packed-fp4 blockwise
# combine): every kernel type refuses it at combine, as MORI's inter-node ones do.
FP4_BLOCKWISE_REFUSAL = (
    "combine only supports quant_type none, fp8_direct_cast and fp8_blockwise; "
    "fp4_blockwise (MORI's packed-fp4 blockwise combine) is not implemented"
)


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


def launch_problem(block_num, rdma_block_num, warp_per_block) -> str | None:
    for name, v in (
        ("block_num", block_num),
        ("rdma_block_num", rdma_block_num),
        ("warp_per_block", warp_per_block),
    ):
        if not isinstance(v, int) or isinstance(v, bool):
            return f"{name} {v!r} must be an int (<= 0: the config's default)"
    return None


def inspectable(what: str):
    """A check decorated so that an input torch cannot even inspect (a sparse CSR
    tensor has no strides) is reported as a problem, failing the call on every rank
    like a failed check instead of raising on this rank alone."""

    def wrap(check):
        @functools.wraps(check)
        def checked(*args, **kwargs) -> str | None:
            try:
                return check(*args, **kwargs)
            except (RuntimeError, TypeError, ValueError) as e:
                return f"{what} inputs could not be checked: {e}"

        return checked

    return wrap


def tokens_problem(m, x, name, dtypes, dtype_problem) -> str | None:
    """What every dispatch checks of its token rows ``x`` (the argument ``name``): a
    tensor on the op's device whose dtype is in ``dtypes`` (else ``dtype_problem``,
    formatted with ``dtype``) and fits max_token_type_size, shaped [num_tokens,
    hidden_dim] with at most max_num_inp_token_per_rank rows."""
    c = m.config
    if not isinstance(x, torch.Tensor):
        return f"{name} must be a torch.Tensor, got {describe(x)}"
    if x.device != m.device:
        return f"{name} is on {x.device}, the op runs on {m.device}"
    if x.dtype not in dtypes:
        return dtype_problem.format(dtype=x.dtype)
    if x.element_size() > c.max_token_type_size:
        return (
            f"{name} dtype {x.dtype} has {x.element_size()}-byte elements, more than "
            f"max_token_type_size {c.max_token_type_size}"
        )
    if x.dtype == FP4X2 and c.hidden_dim % 2 == 0:
        # MORI's fp4 dispatch beside a combine of hidden_dim columns: hidden_dim e2m1
        # values in hidden_dim // 2 bytes (config.hidden_dim sizes the buffers).
        if x.dim() != 2 or x.size(1) not in (c.hidden_dim, c.hidden_dim // 2):
            return (
                f"{name} must be [num_tokens, {c.hidden_dim}] or, packing hidden_dim e2m1 "
                f"values, [num_tokens, {c.hidden_dim // 2}]; got shape {tuple(x.shape)}"
            )
    elif x.dim() != 2 or x.size(1) != c.hidden_dim:
        return f"{name} must be [num_tokens, {c.hidden_dim}], got shape {tuple(x.shape)}"
    if x.size(0) > c.max_num_inp_token_per_rank:
        return (
            f"num_tokens {x.size(0)} exceeds max_num_inp_token_per_rank "
            f"{c.max_num_inp_token_per_rank}"
        )
    return None


def int64_ids_problem(m, indices) -> str | None:
    """int64 routing in host memory is checked before its cast to int32, which could
    wrap a bad id into range (int32 ids are checked where they are read; on CUDA, in
    the kernel, where the host cannot read them without a synchronisation). The first
    id outside [-1, num_experts)."""
    if indices.dtype != torch.int64 or not m.place.host or not indices.size(0):
        return None
    bad = (indices < -1) | (indices >= m.config.num_experts)
    if not bool(bad.any()):
        return None
    t, j = (int(v) for v in bad.nonzero()[0])
    return (
        f"expert id {int(indices[t, j])} out of range [-1, {m.config.num_experts}) at "
        f"token {t} slot {j}"
    )


@inspectable("dispatch")
def dispatch_problem(
    m, input, weights, scales, indices, block_num, rdma_block_num, warp_per_block
) -> str | None:
    c = m.config
    k = c.num_experts_per_token
    problem = tokens_problem(
        m,
        input,
        "input",
        TOKEN_DTYPES,
        "input dtype {dtype} is not one of bf16, fp8 e4m3, fp16, fp32, float4_e2m1fn_x2",
    )
    if problem is not None:
        return problem
    n = input.size(0)
    if not isinstance(indices, torch.Tensor) or indices.dtype not in INDEX_DTYPES:
        return f"indices must be an int32 or int64 tensor, got {describe(indices)}"
    if indices.device != m.device:
        return f"indices is on {indices.device}, the op runs on {m.device}"
    if indices.dim() != 2 or indices.size(0) != n:
        return f"indices must be [{n}, {k}], got shape {tuple(indices.shape)}"
    if indices.size(1) > k:
        return (
            f"indices has {indices.size(1)} experts per token, more than num_experts_per_token {k}"
        )
    if indices.size(1) < k:
        return (
            f"indices has {indices.size(1)} experts per token, fewer than "
            f"num_experts_per_token {k} (pad with -1)"
        )
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
            return f"weights must be a float32 tensor or None, got {describe(weights)}"
        if weights.device != m.device:
            return f"weights is on {weights.device}, the op runs on {m.device}"
        if tuple(weights.shape) != (n, k):
            return f"weights must be [{n}, {k}], got shape {tuple(weights.shape)}"
    if c.scale_dim > 0:
        if not isinstance(scales, torch.Tensor):
            return f"scales are required (scale_dim {c.scale_dim}), got {describe(scales)}"
        if scales.device != m.device:
            return f"scales is on {scales.device}, the op runs on {m.device}"
        if scales.element_size() != c.scale_type_size:
            return (
                f"scales dtype {scales.dtype} has {scales.element_size()}-byte elements, "
                f"scale_type_size is {c.scale_type_size}"
            )
        if tuple(scales.shape) != (n, c.scale_dim):
            return f"scales must be [{n}, {c.scale_dim}], got shape {tuple(scales.shape)}"
    elif scales is not None and (not isinstance(scales, torch.Tensor) or scales.numel()):
        return f"scales given ({describe(scales)}) but the config has scale_dim 0"
    problem = launch_problem(block_num, rdma_block_num, warp_per_block)
    return problem if problem is not None else int64_ids_problem(m, indices)


def combine_problem(
    m, total, n, input, weights, indices, block_num, rdma_block_num, warp_per_block, use_ext
) -> str | None:
    """What is wrong with a combine's arguments. ``total``: the rows received, where
    the host knows it (else 0: a kernel trap checks it); ``n``: the tokens this rank
    dispatched. Called by the modes inside their own :func:`inspectable` check."""
    c = m.config
    k, cap = c.num_experts_per_token, c.max_num_tokens_to_recv
    if not isinstance(input, torch.Tensor):
        return f"input must be a torch.Tensor, got {describe(input)}"
    if input.device != m.device:
        return f"input is on {input.device}, the op runs on {m.device}"
    if m.quant == EpDispatchCombineQuantType.Fp4BlockwiseQuant:
        return FP4_BLOCKWISE_REFUSAL
    if input.dtype not in COMBINE_DTYPE_CODES:
        return (
            f"combine input dtype {input.dtype} must be bf16, fp32, fp8 e4m3 or "
            "float4_e2m1fn_x2 (host heaps)"
        )
    if input.dtype == FP4X2 and not m.place.host:
        return (
            "a float4_e2m1fn_x2 combine is implemented on host heaps only (CUDA combines "
            "bf16, fp32 and fp8 e4m3)"
        )
    if m.quant == EpDispatchCombineQuantType.Fp8DirectCast and input.dtype != torch.bfloat16:
        return f"quant_type fp8_direct_cast combines bf16 input, got {input.dtype}"
    if m.quant == EpDispatchCombineQuantType.Fp8BlockwiseQuant and input.dtype != torch.bfloat16:
        return f"quant_type fp8_blockwise combines bf16 input, got {input.dtype}"
    if input.element_size() > max(c.max_token_type_size, 2):
        return (
            f"combine input dtype {input.dtype} needs {input.element_size()}-byte elements, "
            f"the buffers hold {max(c.max_token_type_size, 2)} (max_token_type_size)"
        )
    if input.dim() != 2 or input.size(1) != c.hidden_dim:
        return f"input must be [rows, {c.hidden_dim}], got shape {tuple(input.shape)}"
    if not total <= input.size(0) <= cap:
        return (
            f"combine input has {input.size(0)} rows; it needs total_recv {total} to "
            f"capacity {cap} rows in dispatch order"
        )
    if input.stride(1) != 1:
        return "combine input rows must be contiguous (stride 1 along hidden_dim)"
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
            return f"weights must be a float32 tensor or None, got {describe(weights)}"
        if weights.device != m.device:
            return f"weights is on {weights.device}, the op runs on {m.device}"
        if weights.dim() != 2 or weights.size(1) != k or not total <= weights.size(0) <= cap:
            return (
                f"weights must be [rows, {k}] with total_recv {total} <= rows <= {cap}, "
                f"got shape {tuple(weights.shape)}"
            )
    if indices is not None:
        if not isinstance(indices, torch.Tensor) or indices.dtype not in INDEX_DTYPES:
            return f"indices must be an int32 or int64 tensor or None, got {describe(indices)}"
        if indices.dim() != 2 or indices.size(1) != k:
            return f"indices must be [{n}, {k}], got shape {tuple(indices.shape)}"
        if indices.size(0) != n:
            return (
                f"combine indices has {indices.size(0)} rows but this rank dispatched {n} "
                f"tokens: pass this rank's own [num_tokens, {k}] routing (the tensor given "
                "to dispatch), not dispatch's out_indices"
            )
    if not isinstance(use_ext, int):
        return f"use_external_inp_buf {use_ext!r} must be an int or bool (-1: the config's)"
    return launch_problem(block_num, rdma_block_num, warp_per_block)
