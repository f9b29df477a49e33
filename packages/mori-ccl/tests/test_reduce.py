# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Host reduction: exact where the arithmetic is exact, correctly rounded otherwise."""

from pathlib import Path

import pytest
import torch

import mori.core as mc
from mori.ccl import reduce_sum
from mori.core.launch import launch_local

WORKER = str(Path(__file__).parent / "workers" / "all_reduce_worker.py")


def _seeded():
    seed = torch.seed()
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_sum_is_the_correctly_rounded_fp32_sum(dtype):
    gen = _seeded()
    inputs = [(torch.randn(4099, generator=gen) * 3).to(dtype) for _ in range(5)]
    out = torch.empty_like(inputs[0])
    reduce_sum(out, inputs)
    acc = torch.zeros(4099, dtype=torch.float32)
    for t in inputs:
        acc += t.float()
    assert torch.equal(out.view(torch.int16), acc.to(dtype).view(torch.int16))


def test_16bit_conversion_edge_cases_match_torch():
    # Every bit pattern of one input, plus zero: the result is that value rounded
    # through fp32, which must equal torch's own conversion, NaN payloads aside.
    for dtype in (torch.float16, torch.bfloat16):
        allbits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
        out = torch.empty_like(allbits)
        reduce_sum(out, [allbits, torch.zeros_like(allbits)])
        ref = (allbits.float() + 0.0).to(dtype)
        nan = torch.isnan(ref)
        assert torch.equal(torch.isnan(out), nan)
        assert torch.equal(out[~nan].view(torch.int16), ref[~nan].view(torch.int16))
    # Sums that land on rounding boundaries: overflow to inf, ties to even.
    a = torch.tensor([65504.0, 65504.0, -65504.0, 2048.0, 2050.0], dtype=torch.float16)
    b = torch.tensor([16.0, 8.0, -16.0, 1.0, 1.0], dtype=torch.float16)
    out = torch.empty_like(a)
    reduce_sum(out, [a, b])
    ref = (a.float() + b.float()).to(torch.float16)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    assert out.tolist() == [float("inf"), 65504.0, float("-inf"), 2048.0, 2052.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_exact_types(dtype):
    gen = _seeded()
    inputs = [torch.randint(-1000, 1000, (777,), generator=gen).to(dtype) for _ in range(3)]
    out = inputs[0].clone()
    reduce_sum(out, [out, inputs[1], inputs[2]])  # out may alias an input
    assert torch.equal(out, inputs[0] + inputs[1] + inputs[2])


def test_errors_from_the_extension_are_mori_errors():
    from mori.ccl import _C

    with pytest.raises(mc.InvalidArgumentError, match="unsupported dtype 'complex64'"):
        _C.reduce_sum_cpu("complex64", 0, [0], 0)
    with pytest.raises(mc.InvalidArgumentError, match="unsupported dtype torch.uint8"):
        reduce_sum(torch.zeros(2, dtype=torch.uint8), [torch.zeros(2, dtype=torch.uint8)])
    with pytest.raises(mc.InvalidArgumentError, match=r"input 1 is torch.float32 \(3,\)"):
        reduce_sum(torch.zeros(2), [torch.zeros(2), torch.zeros(3)])


@pytest.mark.parametrize("world", [2, 3])
def test_cpu_all_reduce_across_processes(world):
    seed = torch.seed() % (1 << 31)
    print(f"seed={seed}")
    results = launch_local([WORKER, str(seed)], world, timeout_s=180)
    assert all(r.output.strip().endswith("ok") for r in results)
