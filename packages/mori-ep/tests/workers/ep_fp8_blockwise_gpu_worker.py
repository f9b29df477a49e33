# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the fp8_blockwise combine tests on the CUDA kernels.

argv: placement seed (placement: shared or per_gpu, as ep_fp8_cap_worker.py; cpu runs
the same checks on the CPU implementation, without the CUDA graphs: a check of the
worker itself). Per
kernel type (IntraNode, IntraNodeLL, AsyncLL; IntraNodeLL also with the copy engines)
and shape, chosen so every kernel path runs:
  7168 / 56 blocks   blocks of 128 columns (16 words: half-warp lane groups)
  7168 / 28          blocks of 256 columns (a whole warp per block)
  7160 / 56          blocks of 128, the last of 120 (a short block)
  256 / 56           blocks of 5 columns, the last of 1 and four empty (the
                     column-by-column kernels)
  200 / 2            blocks of 100 columns (whole rows of 16-byte words, blocks not)
IntraNode runs each on every combine path (one-pass, streaming, tiled), with blocks of
4 and of 32 warps (the 512- and 1024-thread builds) and with combine input whose rows
are not 16-byte aligned (the column-by-column kernels).
  ref    random routings (-1 slots, a token with no expert); every part a rank returns
         is a row of a table every rank builds from the seed, with blocks of every
         magnitude (0, e4m3 subnormals, below 448, far above it): the output equals,
         bit for bit, the torch reference the CPU implementation matches bit for bit
         (test_fp8_blockwise.py: quantize per block, dequantize, fp32 sum in ascending
         rank order from -0.0, bf16); weights combine exactly
  wire   (IntraNode) what a peer's kernel writes into this rank's combine slot: the fp8
         row and its fp32 scales (scale 1 for blocks past the row), BlockwiseRowBytes of
         them, nothing past it
  graph  dispatch + combine captured in a CUDA graph (the expert's rows gathered on the
         device from the table), replayed with fresh routings, each replay bit for bit
Prints "rank N ok" last; any failed check raises.
"""

import os
import sys

import torch
import torch.distributed as dist
from ep_reference import blockwise_dequantize, blockwise_quantize

from mori.core import shmem
from mori.core.testing import start_rank
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

placement, seed = sys.argv[1], int(sys.argv[2])
rank, world, dev = start_rank(placement, "1G", 60)
CUDA = dev.type == "cuda"
print(f"rank {rank}: seed {seed}", flush=True)
EPR, K, M = 2, 3, 16
E = EPR * world
SHAPES = ((7168, None), (7168, "28"), (7160, None), (256, None), (200, "2"))
PATHS = (
    {"MORI_EP_COMBINE_ONEPASS_ROWS": "1000000"},
    {"MORI_EP_COMBINE_ONEPASS_ROWS": "0"},
    {"MORI_EP_COMBINE_ONEPASS_ROWS": "0", "MORI_EP_COMBINE_STREAM": "0"},
)
ENV_NAMES = ("MORI_FP8_COMBINE_SCALE_DIM", "MORI_EP_COMBINE_ONEPASS_ROWS",
             "MORI_EP_COMBINE_STREAM", "MORI_EP_LL_COPY_ENGINE")  # fmt: skip


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def make_op(kind: str, hidden: int, scale_env: str | None, env: dict) -> EpDispatchCombineOp:
    for name in ENV_NAMES:
        os.environ.pop(name, None)
    os.environ.update(env)
    if scale_env is not None:
        os.environ["MORI_FP8_COMBINE_SCALE_DIM"] = scale_env
    cfg = EpDispatchCombineConfig(
        torch.bfloat16, rank, world, hidden, 0, 4, 2, M, EPR, K,
        kernel_type=EpDispatchCombineKernelType[kind], quant_type="fp8_blockwise",
    )  # fmt: skip
    return EpDispatchCombineOp(cfg, timeout_s=60)


def table(hidden: int, blocks: int) -> torch.Tensor:
    """bf16 [world (source), M, world (expert rank), hidden]: what expert rank d returns
    for token t of rank s, the same on every rank; each block's magnitude one of 0,
    2^-12 (e4m3 subnormals), 1, 300 (below 448), 2000 and 3e4 (scaled)."""
    gen = torch.Generator().manual_seed(seed * 7 + hidden + blocks)
    width = -(-hidden // blocks)
    mags = torch.tensor([0.0, 2.0**-12, 1.0, 300.0, 2000.0, 3e4])
    pick = torch.randint(0, len(mags), (world, M, world, blocks), generator=gen)
    mag = mags[pick].repeat_interleave(width, dim=3)[..., :hidden]
    return (torch.randn(world, M, world, hidden, generator=gen) * mag).to(torch.bfloat16)


def routing(gen: torch.Generator) -> torch.Tensor:
    """Random top-K expert ids with -1 slots; token 0 has no expert."""
    idx = torch.rand(M, E, generator=gen).topk(K, dim=1).indices.to(torch.int32)
    idx[torch.rand(M, K, generator=gen) < 0.3] = -1
    idx[0] = -1
    return idx


def expected(tab, idx, w, S) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference of this rank's combine output (bf16) and weights."""
    hidden = tab.size(-1)
    want = torch.zeros(M, hidden)
    want_w = torch.zeros(M, K)
    for t in range(M):
        dests = sorted({int(e) // EPR for e in idx[t] if e >= 0})
        if not dests:
            continue
        want[t] = -0.0
        want_w[t] = w[t] if len(dests) == 1 else -0.0
        for d in dests:
            q, s = blockwise_quantize(tab[rank, t, d][None], S)
            want[t] += blockwise_dequantize(q, s)[0]
            if len(dests) > 1:
                want_w[t] += w[t]
    return want.to(torch.bfloat16), want_w


def same_bits(got: torch.Tensor, want: torch.Tensor, tag: str) -> None:
    g, x = got.cpu().view(torch.int16), want.view(torch.int16)
    assert torch.equal(g, x), f"{tag}: {int((g != x).sum())} values differ from the reference"


def rows_of(x: torch.Tensor, tab_dev: torch.Tensor) -> torch.Tensor:
    """The expert's output for received rows x (bf16, (s, t) in columns 0 and 1), on
    the device: table rows [s, t, rank]; rows past total_recv clamped to valid ones."""
    src = x[:, :2].float().nan_to_num(0.0).to(torch.int64)
    s, t = src[:, 0].clamp(0, world - 1), src[:, 1].clamp(0, M - 1)
    return tab_dev[s, t, rank]


def marked_input(hidden: int) -> torch.Tensor:
    """Row t of this rank carries (rank, t) in its first two columns (exact in bf16)."""
    x = torch.zeros(M, hidden, dtype=torch.bfloat16)
    x[:, 0] = rank
    x[:, 1] = torch.arange(M, dtype=torch.float32)
    return x


def round_trip(op, kind, x, w, idx, tab_dev, launch=(), aligned=True):
    """dispatch, the expert (rows_of), combine; AsyncLL in its send/recv halves."""
    if kind == "AsyncLL":
        out, out_w, _, _, total = op.dispatch_send(x, w, None, idx)
        op.dispatch_recv()
    else:
        out, out_w, _, _, total = op.dispatch(x, w, None, idx)
    n = int(total.item())
    y = rows_of(out[:n], tab_dev)
    if not aligned:  # a row stride 8 bytes off a multiple of 16
        buf = torch.zeros(n, y.size(1) + 4, dtype=y.dtype, device=y.device)
        buf[:, : y.size(1)] = y
        y = buf[:, : y.size(1)]
    if kind == "AsyncLL":
        got = op.combine_send(y, out_w[:n], idx)
        op.combine_recv()
        return got
    if launch:
        return op.combine(y, out_w[:n], idx, launch[0], -1, launch[1])
    return op.combine(y, out_w[:n], idx)


def check_wire(op, tab, idx, hidden, S, tag) -> None:
    """This rank's combine slots after an IntraNode combine: what each peer wrote is
    the fp8 row and its scales, BlockwiseRowBytes of them, and the rest of the slot as
    it was (0xAB, written before the dispatch)."""
    mode = op._mode
    hc = hidden * 2
    so = -(-hidden // 4) * 4
    wire = so + 4 * S
    comb = mode.block[mode.layout["comb_tokens"] :][: world * M * hc].cpu().view(world, M, hc)
    ids = [torch.empty_like(idx) for _ in range(world)]
    dist.all_gather(ids, idx)
    for d in range(world):
        for t in range(M):
            if d == rank or d not in {int(e) // EPR for e in ids[rank][t] if e >= 0}:
                continue
            q, s = blockwise_quantize(tab[rank, t, d][None], S)
            slot = comb[d, t]
            assert torch.equal(slot[:hidden], q[0].view(torch.uint8)), (tag, "fp8", d, t)
            assert bool((slot[hidden:so] == 0).all()), (tag, "padding", d, t)
            assert torch.equal(slot[so:wire].view(torch.float32), s[0]), (tag, "scales", d, t)
            assert bool((slot[wire:] == 0xAB).all()), (tag, "bytes past the wire row", d, t)


def run_ref(kind: str, hidden: int, scale_env, env: dict, launches, aligned_cases) -> None:
    op = make_op(kind, hidden, scale_env, env)
    S = op._fp8_blockwise_combine_scale_dim
    tab = table(hidden, S)
    tab_dev = tab.to(dev)
    gen = torch.Generator().manual_seed(seed * 31 + rank + hidden)
    for launch in launches:
        for aligned in aligned_cases:
            tag = f"{kind} {env} hidden {hidden} blocks {S} launch {launch} aligned {aligned}"
            idx = routing(gen)
            w = torch.rand(M, K, generator=gen)
            wire_check = kind == "IntraNode" and aligned and launch == launches[0]
            if wire_check:
                block = op._mode.block
                block[op._mode.layout["comb_tokens"] :][: world * M * hidden * 2].fill_(0xAB)
                sync()
                dist.barrier()
            x = marked_input(hidden).to(dev)
            got, got_w = round_trip(op, kind, x, w.to(dev), idx.to(dev), tab_dev, launch, aligned)
            sync()
            want, want_w = expected(tab, idx, w, S)
            same_bits(got, want, tag)
            assert torch.equal(got_w.cpu(), want_w), (tag, "weights")
            if wire_check:
                check_wire(op, tab, idx, hidden, S, tag)
                dist.barrier()
    op.close()
    print(f"rank {rank}: {kind} {env} hidden {hidden} blocks {S} ok", flush=True)


def run_graph(kind: str, env: dict) -> None:
    hidden = 7168
    op = make_op(kind, hidden, None, env)
    S = op._fp8_blockwise_combine_scale_dim
    tab = table(hidden, S)
    tab_dev = tab.to(dev)
    x_s = marked_input(hidden).to(dev)
    w_s = torch.zeros(M, K, device=dev)
    idx_s = torch.full((M, K), -1, dtype=torch.int32, device=dev)

    def step():
        if kind == "AsyncLL":
            out, out_w, _, _, _ = op.dispatch_send(x_s, w_s, None, idx_s)
            op.dispatch_recv()
            got = op.combine_send(rows_of(out, tab_dev), out_w, idx_s)
            op.combine_recv()
            return got
        out, out_w, _, _, _ = op.dispatch(x_s, w_s, None, idx_s)
        return op.combine(rows_of(out, tab_dev), out_w, idx_s)

    step()  # eager once (and torch's lazy set-up) before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got, got_w = step()
    gen = torch.Generator().manual_seed(seed * 131 + rank)
    for rep in range(4):
        idx = routing(gen)
        w = torch.rand(M, K, generator=gen)
        idx_s.copy_(idx)
        w_s.copy_(w)
        graph.replay()
        torch.cuda.synchronize()
        want, want_w = expected(tab, idx, w, S)
        tag = f"{kind} {env} graph replay {rep}"
        same_bits(got, want, tag)
        assert torch.equal(got_w.cpu(), want_w), (tag, "weights")
    del graph
    torch.cuda.synchronize()
    op.close()
    print(f"rank {rank}: {kind} {env} graph ok", flush=True)


for hidden, scale_env in SHAPES:
    for env in PATHS:
        run_ref("IntraNode", hidden, scale_env, env, [(8, 4), (4, 32)], [True, False])
    for env in ({}, {"MORI_EP_LL_COPY_ENGINE": "1"}):
        run_ref("IntraNodeLL", hidden, scale_env, env, [()], [True, False])
    run_ref("AsyncLL", hidden, scale_env, {}, [()], [True, False])
for kind, env in (
    ("IntraNode", PATHS[0]), ("IntraNode", PATHS[1]), ("IntraNode", PATHS[2]),
    ("IntraNodeLL", {}), ("IntraNodeLL", {"MORI_EP_LL_COPY_ENGINE": "1"}), ("AsyncLL", {}),
):  # fmt: skip
    if CUDA:
        run_graph(kind, env)
for name in ENV_NAMES:
    os.environ.pop(name, None)
sync()
shmem.barrier_all()
import gc  # noqa: E402

gc.collect()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
