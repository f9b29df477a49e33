# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Benchmarks of the balanced mode (mori.ep.balanced).

    python -m mori.ep.bench_balanced prefetch [--world-size 2] [--json PATH] [--plot PATH]
    python -m mori.ep.bench_balanced maxvio   [--tokens 4096] [--hidden 7168] [--topk 8]
                                              [--experts-per-rank 32] [--json] [--plot]

``prefetch``: MoonEP's ``bench_prefetch`` table (its 14 configurations, slots_1 …
tiny_512x512; docs/balanced.md) scaled to the ranks present: experts per rank as in
the 4-rank original (E = epn x ranks), Slots = the original's (expert, destination)
copies x ranks / 4, at most epn per rank, each rank taking its slots from the next
rank's experts. Each call pushes gate, up and down ([H, Hp] bf16 each) into every
slot. Data (MB) = Slots x 3 x H x Hp x 2 B x 2 (remote read + local write, the
convention of MoonEP's published table), Worst (us) = the slowest rank's median call,
BW = Data / Worst, CommBW = Data / 2 / Worst (the bytes crossing once). Beside it, in
the same run, a peer copy (copy engine) on CUDA. On CUDA the table is measured twice:
the pushes as a kernel's stores (Engine "sm") and as copy-engine peer copies ("copy").
On CPU H and Hp are divided by 16 (the table's shapes do not fit a host heap) and the
times are the host implementation's, not the product's.

``maxvio``: routings of growing imbalance (MaxVio = max_e T_e / mean - 1 of 0.2, 1, 10,
20, lognormal expert popularity; a target beyond what top-k without repeats allows is
clipped, the achieved value printed) with dispatch with planning, dispatch reusing the
plan, combine, prefetch and reduce_grad times (the slowest rank's median), the most
rows any rank receives with and without balancing (balanced: checked to be exactly S*K
on every rank), and mori's IntraNode dispatch and combine on the same routing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial

from mori.core import bench as scaffold

# MoonEP's bench_prefetch configurations (name, E on 4 ranks, B, H, Hp, Slots).
PREFETCH_CONFIGS = [
    ("slots_1", 32, 14, 3584, 3072, 1), ("slots_2", 32, 14, 3584, 3072, 2),
    ("slots_3", 32, 14, 3584, 3072, 3), ("slots_5", 32, 14, 3584, 3072, 5),
    ("ramp_0_3", 32, 14, 3584, 3072, 12), ("mixed", 32, 14, 3584, 3072, 12),
    ("heavy", 32, 14, 3584, 3072, 17), ("full_3x8", 32, 14, 3584, 3072, 24),
    ("dense_B8", 32, 8, 3584, 3072, 15), ("epn4_full", 16, 14, 3584, 3072, 12),
    ("epn16_mixed", 64, 16, 3584, 3072, 24), ("thin_7168x128", 32, 16, 7168, 128, 12),
    ("tall_1024x3072", 32, 14, 1024, 3072, 12), ("tiny_512x512", 32, 16, 512, 512, 17),
]  # fmt: skip
MAXVIO_TARGETS = (0.2, 1.0, 10.0, 20.0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mori.ep.bench_balanced", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("mode", choices=("prefetch", "maxvio"))
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--tokens", type=int, default=None, help="S (default 4096; CPU 64)")
    p.add_argument("--hidden", type=int, default=None, help="H (default 7168; CPU 256)")
    p.add_argument("--ffn", type=int, default=None, help="H' of maxvio's weights (512; 64)")
    p.add_argument("--topk", type=int, default=None, help="K (8; CPU 2)")
    p.add_argument("--experts-per-rank", type=int, default=None, help="epn (32; CPU 32)")
    p.add_argument("--iters", type=int, default=None, help="timed calls (20; CPU 3)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=1200.0)
    scaffold.add_output_args(p, plot_help="draw the table's times here (PNG)")
    return p.parse_args(argv)


def _routing(torch, popularity, S, K, rank, seed):
    """[S, K] int32 distinct experts per token drawn from `popularity`."""
    g = torch.Generator().manual_seed(seed * 1000003 + rank)
    return torch.multinomial(popularity.expand(S, -1), K, replacement=False, generator=g).int()


def _popularity(torch, E, K, S, R, target, seed):
    """Lognormal popularity whose routing's MaxVio is near `target` (bisection on the
    lognormal sigma, on rank 0's draw scaled to R ranks); (popularity, achieved)."""
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

    def time_us(self, fn, iters) -> float:
        """The slowest rank's median of `iters` calls (a heap barrier before each)."""
        from mori.core import shmem

        fn()
        times = []
        for _ in range(iters):
            self.sync()
            shmem.barrier_all()
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e6)
        t = self.torch.tensor([statistics.median(times)], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])


def _pools(torch, shmem, R, epn, h, hp, dtype):
    return [shmem.empty((R, epn, h, hp), dtype) for _ in range(3)]


def run_prefetch(args, ctx, rank, R, engine: str = "sm") -> list[dict]:
    import torch

    from mori.core import shmem
    from mori.ep import balanced

    scale = 1 if ctx.cuda else 16
    rows = []
    for name, e4, b, h, hp, slots4 in PREFETCH_CONFIGS:
        h, hp = h // scale, hp // scale
        epn = e4 // 4
        E = epn * R
        slots = min(max(1, round(slots4 * R / 4)), epn * R)
        copy = torch.full((R, epn), -1, dtype=torch.int32)
        taken = [0] * R
        d = 0
        for _ in range(slots):
            while taken[d] >= epn:
                d = (d + 1) % R
            home = (d + 1) % R
            copy[d, taken[d]] = home * epn + taken[d]
            taken[d] += 1
            d = (d + 1) % R
        buf = balanced.Buffer(1, 8, 1, E, R, token_padding=1, prefetch_engine=engine)
        # A plan of this Buffer's shape (every token to expert 0) whose prefetch slots
        # are then set to the configuration's.
        tpe = torch.zeros(R, E, dtype=torch.int32)
        tpe[:, 0] = 1
        ones = torch.zeros(R, 1, 1, dtype=torch.int32)
        tables = balanced.plan(tpe, 1, 1, 1, topk=ones).for_rank(rank)
        tables.experts_to_copy = copy.to(ctx.device)
        local = [torch.randn(epn, h, hp).to(ctx.device, torch.bfloat16) for _ in range(3)]
        pools = _pools(torch, shmem, R, epn, h, hp, torch.bfloat16)

        def call(tables=tables, local=local, pools=pools, buf=buf):
            buf.prefetch_weight(tables, local_gate_weight=local[0], local_up_weight=local[1],
                                local_down_weight=local[2], gate_prefetch_buffer=pools[0],
                                up_prefetch_buffer=pools[1], down_prefetch_buffer=pools[2])  # fmt: skip

        us = ctx.time_us(call, args.iters)
        data = slots * 3 * h * hp * 2 * 2
        rows.append({"engine": engine, "config": name, "E": E, "B": b, "H": h, "Hp": hp,
                     "SMs": 32, "slots": slots, "data_mb": data / 1e6, "worst_us": us,
                     "bw_gbps": data / us / 1e3, "comm_gbps": data / 2 / us / 1e3})  # fmt: skip
        ctx.sync()
        shmem.barrier_all()
        buf.destroy()
        del pools, local
    return rows


def _intranode(op, x, w, idx) -> None:
    out = op.dispatch(x, w, None, idx)
    op.combine(out[0], None, idx)


def run_maxvio(args, ctx, rank, R) -> list[dict]:
    import torch

    from mori.core import shmem
    from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp, balanced

    S, K, H, HP, epn = args.tokens, args.topk, args.hidden, args.ffn, args.experts_per_rank
    E = epn * R
    buf = balanced.Buffer(S, H, K, E, R, token_padding=128)
    op = EpDispatchCombineOp(EpDispatchCombineConfig(
        rank=rank, world_size=R, hidden_dim=H, scale_dim=0, scale_type_size=4,
        max_token_type_size=2, max_num_inp_token_per_rank=S, num_experts_per_rank=epn,
        num_experts_per_token=K, data_type=torch.bfloat16))  # fmt: skip
    weights = [torch.randn(epn, H, HP).to(ctx.device, torch.bfloat16) for _ in range(3)]
    pools = _pools(torch, shmem, R, epn, H, HP, torch.bfloat16)
    grads = [torch.zeros(epn, H, HP, device=ctx.device) for _ in range(3)]
    rpools = _pools(torch, shmem, R, epn, H, HP, torch.float32)
    for p in rpools:
        p.zero_()
    x = torch.randn(S, H).to(ctx.device, torch.bfloat16)
    w = torch.rand(S, K, device=ctx.device)
    rows = []
    for target in MAXVIO_TARGETS:
        pop, achieved = _popularity(torch, E, K, S, R, target, args.seed)
        topk_all = [_routing(torch, pop, S, K, r, args.seed) for r in range(R)]
        tpe_all = torch.stack([torch.bincount(t.flatten(), minlength=E) for t in topk_all]).int()
        topk, tpe = topk_all[rank].to(ctx.device), tpe_all[rank].to(ctx.device)
        h_nvs, w_nvs, cu, plan = buf.dispatch(x, w, topk, tpe)
        ctx.sync()
        real = torch.tensor([plan.received_rows()])
        ctx.dist.all_reduce(real, op=ctx.dist.ReduceOp.MIN)
        low = int(real[0])
        ctx.dist.all_reduce(real.fill_(plan.received_rows()), op=ctx.dist.ReduceOp.MAX)
        assert low == int(real[0]) == S * K, f"received rows {low}..{int(real[0])} != S*K {S * K}"
        unbalanced = int(tpe_all.sum(0).view(R, epn).sum(1).max())
        calls = {
            "fresh": partial(buf.dispatch, x, w, topk, tpe),
            "dispatch": partial(buf.dispatch, x, w, plan=plan),
            "combine": partial(buf.combine, plan, h_nvs, w_nvs),
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
        rows.append({"target": target, "maxvio": achieved, "rows_balanced": S * K,
                     "rows_unbalanced_max": unbalanced, "plan_dispatch_us": t["fresh"],
                     "dispatch_us": t["dispatch"], "combine_us": t["combine"],
                     "prefetch_us": t["prefetch"], "reduce_grad_us": t["reduce_grad"],
                     "intranode_dc_us": t["intranode"]})  # fmt: skip
    buf.destroy()
    return rows


def _report(args, meta, rows) -> None:
    print(f"# mori.ep.bench_balanced {args.mode}: {meta['ranks']} ranks on {meta['device']} "
          f"({meta['machine']['cpu']}), {meta['date']}")  # fmt: skip
    if args.mode == "prefetch":
        heads = ["Engine", "Config", "E", "B", "H", "Hp", "SMs", "Slots", "Data(MB)",
                 "Worst(us)", "BW(GB/s)", "CommBW"]  # fmt: skip
        keys = ["engine", "config", "E", "B", "H", "Hp", "SMs", "slots", "data_mb", "worst_us",
                "bw_gbps", "comm_gbps"]  # fmt: skip
        if meta.get("peer_copy_gbps"):
            print(f"same-run peer copy (copy engine): {meta['peer_copy_gbps']:.1f} GB/s")
    else:
        heads = ["target", "MaxVio", "rows/rank balanced", "max rows/rank unbalanced",
                 "plan+dispatch us", "dispatch us", "combine us", "prefetch us", "reduce_grad us",
                 "IntraNode d+c us"]  # fmt: skip
        keys = ["target", "maxvio", "rows_balanced", "rows_unbalanced_max", "plan_dispatch_us",
                "dispatch_us", "combine_us", "prefetch_us", "reduce_grad_us",
                "intranode_dc_us"]  # fmt: skip
    print(scaffold.table([[r[k] for k in keys] for r in rows], heads, floatfmt=".2f"))


def _plot(path, doc) -> None:
    plt = scaffold.pyplot(path)
    if plt is None:
        return
    rows, mode = doc["records"], doc["meta"]["mode"]
    fig, ax = plt.subplots(figsize=(8, 4))
    if mode == "prefetch":
        sm = [r for r in rows if r.get("engine", "sm") == "sm"]
        ax.bar([r["config"] for r in sm], [r["comm_gbps"] for r in sm])
        ax.set_ylabel("CommBW (GB/s)")
        ax.tick_params(axis="x", rotation=60)
    else:
        xs = [r["maxvio"] for r in rows]
        for key in ("dispatch_us", "combine_us", "intranode_dc_us"):
            ax.plot(xs, [r[key] for r in rows], marker="o", label=key)
        ax.set_xlabel("MaxVio")
        ax.set_ylabel("us")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from mori.core import shmem
    from mori.ep import _C

    rank, R, local = scaffold.rank_env()
    cuda, dev, _ = scaffold.pick_device(args.device, local, _C)
    device = torch.device("cuda", dev) if cuda else torch.device("cpu")
    args.tokens = args.tokens or (4096 if cuda else 64)
    args.hidden = args.hidden or (7168 if cuda else 256)
    args.ffn = args.ffn or (512 if cuda else 64)
    args.experts_per_rank = args.experts_per_rank or 32
    args.topk = args.topk or (8 if cuda else 2)
    args.iters = args.iters or (20 if cuda else 3)
    dist.init_process_group("gloo", init_method="env://")
    # The pools are [R, epn, H, H'] on every rank (slice [rank] holds its slots).
    if args.mode == "maxvio":
        pools = 3 * R * args.experts_per_rank * args.hidden * args.ffn * (2 + 4)
        layout = _C.balanced_block_layout(R, args.experts_per_rank * R, args.tokens, args.topk,
                                          128, args.hidden)  # fmt: skip
        block = int(layout["total_bytes"])
        heap = pools + block + (1 << 30)
    else:
        div = 1 if cuda else 16
        heap = max(3 * R * (e4 // 4) * (h // div) * (hp // div) * 2
                   for _, e4, _, h, hp, _ in PREFETCH_CONFIGS) + (1 << 30)  # fmt: skip
        heap += (1 << 30) if cuda else 0  # the peer copy reference
    shmem.init(device=dev if cuda else "cpu", heap_size=scaffold.heap_bytes(heap),
               timeout_s=args.timeout_s)  # fmt: skip
    ctx = _Ctx(torch, dist, cuda, device)
    meta = {"mode": args.mode, "ranks": R, "device": torch.cuda.get_device_name(dev) if cuda
            else "cpu (host heap)", "machine": scaffold.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    if args.mode == "prefetch":
        rows = run_prefetch(args, ctx, rank, R)
        if cuda:
            rows += run_prefetch(args, ctx, rank, R, "copy")
        if cuda and R > 1:
            from .bench.baseline import peer_copy_gbps
            from .bench.timing import Timer

            meta["peer_copy_gbps"] = peer_copy_gbps(rank, device, Timer(True),
                                                    shmem.barrier_all, 5)  # fmt: skip
    else:
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
