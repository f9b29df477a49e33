# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""What the collectives tests' workers compare against: bit-for-bit equality, the
inputs every rank draws alike, and the reduction in rank order (fp32 accumulation and
one rounding for floats, int32 exact)."""

import os

import torch

world = int(os.environ["WORLD_SIZE"])

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int32]
OPS = ["sum", "max", "min"]
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu()
    return t.view(BITS[t.dtype]) if t.dtype in BITS else t


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, a.shape, b.dtype, b.shape)
    if not torch.equal(bits(a), bits(b)):
        bad = (bits(a) != bits(b)).nonzero()[:4].flatten().tolist()
        raise AssertionError(f"{what}: differs at {bad}: {a.flatten()[bad]} vs {b.flatten()[bad]}")


def make_inputs(gen: torch.Generator, numel: int, dtype, integer: bool) -> list[torch.Tensor]:
    """Every rank's input of one call (all ranks draw the same CPU tensors)."""
    out = []
    for _ in range(world):
        if dtype == torch.int32:
            # Large enough that fp32 accumulation would round: int32 must be exact.
            t = torch.randint(-(1 << 27), 1 << 27, (numel,), generator=gen, dtype=torch.int32)
        elif integer:
            t = torch.randint(-30, 31, (numel,), generator=gen).to(dtype)
        else:
            t = (torch.randn(numel, generator=gen) * 4).to(dtype)
        out.append(t)
    return out


def reduce_ref(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    dtype = inputs[0].dtype
    if op == "sum":
        if dtype == torch.int32:
            return torch.stack(inputs).to(torch.int64).sum(0).to(torch.int32)
        acc = torch.zeros(inputs[0].shape, dtype=torch.float32)
        for t in inputs:
            acc += t.float()
        return acc.to(dtype)
    stacked = torch.stack(inputs)
    return (stacked.amax(0) if op == "max" else stacked.amin(0)).to(dtype)
