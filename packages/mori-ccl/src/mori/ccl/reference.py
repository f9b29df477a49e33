# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Host reduction and a reference all-reduce over a mori bootstrap.

The all-reduce moves whole tensors through the bootstrap (control-plane speed):
it is the correctness reference for the GPU collectives, not a fast path.
"""

from __future__ import annotations

import ctypes

import torch

from mori.core import InvalidArgumentError

from . import _C

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int32: "int32",
    torch.int64: "int64",
}


def _dtype_name(t: torch.Tensor) -> str:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"unsupported dtype {t.dtype} (expected one of {', '.join(map(str, _DTYPES))})"
        ) from None


def reduce_sum(out: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    """``out = sum(inputs)`` elementwise on CPU tensors of one dtype and shape.

    bf16/fp16 accumulate in fp32 and round once (round to nearest even), so the
    result is the correctly rounded fp32 sum of the inputs taken in order.
    ``out`` may be one of the inputs. Returns ``out``.
    """
    if not inputs:
        raise InvalidArgumentError("reduce_sum needs at least one input")
    name = _dtype_name(out)
    for i, t in enumerate(inputs):
        if t.device.type != "cpu" or out.device.type != "cpu":
            raise InvalidArgumentError(
                f"reduce_sum runs on CPU tensors; input {i} is on {t.device}"
            )
        if t.dtype != out.dtype or t.shape != out.shape:
            raise InvalidArgumentError(
                f"input {i} is {t.dtype} {tuple(t.shape)}, out is {out.dtype} {tuple(out.shape)}"
            )
        if not t.is_contiguous():
            raise InvalidArgumentError(f"input {i} is not contiguous")
    if not out.is_contiguous():
        raise InvalidArgumentError("out is not contiguous")
    _C.reduce_sum_cpu(name, out.data_ptr(), [t.data_ptr() for t in inputs], out.numel())
    return out


def cpu_all_reduce(tensor: torch.Tensor, bootstrap) -> torch.Tensor:
    """Sum ``tensor`` (CPU, contiguous) across the ranks of ``bootstrap`` in place.

    Every rank ends with bit-identical results: each reduces all ranks' inputs in
    rank order. ``bootstrap`` is a mori.core.bootstrap TcpBootstrap or TorchBootstrap.
    """
    name = _dtype_name(tensor)
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise InvalidArgumentError("cpu_all_reduce needs a contiguous CPU tensor")
    raw = ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    blobs = bootstrap.all_gather(raw)
    for r, b in enumerate(blobs):
        if len(b) != len(raw):
            raise InvalidArgumentError(
                f"rank {r} contributed {len(b)} bytes, this rank {len(raw)}: shapes differ"
            )
    if tensor.numel() == 0:
        return tensor
    parts = [
        torch.frombuffer(bytearray(b), dtype=torch.uint8).view(tensor.dtype).reshape(tensor.shape)
        for b in blobs
    ]
    _C.reduce_sum_cpu(name, tensor.data_ptr(), [p.data_ptr() for p in parts], tensor.numel())
    return tensor
