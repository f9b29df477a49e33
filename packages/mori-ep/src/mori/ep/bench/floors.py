# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""What the GPU allows, measured in the same run as each row of ``python -m
mori.ep.bench`` (``--floors``, on by default), so each figure reads as a multiple of it:

  * ``empty``: a kernel that returns at once (``torch.cuda._sleep(0)``), launched the
    same way as mori's (one CUDA graph replay): the fixed cost of any kernel.
  * ``copy``: one device-to-device ``cudaMemcpyAsync`` (``Tensor.copy_`` of bytes) of
    the call's bytes (the ``disp``/``comb`` volumes of the main table), in a graph: the
    memory system's time to move them once.
  * ``torch``: the same dispatch and combine written with plain torch on this GPU for
    this rank's own tokens, every destination on this GPU (on one rank: exactly the
    op's work): ``index_select`` of the rows by a row -> token map planned beforehand
    (routing not timed; the fp8 group cast of ``deepep-ll`` is), and a combine that
    sums each token's rows in fp32 with ``index_add_`` (expert-major: weighted by the
    routing weights) and casts to bf16.

Every floor is GPU time per call (the profiler's CUDA activity records of ``--reps``
graph replays: kernels, copies and memsets summed, divided by the calls), the
definition of the main table's ``kern us``. On CPU the same code runs as a check,
timed by the wall clock.
"""

from __future__ import annotations

import statistics
import time

from .timing import captured


def gpu_us(ctx, fn, reps: int) -> float:
    """GPU time (us) of one call of ``fn`` (its graph replay on CUDA): every CUDA
    activity of ``reps`` calls, summed, over ``reps``. CPU: median wall clock."""
    replay = captured(ctx, fn)
    if not ctx.cuda:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            replay()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            replay()
        torch.cuda.synchronize()
    total = sum(
        e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA
    )
    return total / reps


def empty_kernel_us(ctx, reps: int) -> float | None:
    """A kernel that returns at once, one graph replay per call (None on CPU)."""
    if not ctx.cuda:
        return None
    import torch

    return gpu_us(ctx, lambda: torch.cuda._sleep(0), reps)


class Floors:
    """The floors of one run: measured once per (case, layout, volume) and attached to
    every record of that case (``floor_*`` keys)."""

    def __init__(self, args, ctx):
        self.ctx = ctx
        self.reps = max(3, args.reps)
        self.enabled = args.floors
        self.empty_us = empty_kernel_us(ctx, self.reps) if self.enabled else None
        self._cache: dict = {}

    def copy_us(self, nbytes: int) -> float:
        import torch

        key = ("copy", nbytes)
        if key not in self._cache:
            src = torch.ones(max(nbytes, 1), dtype=torch.uint8, device=self.ctx.device)
            dst = torch.empty_like(src)
            self._cache[key] = gpu_us(self.ctx, lambda: dst.copy_(src), self.reps)
        return self._cache[key]

    def attach(self, rec: dict, case, vol: dict, layout: str, cast: bool = False) -> None:
        """Add the floors of ``case`` to ``rec``: the copies of its dispatch/combine
        volumes and the torch version in ``layout`` ("token" or "expert" major; with
        ``cast``, the dispatch includes the fp8 group cast of bf16 tokens)."""
        if not self.enabled:
            return
        key = ("torch", case.tokens, case.dtype, layout, cast)
        if key not in self._cache:
            self._cache[key] = torch_times(self.ctx, case, layout, cast, self.reps)
        d_torch, c_torch = self._cache[key]
        rec.update(
            floor_empty_us=self.empty_us,
            floor_dispatch_copy_us=self.copy_us(vol["dispatch"]),
            floor_combine_copy_us=self.copy_us(vol["combine"]),
            floor_dispatch_torch_us=d_torch,
            floor_combine_torch_us=c_torch,
        )


def plan_rows(ctx, case, layout: str):
    """(row -> token map, row -> weight) of this rank's own tokens: token-major, one row
    per (token, destination rank holding one of its experts), grouped by destination;
    expert-major, one row per valid (token, expert), grouped by expert."""
    import torch

    idx = case.indices.to(torch.int64)
    n, k = idx.shape
    valid = idx >= 0
    if layout == "token":
        dest = torch.where(valid, idx // ctx.epr, ctx.world)
        mask = torch.zeros(n, ctx.world + 1, dtype=torch.bool, device=idx.device)
        mask.scatter_(1, dest, True)
        _, tok = mask[:, : ctx.world].t().nonzero(as_tuple=True)
        return tok, None
    flat = torch.where(valid, idx, ctx.world * ctx.epr).flatten()
    order = torch.argsort(flat, stable=True)[: int(valid.sum())]
    return order // k, case.weights.flatten()[order].float()


def torch_times(ctx, case, layout: str, cast: bool, reps: int) -> tuple[float, float]:
    """GPU time (us) per call of the torch dispatch and combine of ``case``."""
    import torch

    tok, w_row = plan_rows(ctx, case, layout)
    rows, n, hidden = tok.numel(), case.tokens, ctx.hidden
    x = case.x
    if cast:  # deepep-ll fp8: the dispatch casts bf16 tokens itself
        x = case.x.to(torch.bfloat16)
    out_x = torch.empty((rows, hidden), dtype=torch.float8_e4m3fn if cast else x.dtype,
                        device=ctx.device)  # fmt: skip
    out_w = torch.empty((rows, case.weights.size(1)), dtype=case.weights.dtype, device=ctx.device)
    scales = case.scales
    groups = hidden // 128
    out_s = None
    if cast or scales is not None:
        out_s = torch.empty((rows, groups if cast else scales.size(1)), dtype=torch.float32,
                            device=ctx.device)  # fmt: skip

    def dispatch():
        src, src_scales = x, scales
        if cast:
            g = x.float().view(n, groups, 128)
            amax = g.abs().amax(-1).clamp_min(1e-4)
            src_scales = amax / 448.0
            src = (g / src_scales.unsqueeze(-1)).to(torch.float8_e4m3fn).view(n, hidden)
        # Rows as bytes: one gather for bf16 and fp8 alike.
        torch.index_select(src.view(torch.uint8), 0, tok, out=out_x.view(torch.uint8))
        torch.index_select(case.weights, 0, tok, out=out_w)
        if src_scales is not None:
            torch.index_select(src_scales, 0, tok, out=out_s)

    y = torch.randn((rows, hidden), device=ctx.device).to(torch.bfloat16)
    acc = torch.empty((n, hidden), dtype=torch.float32, device=ctx.device)
    out = torch.empty((n, hidden), dtype=torch.bfloat16, device=ctx.device)

    def combine():
        acc.zero_()
        rows_f = y.float() if w_row is None else y.float() * w_row.unsqueeze(1)
        acc.index_add_(0, tok, rows_f)
        out.copy_(acc)

    return gpu_us(ctx, dispatch, reps), gpu_us(ctx, combine, reps)
