# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the receive-cap and fp8 combine tests, on either implementation.

argv: placement seed. placement: cpu (host heap, the CPU implementation), shared
(every rank on GPU 0) or per_gpu (rank r on GPU r). On CUDA every scenario runs once
per combine path (one-pass, streaming, tiled: forced through the environment the op
reads when it is built) and per launch shape, and once with combine input whose rows
are not 16-byte aligned (the element-wise kernels).
  cap    max_total_recv_tokens below world x max tokens: receive buffers of
         max_num_tokens_to_recv() rows; dispatches that fill the cap exactly and
         random routings within it, both dispatch kernels, every row bit for bit,
         combine exact
  fp8    combine of fp8 e4m3 input: every fp8 bit pattern in every column, each token
         to this rank and the next, each rank's expert scaling by its factor (in fp8);
         the output is fp8(sum in ascending rank order of the parts, fp32) as torch
         rounds, bit for bit; weights combined exactly
  cast   quant_type="fp8_direct_cast": every bf16 bit pattern, the same routing, the
         parts rounded to fp8 before the fp32 sum (MORI's numbers), bf16 output
Prints "rank N ok" last; any failed check raises.
"""

import os
import sys

import torch
import torch.distributed as dist
from ep_reference import FP8, factor, sum_start, to_dtype

from mori.core import shmem
from mori.core.testing import start_rank
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp

placement, seed = sys.argv[1], int(sys.argv[2])
rank, world, dev = start_rank(placement, "256M" if placement == "cpu" else "512M", 60)
CUDA = dev.type == "cuda"
EPR, K = 2, 2
E = EPR * world
NEXT = (rank + 1) % world
# Combine's paths, forced per op (MORI_EP_* are read when the op is built).
PATHS = (
    {"onepass": {"MORI_EP_COMBINE_ONEPASS_ROWS": "1000000"},
     "stream": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0"},
     "tiled": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0", "MORI_EP_COMBINE_STREAM": "0"}}
    if CUDA else {"cpu": {}}
)  # fmt: skip
# (block_num, warp_per_block): 512-thread builds, one warp (tiled), 1024-thread build.
LAUNCH = [(8, 8), (1, 1), (3, 32)] if CUDA else [(-1, -1)]


def make_op(dtype, hidden, m, env, **kw) -> EpDispatchCombineOp:
    for name in ("MORI_EP_COMBINE_ONEPASS_ROWS", "MORI_EP_COMBINE_STREAM",
                 "MORI_EP_DISPATCH_DYNAMIC"):  # fmt: skip
        os.environ.pop(name, None)
    os.environ.update(env)
    cfg = EpDispatchCombineConfig(dtype, rank, world, hidden, 0, 4, 2, m, EPR, K, **kw)
    return EpDispatchCombineOp(cfg, timeout_s=60)


def gather(t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's copy of a CPU tensor of the same shape, through int32 (gloo)."""
    raw = t.contiguous().view(torch.uint8).reshape(-1)
    raw = torch.nn.functional.pad(raw, (0, (-raw.numel()) % 4)).view(torch.int32)
    outs = [torch.empty_like(raw) for _ in range(world)]
    dist.all_gather(outs, raw)
    n = t.numel() * t.element_size()
    return [o.view(torch.uint8)[:n].view(t.dtype).reshape(t.shape) for o in outs]


def unaligned(rows: torch.Tensor) -> torch.Tensor:
    """The same rows in a buffer whose row stride is 8 bytes off a multiple of 16."""
    pad = 8 // rows.element_size()
    buf = torch.zeros(rows.size(0), rows.size(1) + pad, dtype=rows.dtype, device=rows.device)
    buf[:, : rows.size(1)] = rows
    return buf[:, : rows.size(1)]


def same_bits(got: torch.Tensor, want: torch.Tensor, tag: str) -> None:
    """Bit for bit where want is a number; NaN where it is NaN."""
    nan = torch.isnan(want.float())
    bits = torch.int16 if want.element_size() == 2 else torch.uint8
    g, w = got.cpu().view(bits), want.view(bits)
    assert torch.equal(g[~nan], w[~nan]), f"{tag}: {int((g != w)[~nan].sum())} values differ"
    assert bool(torch.isnan(got.cpu().float())[nan].all()), f"{tag}: NaN lost"


def run_cap() -> None:
    m, hidden, cap = 16, 128, 10
    per_rank = min(-(-cap // world), m)
    gen = torch.Generator().manual_seed(seed * 13 + rank)
    for dynamic in ("0", "1"):
        for pname, env in PATHS.items():
            op = make_op(torch.bfloat16, hidden, m, {**env, "MORI_EP_DISPATCH_DYNAMIC": dynamic},
                         max_total_recv_tokens=cap)  # fmt: skip
            assert op.max_num_tokens_to_recv() == world * per_rank
            for blocks, warps in LAUNCH:
                tag = f"cap dynamic={dynamic} {pname} launch {blocks}x{warps}"
                for kind in ("fill", "random"):
                    # fill: per_rank tokens each to rank 0 (exactly its capacity);
                    # random: per_rank tokens each with random experts (at most
                    # world * per_rank rows reach any rank).
                    x = torch.randn(per_rank, hidden, generator=gen).to(torch.bfloat16)
                    w = torch.rand(per_rank, K, generator=gen)
                    if kind == "fill":
                        idx = torch.zeros(per_rank, K, dtype=torch.int32)
                        idx[:, 1] = -1
                    else:
                        idx = torch.rand(per_rank, E, generator=gen).topk(K, dim=1).indices
                        idx = idx.to(torch.int32)
                    out, out_w, _, _, total = op.dispatch(
                        x.to(dev), w.to(dev), None, idx.to(dev), blocks, -1, warps
                    )
                    assert out.shape[0] == world * per_rank, (tag, out.shape)
                    total = int(total.item())
                    ax, aw, ai = gather(x), gather(w), gather(idx)
                    rows = [(s, t) for s in range(world) for t in range(per_rank)
                            if rank in {int(e) // EPR for e in ai[s][t] if e >= 0}]  # fmt: skip
                    assert total == len(rows) <= world * per_rank, (tag, kind, total, rows)
                    if rows:
                        want = torch.stack([ax[s][t] for s, t in rows])
                        assert torch.equal(out[:total].cpu().view(torch.int16),
                                           want.view(torch.int16)), (tag, kind)  # fmt: skip
                        want_w = torch.stack([aw[s][t] for s, t in rows])
                        assert torch.equal(out_w[:total].cpu(), want_w), (tag, kind, "w")
                    y = (out[:total].cpu().float() * factor(rank)).to(torch.bfloat16)
                    cout, cw = op.combine(y.to(dev), out_w[:total], idx.to(dev), blocks, -1, warps)
                    has = (idx >= 0).any(1)
                    want, want_w = sum_start(has, hidden), sum_start(has, K)
                    for t in range(per_rank):
                        for d in sorted({int(e) // EPR for e in idx[t] if e >= 0}):
                            want[t] += (x[t].float() * factor(d)).to(torch.bfloat16).float()
                            want_w[t] += w[t]
                    same_bits(cout, want.to(torch.bfloat16), f"{tag} {kind} combine")
                    assert torch.equal(cw.cpu(), want_w), (tag, kind, "weights")
            op.close()
    print(f"rank {rank}: cap ok")


def parts_routing(m: int) -> torch.Tensor:
    """Every token to this rank and the next (one expert on each)."""
    return torch.tensor([[rank * EPR, NEXT * EPR]] * m, dtype=torch.int32)


def run_fp8(cast: bool) -> None:
    hidden = 256
    if cast:  # every bf16 bit pattern: 256 tokens x 256 columns
        m = 256
        x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
        x = x.view(m, hidden).roll(rank * 97, dims=0).contiguous()
    else:  # every fp8 bit pattern in every column
        m = 64
        pat = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        x = torch.stack([pat.roll(7 * t + 37 * rank) for t in range(m)]).view(FP8)
    gen = torch.Generator().manual_seed(seed * 17 + rank)
    w = torch.rand(m, K, generator=gen)
    idx = parts_routing(m)
    dtype = torch.bfloat16 if cast else FP8

    def part(v: torch.Tensor, d: int) -> torch.Tensor:
        """What rank d's expert returns for rows v (in combine's input dtype), computed
        on the CPU (torch's own conversions, which the CPU implementation matches)."""
        return to_dtype(v.cpu().float() * factor(d), dtype)

    # The reference: parts in ascending rank order, each rounded to fp8 under the cast,
    # summed in fp32 from -0.0 (README, Semantics), rounded once to the output dtype.
    want = torch.full((m, hidden), -0.0)
    for d in sorted({rank, NEXT}):
        p = part(x, d)
        want += to_dtype(p, FP8).float() if cast else p.float()
    want = to_dtype(want, dtype)
    want_w = w + w if world > 1 else w.clone()  # one part: copied
    quant = "fp8_direct_cast" if cast else "none"
    name = "cast" if cast else "fp8"
    for pname, env in PATHS.items():
        op = make_op(dtype, hidden, m, env, quant_type=quant)
        for blocks, warps in LAUNCH:
            for aligned in (True, False):
                tag = f"{name} {pname} launch {blocks}x{warps} aligned={aligned}"
                out, out_w, _, _, total = op.dispatch(
                    x.to(dev), w.to(dev), None, idx.to(dev), blocks, -1, warps
                )
                total = int(total.item())
                assert total == m * (2 if world > 1 else 1), (tag, total)
                y = part(out[:total], rank).to(dev)
                y = y if aligned else unaligned(y)
                cout, cw = op.combine(y, out_w[:total], idx.to(dev), blocks, -1, warps)
                assert cout.dtype == dtype, (tag, cout.dtype)
                same_bits(cout, want, tag)
                assert torch.equal(cw.cpu(), want_w), (tag, "weights")
        op.close()
    print(f"rank {rank}: {name} ok")


run_cap()
run_fp8(cast=False)
run_fp8(cast=True)
if CUDA:
    torch.cuda.synchronize()
shmem.barrier_all()
import gc  # noqa: E402

gc.collect()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
