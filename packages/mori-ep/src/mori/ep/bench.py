# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Benchmark of EpDispatchCombineOp (intra-node) beside a naive all_to_all baseline.

    python -m mori.ep.bench [--world-size 2] [--tokens 128,512,4096] [--dtype bf16,fp8]
                            [--block-num 24,96] [--warp-per-block 16] [--iters 20]
                            [--kernel-type IntraNode,IntraNodeLL,AsyncLL,standard-moe,deepep-ll]
                            [--overlap] [--json PATH] [--plot PATH]

Starts ``--world-size`` local processes (or runs as one rank under torchrun), one per
GPU. Per token count, dtype and block count it times mori's dispatch and combine,
each captured in its own CUDA graph and replayed back to back (``--iters`` trials of
``--reps`` dispatch+combine pairs, CUDA events around every replay, median over all
pairs but the first of each trial, which absorbs the ranks' launch skew); those
per-call figures include the gap between graph replays. A further ``--reps`` pairs
run under the profiler for each kernel's own GPU time (``kern us``, median of the
CUDA activity records, the way DeepEP measures its kernels). Baseline, in the same
run: the same dispatch and combine written with
``torch.distributed.all_to_all_single`` over NCCL (permute rows by destination rank,
exchange counts, all_to_all the rows and their metadata; combine sends the rows back
and sums them per token in fp32), timed with CUDA events, eagerly (its split sizes
need the counts on the host, so it cannot be graph-captured). Both run on the same
random top-k routing, and their combine outputs are compared.

Bandwidth, per rank (GB/s = 1e9 bytes/s), in two definitions:
  * incl. local: bytes this rank receives in dispatch, counting the copy to itself
    (MORI's and DeepEP's definition): ``recv rows x (hidden x elem + scale bytes)``;
    combine: the bytes it sends back, ``recv rows x hidden x 2`` (bf16).
  * cross-GPU: the same, counting only rows from (dispatch) / to (combine) other ranks.
Weights and indices (8 bytes per top-k slot) move too but are not counted, as in MORI.
A peer-copy reference (rank 0's copy engine into rank 1's heap) is measured in the
same run.

Without a GPU (or with ``--device cpu``) the CPU implementation runs on a host heap,
the baseline is all_to_all_single over gloo, and times are wall-clock medians of
single calls: that mode checks the bench end to end (CI), its numbers are not the
product's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from mori.core.launch import NO_MULTICAST_ENV

PEER_COPY_BYTES = 256 << 20
# all_to_all_single reference: bytes each rank sends in one call (an equal share to
# every rank), on GPUs over NCCL; on CPU over gloo, smaller (a check, not a number).
A2A_BYTES_CUDA = 256 << 20
A2A_BYTES_CPU = 8 << 20


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _str_list(text: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    for v in vals:
        if v not in ("bf16", "fp8"):
            raise argparse.ArgumentTypeError(f"dtype {v!r} must be bf16 or fp8")
    return vals


KERNEL_TYPES = (
    "IntraNode", "IntraNodeLL", "AsyncLL", "AsyncLL-ce", "standard-moe", "standard-moe-rows",
    "deepep-ll",
)  # fmt: skip
# The expert-major entry points run on an op of this kernel type.
_OP_KERNEL_TYPE = {
    "standard-moe": "IntraNodeLL", "standard-moe-rows": "IntraNodeLL", "deepep-ll": "IntraNodeLL",
    "AsyncLL-ce": "AsyncLL",
}  # fmt: skip
# Environment set while the op of a kernel type is constructed.
_OP_ENV = {
    "standard-moe-rows": {"MORI_EP_LL_PRE_REDUCE": "0"},
    "AsyncLL-ce": {"MORI_EP_LL_COPY_ENGINE": "1"},  # CUDA: dispatch rows by copy engine
}


def _kernel_list(text: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    for v in vals:
        if v not in KERNEL_TYPES:
            raise argparse.ArgumentTypeError(f"kernel type {v!r} must be one of {KERNEL_TYPES}")
    return vals


def _impl_name(kt: str) -> str:
    return "mori" if kt == "IntraNode" else f"mori {kt}"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mori.ep.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="ranks to spawn (default: visible GPUs, at least 2; 2 on CPU)",
    )
    p.add_argument("--max-tokens", type=int, default=4096, help="max_num_inp_token_per_rank")
    p.add_argument(
        "--tokens",
        type=_int_list,
        default=None,
        help="tokens per rank to sweep, comma separated (default: --max-tokens)",
    )
    p.add_argument("--hidden-dim", type=int, default=7168)
    p.add_argument("--num-experts-per-token", type=int, default=8)
    p.add_argument(
        "--num-experts-per-rank", type=int, default=None, help="default 256 // world size"
    )
    p.add_argument(
        "--dtype",
        type=_str_list,
        default=["bf16", "fp8"],
        help="dispatch dtype(s): bf16, fp8 (e4m3 + fp32 scales per 128 columns); combine is bf16",
    )
    p.add_argument(
        "--block-num",
        type=_int_list,
        default=[24, 96],
        help="CUDA blocks (SMs), one or a comma list",
    )
    p.add_argument("--warp-per-block", type=int, default=16)
    p.add_argument("--iters", type=int, default=20, help="timed trials (median)")
    p.add_argument("--reps", type=int, default=10, help="dispatch+combine pairs per trial")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--no-baseline", action="store_true", help="skip the all_to_all baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--plot", help="PNG of bandwidth vs tokens per rank (needs matplotlib)")
    p.add_argument(
        "--replot", metavar="JSON",
        help="no run: draw --plot from a --json file of an earlier run (e.g. from a GPU host)",
    )  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument(
        "--kernel-type", type=_kernel_list, default=["IntraNode"],
        help="comma-separated: IntraNode, IntraNodeLL, AsyncLL (MORI's token-major calls; "
        "AsyncLL as send + recv; AsyncLL-ce: its dispatch's rows moved by the copy engines, "
        "MORI_EP_LL_COPY_ENGINE=1), standard-moe (MORI's dispatch_standard_moe / "
        "combine_standard_moe on an IntraNodeLL op, per-rank partials where the op decides "
        "so), standard-moe-rows (the same with one row per (token, expert) sent back: "
        "MORI_EP_LL_PRE_REDUCE=0), deepep-ll (low_latency_dispatch/combine "
        "on an IntraNodeLL op; fp8 = the cast inside dispatch)",
    )  # fmt: skip
    p.add_argument(
        "--overlap", action="store_true",
        help="with AsyncLL: also time send + a GEMM + recv against the GEMM alone and the "
        "transfer alone (GEMM sized to --overlap-ratio x the transfer's time)",
    )  # fmt: skip
    p.add_argument("--overlap-ratio", type=float, default=2.0)
    args = p.parse_args(argv)
    args.tokens = args.tokens or [args.max_tokens]
    if max(args.tokens) > args.max_tokens or min(args.tokens) < 0:
        p.error(f"--tokens {args.tokens} must lie in [0, --max-tokens {args.max_tokens}]")
    return args


def _table(rows, headers) -> str:
    try:
        from tabulate import tabulate

        return tabulate(rows, headers=headers, floatfmt=".1f")
    except ImportError:
        lines = ["  ".join(f"{h:>12}" for h in headers)]
        for r in rows:
            lines.append(
                "  ".join(f"{c:>12.1f}" if isinstance(c, float) else f"{c!s:>12}" for c in r)
            )
        return "\n".join(lines)


# ------------------------------------------------------------------ the baseline
def a2a_dispatch(x, weights, scales, indices, experts_per_rank, world, group):
    """Naive dispatch with all_to_all_single: one copy of each token per distinct
    destination rank, rows grouped by destination (then token). Returns
    ``(recv_x, recv_meta, state)``; ``state`` is what combine needs."""
    import torch
    import torch.distributed as dist

    n, k = indices.shape
    dest = torch.where(indices >= 0, indices // experts_per_rank, world)
    mask = torch.zeros(n, world + 1, dtype=torch.bool, device=x.device)
    mask.scatter_(1, dest.long(), True)
    mask = mask[:, :world]
    d_of_row, t_of_row = mask.t().nonzero(as_tuple=True)  # ordered by destination rank
    send_counts = mask.sum(0).to(torch.int64)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
    # Tokens as raw bytes (fp8 and bf16 alike), metadata packed into int32 columns.
    row = x.view(torch.uint8).reshape(n, x.size(1) * x.element_size())[t_of_row]
    meta = [indices, weights.view(torch.int32)]
    if scales is not None:
        meta.append(scales.contiguous().view(torch.int32))
    meta = torch.cat(meta, dim=1)[t_of_row]
    recv_x = row.new_empty((sum(recv_split), row.size(1)))
    recv_meta = meta.new_empty((sum(recv_split), meta.size(1)))
    dist.all_to_all_single(recv_x, row, recv_split, send_split, group=group)
    dist.all_to_all_single(recv_meta, meta, recv_split, send_split, group=group)
    recv_x = recv_x.view(x.dtype).reshape(recv_x.size(0), x.size(1))
    return recv_x, recv_meta, (t_of_row, send_split, recv_split, n, k)


def a2a_combine(y, y_weights, state, group):
    """Naive combine: send each row back to its source and sum per token in fp32."""
    import torch
    import torch.distributed as dist

    t_of_row, send_split, recv_split, n, k = state
    # Rows as bytes (gloo has no bf16/int16 all_to_all); NCCL moves them the same.
    row_bytes = y.size(1) * y.element_size()
    back = torch.empty((sum(send_split), row_bytes), dtype=torch.uint8, device=y.device)
    src = y.contiguous().view(torch.uint8).reshape(y.size(0), row_bytes)
    dist.all_to_all_single(back, src, send_split, recv_split, group=group)
    back = back.view(y.dtype).reshape(back.size(0), y.size(1))
    back_w = y_weights.new_empty((sum(send_split), k))
    dist.all_to_all_single(back_w, y_weights, send_split, recv_split, group=group)
    out = torch.zeros(n, y.size(1), dtype=torch.float32, device=y.device)
    out.index_add_(0, t_of_row, back.float())
    out_w = torch.zeros(n, k, dtype=torch.float32, device=y.device)
    out_w.index_add_(0, t_of_row, back_w)
    return out.to(y.dtype), out_w


# ------------------------------------------------------------------ timing
class _Timer:
    """CUDA events on the current stream, or wall clock on CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        import torch

        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def elapsed_us(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) * 1e3
        return (b - a) * 1e6

    def sync(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize()


def _a2a_bus_bandwidth(args, world, device, timer, group, cuda) -> dict:
    """all_to_all_single of equal shares, timed like the rest (median over trials,
    slowest rank): algbw = bytes sent per rank / time, busbw = algbw x (W - 1) / W."""
    import torch
    import torch.distributed as dist

    nbytes = (A2A_BYTES_CUDA if cuda else A2A_BYTES_CPU) // world * world
    send = torch.ones(nbytes, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)
    times = []
    for i in range(max(5, args.iters // 2) + 2):
        dist.barrier()
        e0 = timer.mark()
        dist.all_to_all_single(recv, send, group=group)
        e1 = timer.mark()
        timer.sync()
        if i >= 2:  # two warm-up calls (connection set-up)
            times.append(timer.elapsed_us(e0, e1))
    mine = statistics.median(times)
    every = [None] * world
    dist.all_gather_object(every, mine)
    us = max(every)
    algbw = nbytes / us / 1e3
    return {
        "backend": "nccl" if cuda else "gloo",
        "bytes": nbytes,
        "us": us,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * (world - 1) / world,
    }


def _time_pairs(timer, dispatch_fn, combine_fn, iters, reps, barrier):
    """Median dispatch and combine times (us) over iters x reps back-to-back pairs,
    dropping the first pair of each trial (launch skew between ranks)."""
    d_us, c_us = [], []
    for _ in range(iters):
        timer.sync()
        barrier()
        marks = []
        for _ in range(reps):
            e0 = timer.mark()
            dispatch_fn()
            e1 = timer.mark()
            combine_fn()
            e2 = timer.mark()
            marks.append((e0, e1, e2))
        timer.sync()
        keep = marks[1:] if len(marks) > 1 else marks
        d_us += [timer.elapsed_us(a, b) for a, b, _ in keep]
        c_us += [timer.elapsed_us(b, c) for _, b, c in keep]
    return statistics.median(d_us), statistics.median(c_us)


def _kernel_times(dispatch_fn, combine_fn, reps, barrier, timer):
    """Median GPU durations (us) of the dispatch and of the combine kernel over ``reps``
    back-to-back pairs, read from the profiler's CUDA activity records (CUPTI), as
    DeepEP measures its kernels: kernel time only, without the launch gaps between
    graph replays that the per-call event figures include. None for a kernel the
    profiler did not record."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    timer.sync()
    barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            dispatch_fn()
            combine_fn()
        timer.sync()
    found = {"Dispatch": [], "Combine": []}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA or "Reject" in e.name:
            continue
        for key, kernels in found.items():
            if f"{key}Kernel" in e.name or f"{key}DynamicKernel" in e.name:
                kernels.append((e.time_range.start, e.time_range.elapsed_us()))
    # A call may launch several kernels (AsyncLL's send and receive, the low-latency
    # kernels of a copy-engine op): sum each call's, in launch order.
    out = []
    for kernels in found.values():
        if not kernels or len(kernels) % reps:
            out.append(None)
            continue
        per = len(kernels) // reps
        kernels.sort()
        out.append(statistics.median(
            sum(d for _, d in kernels[i : i + per]) for i in range(0, len(kernels), per)
        ))  # fmt: skip
    return tuple(out)


# ------------------------------------------------------------------ one rank
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import mori.core as mc
    from mori.core import shmem
    from mori.ep import (
        _C,
        EpDispatchCombineConfig,
        EpDispatchCombineKernelType,
        EpDispatchCombineOp,
    )

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda_ok = gpus > 0 and bool(getattr(_C, "with_cuda", False))
    cuda_ok = cuda_ok and bool(mc.build_info().get("with_cuda"))
    if args.device == "cuda" and not cuda_ok:
        raise SystemExit("--device cuda: no CUDA GPU, or mori built without CUDA")
    cuda = cuda_ok and args.device != "cpu"
    dev = local % gpus if cuda else None
    if cuda:
        torch.cuda.set_device(dev)
    device = torch.device("cuda", dev) if cuda else torch.device("cpu")
    dist.init_process_group("gloo", init_method="env://")
    a2a_group = dist.new_group(backend="nccl") if cuda else None

    epr = args.num_experts_per_rank or max(1, 256 // world)
    k, hidden, m = args.num_experts_per_token, args.hidden_dim, args.max_tokens
    fp8 = torch.float8_e4m3fn
    scale_dim = hidden // 128

    def shape(dt):
        sd = scale_dim if dt == "fp8" else 0
        return (world, rank, m, k, hidden, 2, sd * 4, epr)

    heap = 0
    for kt in args.kernel_type:
        layout = _C.ep_buffer_layout if kt == "IntraNode" else _C.ll_buffer_layout
        heap += sum(layout(*shape(dt))["total_bytes"] for dt in args.dtype)
    heap += (PEER_COPY_BYTES if cuda and world > 1 else 0) + (64 << 20)
    heap = (heap + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    shmem.init(device=dev if cuda else "cpu", heap_size=heap, timeout_s=120)

    def barrier():
        shmem.barrier_all()

    timer = _Timer(cuda)
    ops = {}
    for kt, dt in ((kt, dt) for kt in args.kernel_type for dt in args.dtype):
        cfg = EpDispatchCombineConfig(
            rank=rank,
            world_size=world,
            hidden_dim=hidden,
            scale_dim=scale_dim if dt == "fp8" else 0,
            scale_type_size=4,
            max_token_type_size=2,
            max_num_inp_token_per_rank=m,
            num_experts_per_rank=epr,
            num_experts_per_token=k,
            warp_num_per_block=args.warp_per_block,
            block_num=max(args.block_num),
            data_type=fp8 if dt == "fp8" else torch.bfloat16,
            kernel_type=EpDispatchCombineKernelType[_OP_KERNEL_TYPE.get(kt, kt)],
        )
        saved = {v: os.environ.get(v) for v in _OP_ENV.get(kt, {})}
        os.environ.update(_OP_ENV.get(kt, {}))
        try:
            ops[kt, dt] = EpDispatchCombineOp(cfg, timeout_s=120)
        finally:
            for v, old in saved.items():
                if old is None:
                    os.environ.pop(v, None)
                else:
                    os.environ[v] = old

    peer_copy_gbps = None
    if cuda and world > 1:
        buf = shmem.empty((PEER_COPY_BYTES,), torch.uint8)
        if rank == 0:
            view = shmem.peer_view(buf, 1)
            src = torch.ones(PEER_COPY_BYTES, dtype=torch.uint8, device=device)
            view.copy_(src)
            times = []
            for _ in range(max(5, args.iters // 2)):
                e0 = timer.mark()
                view.copy_(src)
                e1 = timer.mark()
                timer.sync()
                times.append(timer.elapsed_us(e0, e1))
            peer_copy_gbps = PEER_COPY_BYTES / statistics.median(times) / 1e3
            del view, src
        torch.cuda.synchronize()
        barrier()
        del buf

    a2a_ref = None
    if world > 1 and not args.no_baseline:
        a2a_ref = _a2a_bus_bandwidth(args, world, device, timer, a2a_group, cuda)

    ctx = SimpleNamespace(
        rank=rank,
        world=world,
        epr=epr,
        k=k,
        hidden=hidden,
        m=m,
        cuda=cuda,
        device=device,
        timer=timer,
        barrier=barrier,
        scale_dim=scale_dim,
        a2a_group=a2a_group,
        reference={},  # (tokens, dtype) -> the first token-major kernel type's combine output
    )
    gen = torch.Generator().manual_seed(args.seed * 7919 + rank)
    records, overlaps = [], []
    for n in args.tokens:
        x32 = torch.randn(n, hidden, generator=gen)
        w = torch.rand(n, k, generator=gen).to(device)
        idx = torch.rand(n, epr * world, generator=gen).topk(k, dim=1).indices
        idx = idx.to(torch.int32).to(device)
        sc = (torch.rand(n, scale_dim, generator=gen) + 0.5).to(device)
        for dt in args.dtype:
            x = (x32.to(fp8) if dt == "fp8" else x32.to(torch.bfloat16)).to(device)
            case = _Case(n, dt, x, w, sc if dt == "fp8" else None, idx)
            for i, kt in enumerate(args.kernel_type):
                if kt == "deepep-ll":
                    bf = x32.to(torch.bfloat16).to(device)
                    records += _measure_deepep(args, ctx, ops[kt, dt], case, bf)
                elif kt in ("standard-moe", "standard-moe-rows"):
                    records += _measure_standard_moe(args, ctx, ops[kt, dt], case, kt)
                else:
                    records += _measure(args, ctx, ops[kt, dt], case, kt, baseline=i == 0)
                if kt in ("AsyncLL", "AsyncLL-ce") and args.overlap:
                    overlaps += _measure_overlap(args, ctx, ops[kt, dt], case, kt)

    gathered, gathered_overlaps = [None] * world, [None] * world
    dist.all_gather_object(gathered, records)
    dist.all_gather_object(gathered_overlaps, overlaps)
    if rank == 0:
        meta = {
            "world_size": world,
            "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "timing": "CUDA events over CUDA graph replays (mori), CUDA events eager (a2a)"
            if cuda
            else "wall clock, CPU implementation (checks the bench, not product numbers)",
            "hidden_dim": hidden,
            "num_experts_per_token": k,
            "num_experts_per_rank": epr,
            "max_tokens": m,
            "warp_per_block": args.warp_per_block,
            "iters": args.iters,
            "reps": args.reps,
            "peer_copy_gbps": peer_copy_gbps,
            "a2a_reference": a2a_ref,
            "torch": torch.__version__,
        }
        meta["overlap"] = [r for rs in gathered_overlaps for r in rs]
        _report(args, meta, [r for rs in gathered for r in rs])
    if cuda:
        torch.cuda.synchronize()
    barrier()
    for op in ops.values():
        op.close()
    ops.clear()
    import gc

    gc.collect()
    shmem.finalize()
    dist.destroy_process_group()


@dataclass
class _Case:
    tokens: int
    dtype: str
    x: Any
    weights: Any
    scales: Any
    indices: Any


def _graph_times(args, ctx, d_fn, c_fn):
    """Per-call and kernel times of d_fn / c_fn, each captured in a CUDA graph (on CPU:
    wall-clock medians of direct calls)."""
    if not ctx.cuda:
        d_us, c_us = _time_pairs(ctx.timer, d_fn, c_fn, args.iters, 1, ctx.barrier)
        return d_us, c_us, (None, None)
    d_replay, c_replay = _captured_pair(ctx, d_fn, c_fn)
    ctx.barrier()
    d_us, c_us = _time_pairs(ctx.timer, d_replay, c_replay, args.iters, args.reps, ctx.barrier)
    kernel_us = _kernel_times(d_replay, c_replay, args.reps, ctx.barrier, ctx.timer)
    return d_us, c_us, kernel_us


def _measure_deepep(args, ctx, op, case: _Case, x) -> list[dict]:
    """DeepEP's low_latency_dispatch/combine on one case (bf16 input; the fp8 case casts
    inside dispatch). Bandwidth in DeepEP's low-latency definition: received (token,
    expert) rows x (hidden + hidden / 128 x 4 scale bytes for fp8, hidden x 2 for bf16);
    combine: the same rows x hidden x 2."""
    import torch

    n, dt, idx, w = case.tokens, case.dtype, case.indices.to(torch.int64), case.weights
    fp8 = dt == "fp8"
    e_all = ctx.epr * ctx.world
    state = {}

    def d_fn():
        state["d"] = op.low_latency_dispatch(x, idx, ctx.m, e_all, use_fp8=fp8)

    d_fn()
    _, count, handle, _, _ = state["d"]
    pairs = int(count.sum())
    local = int((handle[1][:, ctx.rank] & 0xFFFFFFFF).sum())
    y = torch.zeros(
        (ctx.epr, ctx.world * ctx.m, ctx.hidden), dtype=torch.bfloat16, device=ctx.device
    )

    def c_fn():
        op.low_latency_combine(y, idx, w, state["d"][2])

    c_fn()
    row = ctx.hidden + ctx.hidden // 128 * 4 if fp8 else ctx.hidden * 2
    vol = _expert_major_volume(ctx, pairs, local, row)
    blocks = op.config.block_num if ctx.cuda else 0
    d_us, c_us, kernel_us = _graph_times(args, ctx, d_fn, c_fn)
    rec = _record(_impl_name("deepep-ll"), n, dt, blocks, ctx.rank, pairs, local, vol, d_us, c_us)
    rec["dispatch_kernel_us"], rec["combine_kernel_us"] = kernel_us
    return [rec]


def _expert_major_volume(ctx, pairs, local, row_bytes) -> dict:
    """DeepEP's low-latency bandwidth definition: received (token, expert) rows x the
    dispatch row's bytes; combine: the same rows x hidden x 2 (bf16)."""
    return {
        "dispatch": pairs * row_bytes,
        "dispatch_cross": (pairs - local) * row_bytes,
        "combine": pairs * ctx.hidden * 2,
        "combine_cross": (pairs - local) * ctx.hidden * 2,
    }


def _received_tokens(ctx, idx) -> tuple[int, int]:
    """Tokens this rank receives in a dispatch (one per (source token, this rank) with
    an expert here), and how many of them come from other ranks."""
    import torch
    import torch.distributed as dist

    ranks = idx.to(torch.int64).cpu() // ctx.epr
    valid = idx.cpu() >= 0
    to = [int(((ranks == d) & valid).any(1).sum()) for d in range(ctx.world)]
    every = [None] * ctx.world
    dist.all_gather_object(every, to)
    total = sum(every[s][ctx.rank] for s in range(ctx.world))
    return total, total - every[ctx.rank][ctx.rank]


def _measure_standard_moe(args, ctx, op, case: _Case, kt="standard-moe") -> list[dict]:
    """MORI's dispatch_standard_moe / combine_standard_moe (the expert-major layout, on
    an IntraNodeLL op) on one case: the rows as given (bf16, or fp8 without scales, as
    MORI's standard-MoE dispatch carries none), a bf16 combine weighted by the
    dispatch's weights. Bandwidth in DeepEP's definition (the expert rows, whatever
    crosses); ``combine_wire_bytes``: what this rank sends back (bf16 expert rows, or
    one fp32 partial per received token when the op pre-reduces)."""
    import torch

    n, dt, x, w, idx = case.tokens, case.dtype, case.x, case.weights, case.indices
    state = {}

    def d_fn():
        state["d"] = op.dispatch_standard_moe(x, w, None, idx)

    d_fn()
    packed_x, count, _, layout_range = state["d"]
    pairs = int(count.sum())
    local = int((layout_range[:, ctx.rank] & 0xFFFFFFFF).sum())
    y = torch.zeros(packed_x.shape, dtype=torch.bfloat16, device=ctx.device)

    def c_fn():
        op.combine_standard_moe(y, None, idx)

    c_fn()
    vol = _expert_major_volume(ctx, pairs, local, ctx.hidden * x.element_size())
    blocks = op.config.block_num if ctx.cuda else 0
    d_us, c_us, kernel_us = _graph_times(args, ctx, d_fn, c_fn)
    rec = _record(_impl_name(kt), n, dt, blocks, ctx.rank, pairs, local, vol, d_us, c_us)
    rec["dispatch_kernel_us"], rec["combine_kernel_us"] = kernel_us
    rec["pre_reduce"] = op.standard_moe_pre_reduce
    if rec["pre_reduce"]:
        tokens, cross = _received_tokens(ctx, idx)
        rec["combine_wire_bytes"] = tokens * ctx.hidden * 4
        rec["combine_wire_cross_bytes"] = cross * ctx.hidden * 4
    else:
        rec["combine_wire_bytes"] = vol["combine"]
        rec["combine_wire_cross_bytes"] = vol["combine_cross"]
    return [rec]


def _median_us(ctx, fn, trials: int, reps: int) -> float:
    """Median time (us) of one call of ``fn`` (a graph replay on CUDA), over ``trials``
    x ``reps`` back-to-back calls after one warm-up call per trial."""
    times = []
    for _ in range(trials):
        ctx.timer.sync()
        ctx.barrier()
        fn()
        marks = [ctx.timer.mark()]
        for _ in range(reps):
            fn()
            marks.append(ctx.timer.mark())
        ctx.timer.sync()
        times += [ctx.timer.elapsed_us(a, b) for a, b in zip(marks, marks[1:], strict=False)]
    return statistics.median(times)


def _captured(ctx, fn):
    """``fn`` captured in a CUDA graph (its replay), or ``fn`` itself on CPU."""
    import torch

    if not ctx.cuda:
        return fn
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def _captured_pair(ctx, d_fn, c_fn):
    """A dispatch and a combine callable, each captured in its own CUDA graph (their
    replays; on CPU the callables themselves). Both run eagerly first, then are
    captured in the same order: a combine needs a received dispatch before it."""
    import torch

    d_fn()
    c_fn()
    if not ctx.cuda:
        return d_fn, c_fn
    torch.cuda.synchronize()
    g_d, g_c = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_d):
        d_fn()
    with torch.cuda.graph(g_c):
        c_fn()
    torch.cuda.synchronize()
    return g_d.replay, g_c.replay


def _gemm_for(ctx, target_us: float):
    """A square GEMM (bf16 on CUDA, fp32 on CPU) of about ``target_us``, the same size
    on every rank (the largest any rank picked): (callable, size)."""
    import torch
    import torch.distributed as dist

    dtype = torch.bfloat16 if ctx.cuda else torch.float32

    def make(size):
        a = torch.randn(size, size, device=ctx.device).to(dtype)
        b = torch.randn(size, size, device=ctx.device).to(dtype)
        c = torch.empty(size, size, device=ctx.device, dtype=dtype)
        return lambda: torch.mm(a, b, out=c)

    size = 1024
    for _ in range(3):  # time ~ size^3 above launch costs: a few corrections settle it
        t = _median_us(ctx, _captured(ctx, make(size)), 3, 5)
        size = int(min(16384, max(128, size * (target_us / max(t, 1e-3)) ** (1 / 3))))
        size = (size + 127) // 128 * 128
    agreed = torch.tensor([size])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return make(int(agreed)), int(agreed)


def _measure_overlap(args, ctx, op, case: _Case, kt="AsyncLL") -> list[dict]:
    """AsyncLL's send/receive split, per phase: the transfer alone (send + recv, T), a
    GEMM of ``--overlap-ratio`` x T alone (G), and send + the GEMM + recv on the same
    stream (O), each phase a CUDA graph, dispatch and combine replayed alternately.
    The share of the transfer hidden behind the GEMM is ``1 - (O - G) / T``, clipped
    to [0, 1]; 1 means the GEMM paid for all of it."""
    import torch

    x, w, s, idx = case.x, case.weights, case.scales, case.indices
    out, out_w, _, _, total_t = op.dispatch(x, w, s, idx)
    op.dispatch_recv()
    total = int(total_t.item())
    y = torch.zeros(op.config.max_num_out_tokens, ctx.hidden, dtype=torch.bfloat16,
                    device=ctx.device)  # fmt: skip
    y[:total] = out[:total].to(torch.bfloat16)
    yw = out_w.clone()
    del out, out_w, total_t  # views of the heap: finalize needs them gone
    op.combine(y, yw, None)
    op.combine_recv()

    def fns(gemm_d=None, gemm_c=None):
        def d_fn():
            op.dispatch_send(x, w, s, idx)
            if gemm_d is not None:
                gemm_d()
            op.dispatch_recv()

        def c_fn():
            op.combine_send(y, yw, None)
            if gemm_c is not None:
                gemm_c()
            op.combine_recv()

        return _captured_pair(ctx, d_fn, c_fn)

    trials, reps = max(3, args.iters // 2), max(2, args.reps)
    t_d, t_c = _time_pairs(ctx.timer, *fns(), trials, reps, ctx.barrier)
    (gemm_d, size_d), (gemm_c, size_c) = (
        _gemm_for(ctx, args.overlap_ratio * t) for t in (t_d, t_c)
    )
    g_d = _median_us(ctx, _captured(ctx, gemm_d), trials, reps)
    g_c = _median_us(ctx, _captured(ctx, gemm_c), trials, reps)
    o_d, o_c = _time_pairs(ctx.timer, *fns(gemm_d, gemm_c), trials, reps, ctx.barrier)
    rows = []
    for phase, t, g, o, size in (("dispatch", t_d, g_d, o_d, size_d),
                                 ("combine", t_c, g_c, o_c, size_c)):  # fmt: skip
        rows.append({
            "impl": _impl_name(kt), "tokens": case.tokens, "dtype": case.dtype, "rank": ctx.rank,
            "phase": phase,
            "transfer_us": t, "gemm_us": g, "gemm_size": size, "overlapped_us": o,
            "hidden": min(1.0, max(0.0, 1.0 - (o - g) / t)) if t > 0 else float("nan"),
        })  # fmt: skip
    return rows


def _measure(args, ctx, op, case: _Case, kt="IntraNode", baseline=True) -> list[dict]:
    """Time mori's dispatch/combine (each block count) and, with `baseline`, the
    all_to_all baseline on one case; returns this rank's records."""
    import torch
    import torch.distributed as dist

    n, dt, x, w, s, idx = case.tokens, case.dtype, case.x, case.weights, case.scales, case.indices
    rank, world, epr, k, hidden, m = ctx.rank, ctx.world, ctx.epr, ctx.k, ctx.hidden, ctx.m
    cuda, device, timer, scale_dim = ctx.cuda, ctx.device, ctx.timer, ctx.scale_dim
    records = []
    # Eager pass: routing counts, and the combine input (rows as bf16).
    async_ll = kt in ("AsyncLL", "AsyncLL-ce")
    out, out_w, _, _, total_t = op.dispatch(x, w, s, idx)
    if async_ll:
        op.dispatch_recv()
    total = int(total_t.item())
    # MORI's flat send index: src_rank * (world * m) + src_token.
    src_rank = torch.div(op.get_dispatch_src_token_pos(), world * m, rounding_mode="floor")
    local_rows = int((src_rank == rank).sum())
    y = torch.zeros(op.config.max_num_out_tokens, hidden, dtype=torch.bfloat16, device=device)
    y[:total] = out[:total].to(torch.bfloat16)
    yw = out_w.clone()
    mori_out, _ = op.combine(y, yw, None)
    if async_ll:
        op.combine_recv()
    mori_out = mori_out.clone()
    del out, out_w, total_t  # views of the heap: finalize needs them gone
    row_bytes = hidden * x.element_size() + (scale_dim * 4 if dt == "fp8" else 0)
    vol = {
        "dispatch": total * row_bytes,
        "dispatch_cross": (total - local_rows) * row_bytes,
        "combine": total * hidden * 2,
        "combine_cross": (total - local_rows) * hidden * 2,
    }
    for blocks in args.block_num if cuda else [0]:

        def d_fn(b=blocks):
            op.dispatch(x, w, s, idx, b, -1, args.warp_per_block)
            if async_ll:
                op.dispatch_recv()

        def c_fn(b=blocks):
            op.combine(y, yw, None, b, -1, args.warp_per_block)
            if async_ll:
                op.combine_recv()

        d_us, c_us, kernel_us = _graph_times(args, ctx, d_fn, c_fn)
        timeline = getattr(op._impl, "timeline", None)
        if cuda and rank == 0 and timeline is not None and os.environ.get("MORI_EP_TIMELINE"):
            # The stamps of the last replayed pair (MORI_EP_TIMELINE=1, a measurement aid).
            print(f"timeline, {n} tokens {dt} {blocks} blocks, rank 0:\n{timeline()}", end="")
        rec = _record(_impl_name(kt), n, dt, blocks, rank, total, local_rows, vol, d_us, c_us)
        rec["dispatch_kernel_us"], rec["combine_kernel_us"] = kernel_us
        rec["matches_intranode"] = bool(
            torch.equal(mori_out, ctx.reference.setdefault((n, dt), mori_out))
        )
        records.append(rec)
    if args.no_baseline or not baseline:
        return records
    state = {}

    def b_dispatch():
        state["d"] = a2a_dispatch(x, w, s, idx, epr, world, ctx.a2a_group)

    def b_combine():
        recv_x, recv_meta, st = state["d"]
        yb = recv_x.to(torch.bfloat16)
        wb = recv_meta[:, k : 2 * k].view(torch.float32).contiguous()
        state["c"] = a2a_combine(yb, wb, st, ctx.a2a_group)

    b_dispatch()
    b_combine()
    base_total = state["d"][0].size(0)
    same = base_total == total and torch.equal(state["c"][0], mori_out)
    timer.sync()
    dist.barrier()
    d_us, c_us = _time_pairs(
        timer,
        b_dispatch,
        b_combine,
        args.iters,
        min(args.reps, 3) if cuda else 1,
        dist.barrier,
    )
    rec = _record(
        "a2a " + ("nccl" if cuda else "gloo"),
        n,
        dt,
        0,
        rank,
        base_total,
        local_rows,
        vol,
        d_us,
        c_us,
    )
    rec["matches_mori"] = bool(same)
    records.append(rec)
    return records


def _record(impl, n, dt, blocks, rank, total, local_rows, vol, d_us, c_us) -> dict:
    gbps = lambda nbytes, us: nbytes / us / 1e3 if us > 0 else float("nan")  # noqa: E731
    return {
        "impl": impl,
        "tokens": n,
        "dtype": dt,
        "block_num": blocks,
        "rank": rank,
        "recv_rows": total,
        "local_rows": local_rows,
        "dispatch_us": d_us,
        "combine_us": c_us,
        "dispatch_gbps": gbps(vol["dispatch"], d_us),
        "dispatch_cross_gbps": gbps(vol["dispatch_cross"], d_us),
        "combine_gbps": gbps(vol["combine"], c_us),
        "combine_cross_gbps": gbps(vol["combine_cross"], c_us),
    }


def _or_dash(v):
    return "-" if v is None else v


def _report(args, meta, records) -> None:
    cuda = meta["device"] != "cpu"
    print(
        f"mori.ep bench: {meta['world_size']} ranks on {meta['device']}, hidden "
        f"{meta['hidden_dim']}, top-{meta['num_experts_per_token']} of "
        f"{meta['num_experts_per_rank'] * meta['world_size']} experts, warps/block "
        f"{meta['warp_per_block']}; {meta['timing']}; median of {meta['iters']} trials"
    )
    headers = [
        "tokens",
        "dtype",
        "impl",
        "blocks",
        "rank",
        "recv rows",
        "disp us",
        "disp GB/s",
        "disp cross GB/s",
        "disp kern us",
        "comb us",
        "comb GB/s",
        "comb cross GB/s",
        "comb kern us",
    ]
    rows = []
    order = sorted(
        records,
        key=lambda r: (r["tokens"], r["dtype"], r["impl"] != "mori", r["block_num"], r["rank"]),
    )
    for r in order:
        rows.append(
            [
                r["tokens"],
                r["dtype"],
                r["impl"],
                r["block_num"] or "-",
                r["rank"],
                r["recv_rows"],
                r["dispatch_us"],
                r["dispatch_gbps"],
                r["dispatch_cross_gbps"],
                _or_dash(r.get("dispatch_kernel_us")),
                r["combine_us"],
                r["combine_gbps"],
                r["combine_cross_gbps"],
                _or_dash(r.get("combine_kernel_us")),
            ]
        )
    print(_table(rows, headers))
    print(
        "GB/s: bytes received per rank incl. the copy to itself (MORI/DeepEP); cross: "
        "cross-GPU (cross-rank) bytes only; combine counts the bf16 rows sent back; "
        "us: per call (CUDA events around each graph replay); kern us: the kernel's own "
        "GPU time (profiler, median; as DeepEP measures)"
    )
    if meta["peer_copy_gbps"]:
        print(
            f"peer copy reference (copy engine, rank 0 -> rank 1, "
            f"{PEER_COPY_BYTES >> 20} MiB): {meta['peer_copy_gbps']:.1f} GB/s"
        )
    a2a = meta.get("a2a_reference")
    if a2a:
        print(
            f"all_to_all_single reference ({a2a['backend']}, {a2a['bytes'] >> 20} MiB per rank, "
            f"slowest rank's median {a2a['us']:.1f} us): algbw {a2a['algbw_gbps']:.1f} GB/s, "
            f"busbw {a2a['busbw_gbps']:.1f} GB/s (nccl-tests' definitions)"
        )
    # Speed-up over the baseline, slowest rank of each.
    base = [r for r in records if r["impl"].startswith("a2a")]
    if base:
        mism = [r for r in base if not r.get("matches_mori", True)]
        print(
            "baseline combine output matches mori's: "
            + ("yes, every case" if not mism else f"NO in {len(mism)} case(s)")
        )
        for n in args.tokens:
            for dt in args.dtype:
                b = [r for r in base if r["tokens"] == n and r["dtype"] == dt]
                if not b:
                    continue
                bd = max(r["dispatch_us"] for r in b)
                bc = max(r["combine_us"] for r in b)
                for blocks in sorted({r["block_num"] for r in records if r["impl"] == "mori"}):
                    mr = [
                        r
                        for r in records
                        if r["impl"] == "mori"
                        and r["tokens"] == n
                        and r["dtype"] == dt
                        and r["block_num"] == blocks
                    ]
                    md = max(r["dispatch_us"] for r in mr)
                    mc = max(r["combine_us"] for r in mr)
                    print(
                        f"  {n:>5} tokens {dt}{f' {blocks} blocks' if cuda else ''}: "
                        f"dispatch {md:.1f} us vs {bd:.1f} us ({bd / md:.2f}x), combine "
                        f"{mc:.1f} us vs {bc:.1f} us ({bc / mc:.2f}x)"
                    )
    if meta.get("overlap"):
        print("AsyncLL overlap (per phase: transfer alone T, GEMM alone G, send + GEMM + recv "
              "O; hidden = 1 - (O - G) / T):")  # fmt: skip
        print(_table(
            [[r["tokens"], r["dtype"], r["impl"], r["phase"], r["rank"], r["transfer_us"],
              r["gemm_size"], r["gemm_us"], r["overlapped_us"], f"{100 * r['hidden']:.0f} %"]
             for r in sorted(meta["overlap"], key=lambda r: (r["tokens"], r["dtype"], r["impl"],
                                                             r["phase"], r["rank"]))],
            ["tokens", "dtype", "impl", "phase", "rank", "T us", "GEMM n", "G us", "O us",
             "hidden"],
        ))  # fmt: skip
    wire = [r for r in records if "combine_wire_bytes" in r]
    if wire:
        print("standard-moe combine, bytes each rank sends back (cross-rank in brackets; "
              "partials: one fp32 row per received token, rows: one bf16 row per expert):")
        print(_table(
            [[r["tokens"], r["dtype"], r["impl"], r["rank"],
              "partials" if r["pre_reduce"] else "rows",
              f"{r['combine_wire_bytes'] / 1e6:.3f} ({r['combine_wire_cross_bytes'] / 1e6:.3f})",
              r["combine_us"], _or_dash(r.get("combine_kernel_us"))]
             for r in sorted(wire, key=lambda r: (r["tokens"], r["dtype"], r["impl"], r["rank"]))],
            ["tokens", "dtype", "impl", "rank", "sends", "MB sent", "comb us", "comb kern us"],
        ))  # fmt: skip
    same = [r.get("matches_intranode") for r in records if "matches_intranode" in r]
    if len({r["impl"] for r in records if "matches_intranode" in r}) > 1:
        print(
            "token-major kernel types' combine outputs identical: "
            + ("yes, every case" if all(same) else f"NO in {same.count(False)} case(s)")
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=2)
        print(f"wrote {args.json}")
    if args.plot:
        _plot(args.plot, meta, records)


def _plot(path, meta, records) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot skipped: matplotlib is not installed")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    series = sorted({(r["impl"], r["dtype"], r["block_num"]) for r in records})
    for ax, phase in zip(axes, ("dispatch", "combine"), strict=True):
        for impl, dt, blocks in series:
            pts = sorted(
                (r["tokens"], r[f"{phase}_cross_gbps"])
                for r in records
                if (r["impl"], r["dtype"], r["block_num"]) == (impl, dt, blocks) and r["rank"] == 0
            )
            label = f"{impl} {dt}" + (f" {blocks} blk" if blocks else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if meta["peer_copy_gbps"]:
            ax.axhline(meta["peer_copy_gbps"], color="gray", ls="--", label="peer copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per rank")
        ax.set_title(f"{phase}, rank 0, cross-GPU GB/s")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"mori.ep, {meta['world_size']} x {meta['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.replot:
        if not args.plot:
            raise SystemExit("--replot needs --plot PATH")
        with open(args.replot) as f:
            doc = json.load(f)
        _plot(args.plot, doc["meta"], doc["records"])
        return
    if "RANK" in os.environ:
        worker(args)
        return
    from mori.core.launch import WorkersFailed, launch_local

    world = args.world_size
    if world is None:
        try:
            import torch

            world = max(2, min(8, torch.cuda.device_count())) if args.device != "cpu" else 2
        except ImportError:
            world = 2
    cmd = [sys.executable, "-m", "mori.ep.bench", *argv]
    try:
        results = launch_local(cmd, world, timeout_s=args.timeout_s, env=NO_MULTICAST_ENV)
    except WorkersFailed as e:
        print(e, file=sys.stderr)
        raise SystemExit(1) from None
    print(results[0].output, end="")


if __name__ == "__main__":
    main()
