# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Benchmarks of the balanced mode (mori.ep.balanced).

    python -m mori.ep.bench_balanced prefetch [--world-size N] [--json PATH] [--plot PATH]
    python -m mori.ep.bench_balanced maxvio   [--world-size N] [--tokens 4096] [--hidden 7168]
                                              [--topk 8] [--experts-per-rank 256/N]
                                              [--ffn 512] [--json PATH] [--plot PATH]

Ranks: ``--world-size`` processes (default one per GPU, at least 2), rank r on GPU
r % GPUs, so several ranks may share one GPU (their kernels then time-slice it: such
figures check the paths, they are not a link's). ``--world-size 1`` runs one process.

Timing (both modes): every timed call is preceded by a stream synchronisation and a
heap barrier on every rank, so the ranks start together; on CUDA its time is read
from two CUDA events recorded on the stream the Buffer launches on (the current
stream) around the call, on CPU from the wall clock. Two warm-up calls, then
``--iters`` timed ones; a rank's figure is its median, the printed figure the
slowest rank's (max over ranks).

``prefetch``: MoonEP's ``bench_prefetch`` table (its 14 configurations, slots_1 ...
tiny_512x512) scaled to the ranks present: experts per rank as in the 4-rank original
(E = epn x ranks), Slots = the original's (expert, destination) copies x ranks / 4
(at least 1, at most epn per rank), dealt round robin over the ranks, each rank's slots
filled from the next rank's experts (from its own at one rank). Each call pushes gate,
up and down ([H, Hp] bf16 each) into every slot: three matrices per slot where MoonEP's
table counts one, so at equal Slots our Data is three times the original's.
Data (MB) = Slots x 3 x H x Hp x 2 B x 2 (remote read + local write: the published
table's convention), Worst (us) = the slowest rank's median call, BW = Data / Worst,
CommBW = Data / 2 / Worst (the bytes crossing once). SMs: the prefetch kernel's blocks
(one per slot, matrix and 256 KiB chunk of every rank's slots, at most 1024; it does
not use ``num_sms``), 0 for copy engines. On CUDA both prefetch engines are
measured: "sm" (a kernel's stores push each slot from the owner) and "copy" (copy
engines: one cudaMemcpyAsync per slot and matrix after one stream synchronisation to
read the plan's slots). Beside each configuration, in the same run: "copy_"
= the same bytes moved by plain ``Tensor.copy_`` calls (each rank copies the matrices
of the slots it owns into the destination rank's pool through its peer view: a
same-device copy at one rank or with the ranks on one GPU, a peer copy across GPUs),
timed the same way, and "vs copy_" = its time / Worst (CommBW as a fraction of the
copy's). MoonEP's published CommBW (a Blackwell-class machine, 4 ranks; not an H200
figure) is printed for reference. On CPU H and Hp are divided by 16 (the shapes do not
fit a host heap) and the times are the host implementation's, not the product's.

``maxvio``: routings of growing imbalance (MaxVio = max_e T_e / mean_e T_e - 1 over the
experts' pair counts T_e summed over ranks, of 0.2, 1, 10, 20; lognormal expert
popularity, top-k without repeats; a target beyond what that allows, E / K - 1, is
clipped, the achieved value printed). Per MaxVio: the planner alone (CUDA: a call of the
one-launch kernel from the gathered counts, and that kernel's device time from the
profiler, the slowest rank's mean of 5; CPU: the host planner's tables), dispatch with planning
and with the saved plan, combine, prefetch_weight and reduce_grad ([epn, H, ffn] gate,
up, down), the slowest rank's median; dispatch and combine with ``zero_copy`` (the
shard itself; no copy out of it); mori's IntraNode dispatch + combine on the same
routing (EpDispatchCombineOp, bf16). Every rank's received real rows are checked to be
exactly S*K (the run fails otherwise) and printed beside the most (token, k) pairs a
rank's experts get without balancing and the most tokens IntraNode delivers to a rank.
Defaults on CUDA: S 4096, H 7168, K 8, E = 256 experts over the ranks (DeepSeek-V3's
shape), ffn 512, 10 timed calls; on CPU S 64, H 256, K 2, epn 32, ffn 64, 3 calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial

from mori.core import bench as scaffold

# MoonEP's bench_prefetch configurations: (name, E on 4 ranks, B, H, Hp, Slots,
# published Worst (us), published CommBW (GB/s)).
PREFETCH_CONFIGS = [
    ("slots_1", 32, 14, 3584, 3072, 1, 34.51, 638.04),
    ("slots_2", 32, 14, 3584, 3072, 2, 62.30, 706.90),
    ("slots_3", 32, 14, 3584, 3072, 3, 90.28, 731.74),
    ("slots_5", 32, 14, 3584, 3072, 5, 146.85, 749.75),
    ("ramp_0_3", 32, 14, 3584, 3072, 12, 343.52, 769.22),
    ("mixed", 32, 14, 3584, 3072, 12, 344.71, 766.56),
    ("heavy", 32, 14, 3584, 3072, 17, 484.67, 772.36),
    ("full_3x8", 32, 14, 3584, 3072, 24, 681.36, 775.63),
    ("dense_B8", 32, 8, 3584, 3072, 15, 429.11, 769.73),
    ("epn4_full", 16, 14, 3584, 3072, 12, 343.51, 769.24),
    ("epn16_mixed", 64, 16, 3584, 3072, 24, 680.12, 777.04),
    ("thin_7168x128", 32, 16, 7168, 128, 12, 34.85, 631.86),
    ("tall_1024x3072", 32, 14, 1024, 3072, 12, 102.85, 734.02),
    ("tiny_512x512", 32, 16, 512, 512, 17, 17.68, 504.12),
]
MAXVIO_TARGETS = (0.2, 1.0, 10.0, 20.0)
WARMUP = 2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mori.ep.bench_balanced", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("mode", choices=("prefetch", "maxvio"))
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--tokens", type=int, default=None, help="S (default 4096; CPU 64)")
    p.add_argument("--hidden", type=int, default=None, help="H (default 7168; CPU 256)")
    p.add_argument("--ffn", type=int, default=None, help="H' of maxvio's weights (512; CPU 64)")
    p.add_argument("--topk", type=int, default=None, help="K (8; CPU 2)")
    p.add_argument("--experts-per-rank", type=int, default=None,
                   help="epn (CUDA: 256 / ranks, so E = 256; CPU 32)")  # fmt: skip
    p.add_argument("--engines", default=None,
                   help="prefetch engines to measure, comma-separated: sm,copy (CUDA default "
                        "both; a host heap has one path, reported as sm)")  # fmt: skip
    p.add_argument(
        "--configs",
        default=None,
        help="prefetch: only these configurations (comma-separated names)",
    )
    p.add_argument("--iters", type=int, default=None, help="timed calls (CUDA 10; CPU 3)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=1200.0)
    scaffold.add_output_args(p, plot_help="draw the table's figures here (PNG)")
    return p.parse_args(argv)


def _routing(torch, popularity, S, K, rank, seed):
    """[S, K] int32 distinct experts per token drawn from `popularity`."""
    g = torch.Generator().manual_seed(seed * 1000003 + rank)
    return torch.multinomial(popularity.expand(S, -1), K, replacement=False, generator=g).int()


def _popularity(torch, E, K, S, R, target, seed):
    """Lognormal popularity whose routing's MaxVio (over all R ranks' draws) is near
    `target` (bisection on the lognormal sigma); (popularity, achieved)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(E, generator=g)

    def vio(sigma):
        pop = torch.exp(sigma * z)
        counts = torch.zeros(E)
        for r in range(R):
            counts += torch.bincount(_routing(torch, pop, S, K, r, seed).flatten(), minlength=E)
        return float(counts.max() / counts.mean() - 1), pop

    lo, hi = 0.0, 8.0
    best = vio(hi)
    if best[0] < target:
        return best[1], best[0]
    for _ in range(14):
        mid = (lo + hi) / 2
        v = vio(mid)
        if abs(v[0] - target) < abs(best[0] - target):
            best = v
        lo, hi = (mid, hi) if v[0] < target else (lo, mid)
    return best[1], best[0]


class _Ctx:
    def __init__(self, torch, dist, cuda, device):
        self.torch, self.dist, self.cuda, self.device = torch, dist, cuda, device

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def all_max(self, value: float) -> float:
        t = self.torch.tensor([float(value)], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def _start(self):
        """Every rank idle and past a heap barrier: the ranks start the call together."""
        from mori.core import shmem

        self.sync()
        shmem.barrier_all()

    def time_us(self, fn, iters) -> float:
        """The slowest rank's median time of ``fn`` over ``iters`` calls (after WARMUP
        untimed ones), each started together on every rank (``_start``). On CUDA the
        time is between two events recorded on the current stream (the one the
        Buffer, the op and ``copy_`` launch on) around the call; on CPU wall clock."""
        torch = self.torch
        for _ in range(WARMUP):
            self._start()
            fn()
        times = []
        stream = torch.cuda.current_stream(self.device) if self.cuda else None
        for _ in range(iters):
            self._start()
            if self.cuda:
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record(stream)
                fn()
                e1.record(stream)
                e1.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        self.sync()
        return self.all_max(statistics.median(times))


def _pools(torch, shmem, R, epn, h, hp, dtype):
    return [shmem.empty((R, epn, h, hp), dtype) for _ in range(3)]


def _slots(torch, R, epn, slots):
    """[R, epn] experts_to_copy: ``slots`` slots dealt round robin over the ranks (at
    most epn each), rank d's slots b = 0, 1, ... holding expert b of rank (d + 1) % R."""
    copy = torch.full((R, epn), -1, dtype=torch.int32)
    taken = [0] * R
    d = 0
    for _ in range(slots):
        while taken[d] >= epn:
            d = (d + 1) % R
        copy[d, taken[d]] = ((d + 1) % R) * epn + taken[d]
        taken[d] += 1
        d = (d + 1) % R
    return copy, taken


def _engines(args, cuda) -> list[str]:
    if not cuda:
        return ["sm"]
    names = scaffold.comma_list(args.engines) if args.engines else ["sm", "copy"]
    for n in names:
        if n not in ("sm", "copy"):
            raise SystemExit(f"--engines: {n!r} is neither sm nor copy")
    return names


def _configs(args):
    if not args.configs:
        return PREFETCH_CONFIGS
    want = scaffold.comma_list(args.configs)
    known = {c[0] for c in PREFETCH_CONFIGS}
    for n in want:
        if n not in known:
            raise SystemExit(f"--configs: unknown configuration {n!r} ({', '.join(sorted(known))})")
    return [c for c in PREFETCH_CONFIGS if c[0] in want]


def _on(plan, device):
    """``plan`` with every tensor on ``device`` (where the Buffer's heap is)."""
    import dataclasses

    import torch

    moved = {f.name: getattr(plan, f.name).to(device) for f in dataclasses.fields(plan)
             if isinstance(getattr(plan, f.name), torch.Tensor)}  # fmt: skip
    return dataclasses.replace(plan, **moved)


def run_prefetch(args, ctx, rank, R) -> list[dict]:
    import torch

    from mori.core import shmem
    from mori.ep import balanced

    scale = 1 if ctx.cuda else 16
    rows = []
    for name, e4, b, h, hp, slots4, pub_us, pub_comm in _configs(args):
        h, hp = h // scale, hp // scale
        epn = e4 // 4
        E = epn * R
        slots = min(max(1, round(slots4 * R / 4)), epn * R)
        copy, taken = _slots(torch, R, epn, slots)
        # A plan of the Buffer's shape (every token to expert 0) whose prefetch slots are
        # then set to the configuration's.
        tpe = torch.zeros(R, E, dtype=torch.int32)
        tpe[:, 0] = 1
        ones = torch.zeros(R, 1, 1, dtype=torch.int32)
        tables = balanced.plan(tpe, 1, 1, 1, topk=ones).for_rank(rank)
        tables.experts_to_copy = copy
        tables = _on(tables, ctx.device)
        local = [torch.randn(epn, h, hp, device=ctx.device).to(torch.bfloat16) for _ in range(3)]
        pools = _pools(torch, shmem, R, epn, h, hp, torch.bfloat16)
        # The same bytes by Tensor.copy_: this rank owns the slots of rank d = rank - 1,
        # its experts 0 .. taken[d] - 1 into d's slots 0 .. taken[d] - 1.
        d = (rank - 1) % R
        n = taken[d]
        views = [shmem.peer_view(p, d)[d] for p in pools]

        def plain(local=local, views=views, n=n):
            for src, dst in zip(local, views, strict=True):
                dst[:n].copy_(src[:n])

        copy_us = ctx.time_us(plain, args.iters)
        data = slots * 3 * h * hp * 2 * 2
        for engine in _engines(args, ctx.cuda):
            buf = balanced.Buffer(1, 8, 1, E, R, token_padding=1, prefetch_engine=engine)

            def call(buf=buf, tables=tables, local=local, pools=pools):
                buf.prefetch_weight(
                    tables, local_gate_weight=local[0], local_up_weight=local[1],
                    local_down_weight=local[2], gate_prefetch_buffer=pools[0],
                    up_prefetch_buffer=pools[1], down_prefetch_buffer=pools[2])  # fmt: skip

            us = ctx.time_us(call, args.iters)
            # The kernel's grid: a block per (slot, matrix, 256 KiB chunk), at most 1024.
            chunks = -(-(h * hp * 2) // (256 << 10))
            blocks = min(1024, R * epn * 3 * chunks) if engine == "sm" else 0
            rows.append({"engine": engine, "config": name, "E": E, "B": b, "H": h, "Hp": hp,
                         "SMs": blocks, "slots": slots, "rank_slots_max": max(taken),
                         "data_mb": data / 1e6, "worst_us": us, "bw_gbps": data / us / 1e3,
                         "comm_gbps": data / 2 / us / 1e3, "copy_us": copy_us,
                         "copy_comm_gbps": data / 2 / copy_us / 1e3, "vs_copy": copy_us / us,
                         "moonep_worst_us": pub_us, "moonep_comm_gbps": pub_comm})  # fmt: skip
            ctx.sync()
            shmem.barrier_all()
            buf.destroy()
        # Release this configuration's pools before the next one's (the closures hold
        # them too): the heap is sized for the largest configuration alone.
        del pools, local, views, plain, call
    return rows


def _intranode(op, x, w, idx) -> None:
    out = op.dispatch(x, w, None, idx)
    op.combine(out[0], None, idx)


def _planner(ctx, tpe_all, topk, rank, S, K):
    """The planner alone: CUDA, the one-launch kernel on the gathered counts; CPU, the
    host planner's tables from the counts."""
    from mori.ep import balanced

    if ctx.cuda:
        tpe_d = tpe_all.to(ctx.device)
        return partial(balanced.planning.plan_cuda, tpe_d, topk, rank, S, K, 128, check=False)
    return partial(balanced.plan, tpe_all, S, K, 128)


def _kernel_us(ctx, fn, name: str, reps: int = 5) -> float | None:
    """The slowest rank's mean device time per call of the kernels whose name holds
    ``name`` (the profiler's CUDA activity records: kernel time only, without the
    call's host work or another process's time slices), or None on CPU."""
    if not ctx.cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    ctx.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        ctx.sync()
    kernels = [e for e in prof.events() if name in e.name]
    us = sum(e.device_time for e in kernels) / reps if kernels else -1.0
    us = ctx.all_max(us)
    return None if us < 0 else us


def run_maxvio(args, ctx, rank, R) -> list[dict]:
    import torch

    from mori.core import shmem
    from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp, balanced

    S, K, H, HP, epn = args.tokens, args.topk, args.hidden, args.ffn, args.experts_per_rank
    E = epn * R
    dev = ctx.device
    buf = balanced.Buffer(S, H, K, E, R, token_padding=128)
    op = EpDispatchCombineOp(EpDispatchCombineConfig(
        rank=rank, world_size=R, hidden_dim=H, scale_dim=0, scale_type_size=4,
        max_token_type_size=2, max_num_inp_token_per_rank=S, num_experts_per_rank=epn,
        num_experts_per_token=K, data_type=torch.bfloat16))  # fmt: skip
    weights = [torch.randn(epn, H, HP, device=dev).to(torch.bfloat16) for _ in range(3)]
    pools = _pools(torch, shmem, R, epn, H, HP, torch.bfloat16)
    grads = [torch.zeros(epn, H, HP, device=dev) for _ in range(3)]
    rpools = _pools(torch, shmem, R, epn, H, HP, torch.float32)
    for p in rpools:
        p.zero_()
    x = torch.randn(S, H, device=dev).to(torch.bfloat16)
    w = torch.rand(S, K, device=dev)
    hv, wv = buf.hidden_nvsh_buffer_view, buf.router_weight_buffer_view
    rows = []
    for target in MAXVIO_TARGETS:
        pop, achieved = _popularity(torch, E, K, S, R, target, args.seed)
        topk_all = [_routing(torch, pop, S, K, r, args.seed) for r in range(R)]
        tpe_all = torch.stack([torch.bincount(t.flatten(), minlength=E) for t in topk_all]).int()
        topk, tpe = topk_all[rank].to(dev), tpe_all[rank].to(dev)
        _, _, _, plan = buf.dispatch(x, w, topk, tpe, zero_copy=True,
                                     router_weights_zero_copy=True)  # fmt: skip
        ctx.sync()
        real = plan.received_rows()
        low, high = -ctx.all_max(-real), ctx.all_max(real)
        if not low == high == S * K:
            raise AssertionError(
                f"MaxVio {achieved:.2f}: real rows received {low:.0f}..{high:.0f} per rank, "
                f"expected exactly S*K = {S * K} on every rank"
            )
        print(f"rank {rank}: MaxVio {achieved:.2f}: received {real} real rows (S*K = {S * K})")
        unbalanced = int(tpe_all.sum(0).view(R, epn).sum(1).max())
        out = op.dispatch(x, w, None, topk)
        intra_max = ctx.all_max(int(out[4].item()))
        op.combine(out[0], None, topk)
        del out
        remote = ctx.all_max(int(plan.remote_stats[0].item()))
        zc = {"zero_copy": True, "router_weights_zero_copy": True}
        calls = {
            "plan": _planner(ctx, tpe_all, topk, rank, S, K),
            "fresh": partial(buf.dispatch, x, w, topk, tpe, **zc),
            "dispatch": partial(buf.dispatch, x, w, plan=plan, **zc),
            "combine": partial(buf.combine, plan, hv, wv, **zc),
            "prefetch": partial(
                buf.prefetch_weight, plan, local_gate_weight=weights[0],
                local_up_weight=weights[1], local_down_weight=weights[2],
                gate_prefetch_buffer=pools[0], up_prefetch_buffer=pools[1],
                down_prefetch_buffer=pools[2]),
            "reduce_grad": partial(
                buf.reduce_grad, plan, local_gate_grad=grads[0], local_up_grad=grads[1],
                local_down_grad=grads[2], gate_reduce_buffer=rpools[0],
                up_reduce_buffer=rpools[1], down_reduce_buffer=rpools[2]),
            "intranode": partial(_intranode, op, x, w, topk),
        }  # fmt: skip
        t = {name: ctx.time_us(fn, args.iters) for name, fn in calls.items()}
        plan_kernel = _kernel_us(ctx, calls["plan"], "PlannerKernel")
        rows.append({"target": target, "maxvio": achieved, "rows_min": int(low),
                     "rows_max": int(high), "rows_balanced": S * K,
                     "rows_unbalanced_max": unbalanced, "intranode_tokens_max": int(intra_max),
                     "remote_experts_max": int(remote),
                     "plan_us": t["plan"], "plan_kernel_us": plan_kernel,
                     "plan_dispatch_us": t["fresh"],
                     "dispatch_us": t["dispatch"], "combine_us": t["combine"],
                     "prefetch_us": t["prefetch"], "reduce_grad_us": t["reduce_grad"],
                     "intranode_dc_us": t["intranode"]})  # fmt: skip
    ctx.sync()
    shmem.barrier_all()
    buf.destroy()
    return rows


def _report(args, meta, rows) -> None:
    print(f"# mori.ep.bench_balanced {args.mode}: {meta['ranks']} ranks on {meta['device']} "
          f"({meta['gpus']} GPU(s) visible; {meta['machine']['cpu']}), {meta['date']}")  # fmt: skip
    if args.mode == "prefetch":
        print("Data = Slots x 3 matrices x H x Hp x 2 B x 2 (read + write; MoonEP counts one "
              "matrix per slot); Worst = slowest rank's median call; CommBW = Data / 2 / Worst; "
              "copy_ = the same bytes by Tensor.copy_ (same run); MoonEP = published CommBW "
              "(Blackwell-class, 4 ranks)")  # fmt: skip
        heads = ["Engine", "Config", "E", "B", "H", "Hp", "SMs", "Slots", "Data(MB)",
                 "Worst(us)", "BW(GB/s)", "CommBW", "copy_(us)", "copy_ CommBW", "vs copy_",
                 "MoonEP CommBW"]  # fmt: skip
        keys = ["engine", "config", "E", "B", "H", "Hp", "SMs", "slots", "data_mb", "worst_us",
                "bw_gbps", "comm_gbps", "copy_us", "copy_comm_gbps", "vs_copy",
                "moonep_comm_gbps"]  # fmt: skip
        if meta.get("peer_copy_gbps"):
            print(f"same-run peer copy (copy engine, 256 MiB, rank 0 -> 1): "
                  f"{meta['peer_copy_gbps']:.1f} GB/s")  # fmt: skip
    else:
        s = meta["shape"]
        print(f"S={s['S']} H={s['H']} K={s['K']} E={s['E']} ffn={s['ffn']}; times in us, "
              f"slowest rank's median; balanced rows checked == S*K = {s['S'] * s['K']} "
              f"on every rank")  # fmt: skip
        heads = ["target", "MaxVio", "rows/rank (min..max)", "unbalanced max pairs/rank",
                 "IntraNode max tokens/rank", "plan", "plan kernel", "plan+dispatch",
                 "dispatch", "combine", "prefetch", "reduce_grad", "IntraNode d+c"]  # fmt: skip
        keys = ["target", "maxvio", "rows", "rows_unbalanced_max", "intranode_tokens_max",
                "plan_us", "plan_kernel_us", "plan_dispatch_us", "dispatch_us", "combine_us",
                "prefetch_us", "reduce_grad_us", "intranode_dc_us"]  # fmt: skip
        rows = [{**r, "rows": f"{r['rows_min']}..{r['rows_max']}"} for r in rows]
    print(scaffold.table([[r[k] for k in keys] for r in rows], heads, floatfmt=".2f"))


def _plot(path, doc) -> None:
    plt = scaffold.pyplot(path)
    if plt is None:
        return
    rows, mode = doc["records"], doc["meta"]["mode"]
    fig, ax = plt.subplots(figsize=(9, 4))
    if mode == "prefetch":
        configs = list(dict.fromkeys(r["config"] for r in rows))
        series = sorted({r["engine"] for r in rows})
        width = 0.8 / (len(series) + 1)
        for i, engine in enumerate(series):
            by = {r["config"]: r["comm_gbps"] for r in rows if r["engine"] == engine}
            xs = [j + i * width for j in range(len(configs))]
            ax.bar(xs, [by.get(c, 0) for c in configs], width, label=f"prefetch ({engine})")
        copy_ = {r["config"]: r["copy_comm_gbps"] for r in rows}
        ax.bar([j + len(series) * width for j in range(len(configs))],
               [copy_[c] for c in configs], width, label="Tensor.copy_ (same bytes)")  # fmt: skip
        ax.set_xticks([j + width * len(series) / 2 for j in range(len(configs))], configs)
        ax.set_ylabel("CommBW (GB/s)")
        ax.tick_params(axis="x", rotation=60)
    else:
        xs = [r["maxvio"] for r in rows]
        lines = {
            "balanced dispatch + combine (saved plan)": ("dispatch_us", "combine_us"),
            "balanced dispatch with planning + combine": ("plan_dispatch_us", "combine_us"),
            "IntraNode dispatch + combine": ("intranode_dc_us",),
        }
        for label, keys in lines.items():
            ax.plot(xs, [sum(r[k] for k in keys) for r in rows], marker="o", label=label)
        ax.set_xlabel("MaxVio")
        ax.set_ylabel("us")
    ax.legend()
    ax.set_title(f"mori.ep.bench_balanced {mode}: {doc['meta']['ranks']} ranks, "
                 f"{doc['meta']['device']}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


def _heap(args, cuda, R, _C) -> int:
    if args.mode == "maxvio":
        epn = args.experts_per_rank
        pools = 3 * R * epn * args.hidden * args.ffn * (2 + 4)
        block = _C.balanced_block_layout(R, epn * R, args.tokens, args.topk, 128, args.hidden)
        intra = _C.ep_buffer_layout(R, 0, args.tokens, args.topk, args.hidden, 2, 0, epn)
        return pools + int(block["total_bytes"]) + int(intra["total_bytes"]) + (256 << 20)
    div = 1 if cuda else 16
    # The pools are [R, epn, H, Hp] on every rank (slice [rank] holds its slots).
    heap = max(3 * R * (c[1] // 4) * (c[3] // div) * (c[4] // div) * 2 for c in _configs(args))
    heap += 256 << 20
    if cuda and R > 1:
        from .bench.baseline import PEER_COPY_BYTES

        heap += PEER_COPY_BYTES
    return heap


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from mori.core import shmem
    from mori.ep import _C

    rank, R, local = scaffold.rank_env()
    cuda, dev, gpus = scaffold.pick_device(args.device, local, _C)
    device = torch.device("cuda", dev) if cuda else torch.device("cpu")
    args.tokens = args.tokens or (4096 if cuda else 64)
    args.hidden = args.hidden or (7168 if cuda else 256)
    args.ffn = args.ffn or (512 if cuda else 64)
    args.experts_per_rank = args.experts_per_rank or (max(1, 256 // R) if cuda else 32)
    args.topk = args.topk or (8 if cuda else 2)
    args.iters = args.iters or (10 if cuda else 3)
    dist.init_process_group("gloo", init_method="env://")
    heap = scaffold.heap_bytes(_heap(args, cuda, R, _C))
    shmem.init(device=dev if cuda else "cpu", heap_size=heap, timeout_s=args.timeout_s)
    ctx = _Ctx(torch, dist, cuda, device)
    meta = {"mode": args.mode, "ranks": R, "gpus": gpus,
            "device": torch.cuda.get_device_name(dev) if cuda else "cpu (host heap)",
            "machine": scaffold.machine(), "iters": args.iters, "warmup": WARMUP,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    if args.mode == "prefetch":
        rows = run_prefetch(args, ctx, rank, R)
        if cuda and R > 1:
            from .bench.baseline import peer_copy_gbps
            from .bench.timing import Timer

            meta["peer_copy_gbps"] = peer_copy_gbps(rank, device, Timer(True),
                                                    shmem.barrier_all, 5)  # fmt: skip
    else:
        meta["shape"] = {"S": args.tokens, "H": args.hidden, "K": args.topk,
                         "E": args.experts_per_rank * R, "ffn": args.ffn}  # fmt: skip
        rows = run_maxvio(args, ctx, rank, R)
    if rank == 0:
        _report(args, meta, rows)
        doc = {"meta": meta, "records": rows}
        if args.json:
            scaffold.write_json(args.json, doc)
        if args.plot:
            _plot(args.plot, doc)
    ctx.sync()
    del rows
    import gc

    gc.collect()
    shmem.barrier_all()
    shmem.finalize()
    dist.destroy_process_group()


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if scaffold.replot(args, lambda doc, path: _plot(path, doc)):
        return
    if scaffold.run_or_launch("mori.ep.bench_balanced", argv, args, worker):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
