# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Timing for ``python -m mori.ep.bench``: CUDA events (wall clock on CPU) around
dispatch/combine pairs, CUDA-graph capture, the profiler's kernel times, and a GEMM of
a chosen duration for the overlap measurement."""

from __future__ import annotations

import statistics
import time


class Timer:
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


def time_pairs(timer, dispatch_fn, combine_fn, iters, reps, barrier):
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


def kernel_times(dispatch_fn, combine_fn, reps, barrier, timer):
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


def graph_times(args, ctx, d_fn, c_fn):
    """Per-call and kernel times of d_fn / c_fn, each captured in a CUDA graph (on CPU:
    wall-clock medians of direct calls)."""
    if not ctx.cuda:
        d_us, c_us = time_pairs(ctx.timer, d_fn, c_fn, args.iters, 1, ctx.barrier)
        return d_us, c_us, (None, None)
    d_replay, c_replay = captured_pair(ctx, d_fn, c_fn)
    ctx.barrier()
    d_us, c_us = time_pairs(ctx.timer, d_replay, c_replay, args.iters, args.reps, ctx.barrier)
    kernel_us = kernel_times(d_replay, c_replay, args.reps, ctx.barrier, ctx.timer)
    return d_us, c_us, kernel_us


def settled(ctx, fn):
    """``fn`` followed by a synchronisation of the current stream (CUDA; on CPU ``fn``
    itself). The inter-node kernels wait for the process's proxy thread, which needs
    the CUDA context: nothing that may hold it (a copy to pageable memory, a first
    kernel load) may run while they do, so every call is waited for before the next
    host step."""
    if not ctx.cuda:
        return fn
    import torch

    def call():
        result = fn()
        torch.cuda.current_stream().synchronize()
        return result

    return call


def eager_times(args, ctx, d_fn, c_fn):
    """Per-call and kernel times of d_fn / c_fn called eagerly, each call followed by a
    stream synchronisation (``settled``), for calls that cannot be captured in a CUDA
    graph: CUDA events around each call (host launch included), median over
    ``--iters`` trials of ``--reps`` pairs, the first pair of each trial dropped; the
    kernels' own GPU time from the profiler (``kernel_times``). On CPU: as
    ``graph_times`` (wall clock)."""
    if not ctx.cuda:
        return graph_times(args, ctx, d_fn, c_fn)
    d_call, c_call = settled(ctx, d_fn), settled(ctx, c_fn)
    d_call()  # warm-up pair: the op's first calls of this shape
    c_call()
    ctx.barrier()
    d_us, c_us = time_pairs(ctx.timer, d_call, c_call, args.iters, args.reps, ctx.barrier)
    kernel_us = kernel_times(d_call, c_call, args.reps, ctx.barrier, ctx.timer)
    return d_us, c_us, kernel_us


def median_us(ctx, fn, trials: int, reps: int) -> float:
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


def captured(ctx, fn):
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


def captured_pair(ctx, d_fn, c_fn):
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


def gemm_for(ctx, target_us: float):
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
        t = median_us(ctx, captured(ctx, make(size)), 3, 5)
        size = int(min(16384, max(128, size * (target_us / max(t, 1e-3)) ** (1 / 3))))
        size = (size + 127) // 128 * 128
    agreed = torch.tensor([size])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return make(int(agreed)), int(agreed)
