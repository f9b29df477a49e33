# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The cases ``python -m mori.ep.bench`` measures on one rank: the token-major kernel
types (IntraNode, IntraNodeLL, AsyncLL) beside the all_to_all baseline, MORI's
standard-MoE and DeepEP's low-latency entry points (expert-major), and AsyncLL's
overlap with a GEMM. Each returns this rank's records."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mori.core import env

from . import internode
from .baseline import a2a_combine, a2a_dispatch
from .timing import (
    captured,
    captured_pair,
    eager_times,
    gemm_for,
    graph_times,
    median_us,
    settled,
    time_pairs,
)

KERNEL_TYPES = (
    "IntraNode", "IntraNodeLL", "AsyncLL", "AsyncLL-ce", "standard-moe", "standard-moe-rows",
    "deepep-ll", "InterNode", "InterNodeV1", "InterNodeV1LL",
)  # fmt: skip
# The kernel types measured by measure_token_major (the ones --combine-quant applies to).
TOKEN_MAJOR = ("IntraNode", "IntraNodeLL", "AsyncLL", "AsyncLL-ce")
# The expert-major entry points run on an op of this kernel type.
OP_KERNEL_TYPE = {
    "standard-moe": "IntraNodeLL", "standard-moe-rows": "IntraNodeLL", "deepep-ll": "IntraNodeLL",
    "AsyncLL-ce": "AsyncLL",
}  # fmt: skip
# Environment set while the op of a kernel type is constructed.
OP_ENV = {
    "standard-moe-rows": {"MORI_EP_LL_PRE_REDUCE": "0"},
    "AsyncLL-ce": {"MORI_EP_LL_COPY_ENGINE": "1"},  # CUDA: dispatch rows by copy engine
}


def impl_name(kt: str, quant: str = "none") -> str:
    name = "mori" if kt == "IntraNode" else f"mori {kt}"
    return name if quant == "none" else f"{name} {quant}"


def combine_row_bytes(op, hidden: int) -> int:
    """Bytes one combine row crosses as: bf16, or under fp8_blockwise the fp8 values
    padded to 4 bytes and one fp32 scale per block (BlockwiseRowBytes)."""
    blocks = op._fp8_blockwise_combine_scale_dim
    return hidden * 2 if blocks == 0 else -(-hidden // 4) * 4 + 4 * blocks


def progress_printer(rank: int, on: bool):
    """``--progress``: a ``step(label)`` that prints ``bench: rank R +S.s label`` to
    stderr (seconds since the worker started measuring), or does nothing."""
    import sys
    import time

    t0 = time.monotonic()

    def step(label: str) -> None:
        if on:
            print(f"bench: rank {rank} +{time.monotonic() - t0:.1f}s {label}", file=sys.stderr,
                  flush=True)  # fmt: skip

    return step


def print_timeline(ctx, op, label: str) -> None:
    """With MORI_EP_TIMELINE=1 (a measurement aid), rank 0 prints the per-phase stamps
    of the op's last replayed dispatch and combine (CUDA ops only)."""
    timeline = getattr(op._impl, "timeline", None)
    if (
        ctx.cuda
        and ctx.rank == 0
        and timeline is not None
        and env.get_bool("MORI_EP_TIMELINE", False)
    ):
        print(f"timeline, {label}, rank 0:\n{timeline()}", end="")


@dataclass
class Case:
    tokens: int
    dtype: str
    x: Any
    weights: Any
    scales: Any
    indices: Any


def measure_deepep(args, ctx, op, case: Case, x) -> list[dict]:
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
    vol = expert_major_volume(ctx, pairs, local, row)
    blocks = op.config.block_num if ctx.cuda else 0
    d_us, c_us, kernel_us = graph_times(args, ctx, d_fn, c_fn)
    print_timeline(ctx, op, f"{impl_name('deepep-ll')}, {n} tokens {dt} {blocks} blocks")
    rec = record(impl_name("deepep-ll"), n, dt, blocks, ctx.rank, pairs, local, vol, d_us, c_us)
    rec["dispatch_kernel_us"], rec["combine_kernel_us"] = kernel_us
    ctx.floors.attach(rec, case, vol, "expert", cast=fp8)
    return [rec]


def expert_major_volume(ctx, pairs, local, row_bytes) -> dict:
    """DeepEP's low-latency bandwidth definition: received (token, expert) rows x the
    dispatch row's bytes; combine: the same rows x hidden x 2 (bf16)."""
    return {
        "dispatch": pairs * row_bytes,
        "dispatch_cross": (pairs - local) * row_bytes,
        "combine": pairs * ctx.hidden * 2,
        "combine_cross": (pairs - local) * ctx.hidden * 2,
    }


def received_tokens(ctx, idx) -> tuple[int, int]:
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


def measure_standard_moe(args, ctx, op, case: Case, kt="standard-moe") -> list[dict]:
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
    vol = expert_major_volume(ctx, pairs, local, ctx.hidden * x.element_size())
    blocks = op.config.block_num if ctx.cuda else 0
    d_us, c_us, kernel_us = graph_times(args, ctx, d_fn, c_fn)
    print_timeline(ctx, op, f"{impl_name(kt)}, {n} tokens {dt} {blocks} blocks")
    rec = record(impl_name(kt), n, dt, blocks, ctx.rank, pairs, local, vol, d_us, c_us)
    rec["dispatch_kernel_us"], rec["combine_kernel_us"] = kernel_us
    ctx.floors.attach(rec, replace(case, scales=None), vol, "expert")  # MORI's: no scales
    rec["pre_reduce"] = op.standard_moe_pre_reduce
    if rec["pre_reduce"]:
        tokens, cross = received_tokens(ctx, idx)
        rec["combine_wire_bytes"] = tokens * ctx.hidden * 4
        rec["combine_wire_cross_bytes"] = cross * ctx.hidden * 4
    else:
        rec["combine_wire_bytes"] = vol["combine"]
        rec["combine_wire_cross_bytes"] = vol["combine_cross"]
    return [rec]


def measure_overlap(args, ctx, op, case: Case, kt="AsyncLL") -> list[dict]:
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

        return captured_pair(ctx, d_fn, c_fn)

    trials, reps = max(3, args.iters // 2), max(2, args.reps)
    t_d, t_c = time_pairs(ctx.timer, *fns(), trials, reps, ctx.barrier)
    (gemm_d, size_d), (gemm_c, size_c) = (gemm_for(ctx, args.overlap_ratio * t) for t in (t_d, t_c))
    g_d = median_us(ctx, captured(ctx, gemm_d), trials, reps)
    g_c = median_us(ctx, captured(ctx, gemm_c), trials, reps)
    o_d, o_c = time_pairs(ctx.timer, *fns(gemm_d, gemm_c), trials, reps, ctx.barrier)
    rows = []
    for phase, t, g, o, size in (("dispatch", t_d, g_d, o_d, size_d),
                                 ("combine", t_c, g_c, o_c, size_c)):  # fmt: skip
        rows.append({
            "impl": impl_name(kt), "tokens": case.tokens, "dtype": case.dtype, "rank": ctx.rank,
            "phase": phase,
            "transfer_us": t, "gemm_us": g, "gemm_size": size, "overlapped_us": o,
            "hidden": min(1.0, max(0.0, 1.0 - (o - g) / t)) if t > 0 else float("nan"),
        })  # fmt: skip
    return rows


def measure_token_major(
    args, ctx, op, case: Case, kt="IntraNode", baseline=True, quant="none"
) -> list[dict]:
    """Time mori's dispatch/combine (each block count) and, with `baseline`, the
    all_to_all baseline on one case; returns this rank's records. `quant`: the op's
    combine quant type (its combine bytes are what crosses: combine_row_bytes)."""
    import torch
    import torch.distributed as dist

    n, dt, x, w, s, idx = case.tokens, case.dtype, case.x, case.weights, case.scales, case.indices
    rank, world, epr, k, hidden, m = ctx.rank, ctx.world, ctx.epr, ctx.k, ctx.hidden, ctx.m
    cuda, device, timer, scale_dim = ctx.cuda, ctx.device, ctx.timer, ctx.scale_dim
    records = []
    inter = kt in internode.INTERNODE
    # Eager pass: routing counts, and the combine input (rows as bf16). Each call is
    # waited for before its results are read (the inter-node kernels' constraint:
    # timing.settled); an inter-node op's byte counts are read after every rank's
    # call finished (everything it put on the link has landed).
    async_ll = kt in ("AsyncLL", "AsyncLL-ce")
    phase_bytes = {}

    def eager(fn, phase):
        if not inter:
            return fn()
        result = settled(ctx, fn)()
        ctx.barrier()
        phase_bytes[phase] = op._mode.bytes(phase)
        return result

    row = f"{kt} {n} tokens {dt}"
    ctx.progress(f"{row}: first dispatch")
    out, out_w, _, _, total_t = eager(lambda: op.dispatch(x, w, s, idx), "dispatch")
    if async_ll:
        op.dispatch_recv()
    total = int(total_t.item())
    # MORI's flat send index: src_rank * (world * m) + src_token.
    src_rank = torch.div(op.get_dispatch_src_token_pos(), world * m, rounding_mode="floor")
    local_rows = int((src_rank == rank).sum())
    y = torch.zeros(op.config.max_num_out_tokens, hidden, dtype=torch.bfloat16, device=device)
    y[:total] = out[:total].to(torch.bfloat16)
    yw = out_w.clone()
    ctx.progress(f"{row}: first combine")
    mori_out, _ = eager(lambda: op.combine(y, yw, None), "combine")
    if async_ll:
        op.combine_recv()
    mori_out = mori_out.clone()
    del out, out_w, total_t  # views of the heap: finalize needs them gone
    row_bytes = hidden * x.element_size() + (scale_dim * 4 if dt == "fp8" else 0)
    comb_row = combine_row_bytes(op, hidden)
    vol = {
        "dispatch": total * row_bytes,
        "dispatch_cross": (total - local_rows) * row_bytes,
        "combine": total * comb_row,
        "combine_cross": (total - local_rows) * comb_row,
    }
    # The combine outputs compared bit for bit: InterNodeV1 and V1LL round one partial
    # per node first (README, "Combine's sum"), the others sum every row at once.
    ref_key = (n, dt, quant) + (("node partials",) if kt in ("InterNodeV1", "InterNodeV1LL")
                                 else ())  # fmt: skip
    for blocks in args.block_num if cuda else [0]:

        def d_fn(b=blocks):
            op.dispatch(x, w, s, idx, b, -1, args.warp_per_block)
            if async_ll:
                op.dispatch_recv()

        def c_fn(b=blocks):
            op.combine(y, yw, None, b, -1, args.warp_per_block)
            if async_ll:
                op.combine_recv()

        # The inter-node calls are timed eagerly, each synchronised (bench/internode.py).
        times = eager_times if inter else graph_times
        ctx.progress(f"{row} {blocks} blocks: timing")
        d_us, c_us, kernel_us = times(args, ctx, d_fn, c_fn)
        ctx.progress(f"{row} {blocks} blocks: timed")
        name = impl_name(kt, quant)
        print_timeline(ctx, op, f"{name}, {n} tokens {dt} {blocks} blocks")
        rec = record(name, n, dt, blocks, rank, total, local_rows, vol, d_us, c_us)
        rec["dispatch_kernel_us"], rec["combine_kernel_us"] = kernel_us
        ctx.floors.attach(rec, case, vol, "token")
        if inter:
            internode.attach(args, ctx, op, rec, phase_bytes)
            ctx.progress(f"{row} {blocks} blocks: link baselines measured")
        rec["matches_intranode"] = bool(
            torch.equal(mori_out, ctx.reference.setdefault(ref_key, mori_out))
        )
        rec.update(kernel_type=kt, combine_quant=quant, combine_sent_bytes=vol["combine"],
                   combine_sent_cross_bytes=vol["combine_cross"])  # fmt: skip
        bf16 = ctx.reference.get((n, dt, "none"))
        if quant != "none" and bf16 is not None:
            # The quantized combine beside the bf16 one of the same rows: the largest
            # difference relative to the largest bf16 value.
            top = float(bf16.float().abs().max()) or 1.0
            rec["combine_rel_diff_vs_bf16"] = (
                float((mori_out.float() - bf16.float()).abs().max()) / top
            )
        records.append(rec)
    if args.no_baseline or not baseline or ctx.a2a_group is None and cuda:
        return records  # (no GPU baseline where ranks share a GPU: worker.py)
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
    d_us, c_us = time_pairs(
        timer,
        b_dispatch,
        b_combine,
        args.iters,
        min(args.reps, 3) if cuda else 1,
        dist.barrier,
    )
    rec = record(
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


def record(impl, n, dt, blocks, rank, total, local_rows, vol, d_us, c_us) -> dict:
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
