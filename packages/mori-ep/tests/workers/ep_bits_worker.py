# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the combine bit-transparency tests, on either implementation.

argv: placement seed (placement: cpu, shared or per_gpu, as ep_fp8_cap_worker.py). Rows
carry -0.0, +0.0, NaNs with payloads and sign, infinities and random values:
  intranode  IntraNode combine (bf16, fp32, fp8 e4m3; on CUDA every combine path, and
             rows that are not 16-byte aligned): a token with one destination comes
             back bit for bit, its weights too; a token whose every part is -0.0 sums
             to -0.0; a token with no destination gives +0.0
  ll         IntraNodeLL token-major combine: the same
  weighted   DeepEP's low_latency_combine: a token with one expert of weight 1.0 comes
             back bit for bit except NaNs (the product w * y is an fp32 operation: a
             NaN leaves it as the canonical NaN 0x7FC0); no expert: +0.0
Prints "rank N ok" last.
"""

import os
import sys

import torch
import torch.distributed as dist
from ep_reference import FP8

from mori.core.testing import start_rank
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

placement, seed = sys.argv[1], int(sys.argv[2])
rank, world, dev = start_rank(placement, "128M" if placement == "cpu" else "512M", 60)
CUDA = dev.type == "cuda"
HIDDEN, M, EPR, K = 256, 16, 2, 2
NEXT = (rank + 1) % world
gen = torch.Generator().manual_seed(seed * 31 + rank)
print(f"rank {rank}: seed {seed}", flush=True)
PATHS = (
    [{"MORI_EP_COMBINE_ONEPASS_ROWS": "1000000"}, {"MORI_EP_COMBINE_ONEPASS_ROWS": "0"},
     {"MORI_EP_COMBINE_ONEPASS_ROWS": "0", "MORI_EP_COMBINE_STREAM": "0"}]
    if CUDA else [{}]
)  # fmt: skip
SPECIAL = {  # bit patterns: -0.0, +0.0, NaNs with payloads (both signs), infinities
    torch.bfloat16: [0x8000, 0x0000, 0x7FA1, 0xFFC3, 0x7F81, 0x7F80, 0xFF80],
    torch.float32: [0x80000000, 0, 0x7FC00123, 0xFF800001, 0x7F812345, 0x7F800000],
    FP8: [0x80, 0x00, 0x7F, 0xFF, 0x7E, 0xFE],
}
INT = {torch.bfloat16: torch.int16, torch.float32: torch.int32, FP8: torch.uint8}


def make_op(dtype, env, kind=EpDispatchCombineKernelType.IntraNode) -> EpDispatchCombineOp:
    for name in ("MORI_EP_COMBINE_ONEPASS_ROWS", "MORI_EP_COMBINE_STREAM"):
        os.environ.pop(name, None)
    os.environ.update(env)
    size = torch.empty(0, dtype=dtype).element_size()
    cfg = EpDispatchCombineConfig(dtype, rank, world, HIDDEN, 0, 4, max(size, 2), M, EPR, K,
                                  kernel_type=kind)  # fmt: skip
    return EpDispatchCombineOp(cfg, timeout_s=30)


def special_rows(dtype, n: int) -> torch.Tensor:
    """n rows of `dtype`: random values with every special pattern in every row."""
    x = torch.randn(n, HIDDEN, generator=gen).to(dtype if dtype != FP8 else torch.float32)
    raw = x.to(dtype).view(INT[dtype]).clone()
    pats = torch.tensor(SPECIAL[dtype], dtype=torch.int64)
    cols = torch.randperm(HIDDEN, generator=gen)[: 4 * len(pats)]
    raw[:, cols] = pats.repeat(4).to(INT[dtype])
    return raw.view(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().contiguous().view(INT[t.dtype] if t.dtype in INT else torch.int32)


def routing(n: int) -> torch.Tensor:
    """Tokens 0..: one destination (this rank, the next, this rank again ...), then a
    token to both ranks, then one with none."""
    idx = torch.full((n, K), -1, dtype=torch.int32)
    for t in range(n - 2):
        idx[t, 0] = (rank if t % 2 == 0 else NEXT) * EPR + t % EPR
    idx[n - 2] = torch.tensor([rank * EPR, NEXT * EPR], dtype=torch.int32)
    return idx


def check_token_major(op, dtype, what: str, unaligned: bool) -> None:
    n = M
    idx = routing(n)
    x = special_rows(dtype, n)
    w = torch.rand(n, K, generator=gen)
    w[::2, 0] = -0.0
    w.view(torch.int32)[1::2, 1] = 0x7FC00123  # a NaN with a payload
    if world > 1:
        # Every part of token n - 2 is -0.0: their sum is -0.0.
        x[n - 2] = torch.tensor(SPECIAL[dtype][0], dtype=torch.int64).to(INT[dtype]).view(dtype)
        w[n - 2] = -0.0
    out, out_w, _, _, total = op.dispatch(x.to(dev), w.to(dev), None, idx.to(dev))
    total = int(total.item())
    y, yw = out[:total], out_w[:total]
    if unaligned:  # rows at an odd byte offset: the element-wise kernels
        buf = torch.empty(total * HIDDEN + 1, dtype=dtype, device=dev)
        y = buf[1:].view(total, HIDDEN).copy_(y) if total else buf[1:1].view(0, HIDDEN)
    cout, cw = op.combine(y, yw, idx.to(dev))
    cout, cw = cout.cpu(), cw.cpu()
    for t in range(n - 2):
        assert torch.equal(bits(cout[t]), bits(x[t])), f"{what}: token {t} changed"
        assert torch.equal(bits(cw[t]), bits(w[t])), f"{what}: weights of token {t} changed"
    if world > 1:
        assert torch.equal(bits(cout[n - 2]), bits(x[n - 2])), f"{what}: -0.0 + -0.0"
        assert torch.equal(bits(cw[n - 2]), bits(w[n - 2])), f"{what}: weights -0.0 + -0.0"
    zero = torch.zeros(HIDDEN, dtype=dtype)
    assert torch.equal(bits(cout[n - 1]), bits(zero)), f"{what}: a token with no expert"
    assert torch.equal(bits(cw[n - 1]), bits(torch.zeros(K))), f"{what}: its weights"


def run_intranode() -> None:
    for env in PATHS:
        for dtype in (torch.bfloat16, torch.float32, FP8):
            op = make_op(dtype, env)
            for unaligned in (False, True) if CUDA else (False,):
                check_token_major(op, dtype, f"IntraNode {dtype} {env} unaligned={unaligned}",
                                  unaligned)  # fmt: skip
            op.close()


def run_ll() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        op = make_op(dtype, {}, EpDispatchCombineKernelType.IntraNodeLL)
        check_token_major(op, dtype, f"IntraNodeLL {dtype}", False)
        op.close()


def run_weighted() -> None:
    op = make_op(torch.bfloat16, {}, EpDispatchCombineKernelType.IntraNodeLL)
    n, e = M, EPR * world
    idx = routing(n).long()
    idx[n - 2, 1] = -1  # one expert each, but the last token (none)
    x = special_rows(torch.bfloat16, n)
    w = torch.ones(n, K)
    recv_x, recv_count, handle, _, _ = op.low_latency_dispatch(
        x.to(dev), idx.to(dev), M, e, use_fp8=False
    )
    cout, _, _ = op.low_latency_combine(recv_x, idx.to(dev), w.to(dev), handle)
    got, want = bits(cout), bits(x)
    nan = x.float().isnan()
    for t in range(n - 1):
        assert torch.equal(got[t][~nan[t]], want[t][~nan[t]]), f"weighted: token {t} changed"
        assert (got[t][nan[t]] == 0x7FC0).all(), f"weighted: NaNs of token {t}"
    assert (got[n - 1] == 0).all(), "weighted: a token with no expert"
    op.close()


run_intranode()
run_ll()
run_weighted()
dist.barrier()
print(f"rank {rank} ok", flush=True)
dist.destroy_process_group()
