# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the CUDA dispatch/combine tests. argv: mode placement seed [iters]

placement: shared   every rank on GPU 0;  per_gpu  rank r on GPU r.
mode:      random   bf16 and fp8 ops, every routing kind in turn (-1 slots, zero-token
                    ranks, ...), fresh inputs per call, launch shapes varied; dispatch
                    compared bit for bit with a reference built from an all-gather of
                    every rank's inputs, combine exactly with the ordered fp32 sum.
           graph    dispatch -> expert -> combine captured in one CUDA graph, replayed
                    with fresh inputs copied into the captured input tensors.
           costs    the profiler's records of eager calls: one mori kernel per
                    dispatch/combine, no torch kernel, no host synchronisation.
Prints "rank N ok" last; any failed check raises (non-zero exit).
"""

import sys
import time

import torch
import torch.distributed as dist
from ep_reference import FP8, ROUTINGS, Routing, expert, factor, sum_start

from mori.core import shmem
from mori.core.dist_compat import all_gather_single
from mori.core.testing import start_rank
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp

mode, placement, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
iters = int(sys.argv[4]) if len(sys.argv) > 4 else 8
rank, world, _ = start_rank(placement, "512M", 120)

HIDDEN, M, EPR, K = 1024, 64, 8, 6
E = EPR * world
REF = Routing(world, rank, M, EPR, K)
routing, gather, padded = REF.routing, REF.gather, REF.padded
LAUNCH = [(-1, -1), (1, 1), (3, 4), (16, 8), (200, 16), (7, 32)]


def make_op(fp8: bool) -> EpDispatchCombineOp:
    cfg = EpDispatchCombineConfig(
        rank=rank,
        world_size=world,
        hidden_dim=HIDDEN,
        scale_dim=HIDDEN // 128 if fp8 else 0,
        scale_type_size=4,
        max_token_type_size=2,
        max_num_inp_token_per_rank=M,
        num_experts_per_rank=EPR,
        num_experts_per_token=K,
        warp_num_per_block=8,
        block_num=32,
        data_type=FP8 if fp8 else torch.bfloat16,
    )
    return EpDispatchCombineOp(cfg, timeout_s=60)


def inputs(kind: str, it: int, base_seed: int, fp8: bool, n: int | None = None):
    gen = torch.Generator().manual_seed(base_seed * 1009 + it * 31 + rank)
    n = REF.num_tokens(kind, gen, it) if n is None else n
    x = torch.randn(n, HIDDEN, generator=gen)
    x = x.to(FP8) if fp8 else x.to(torch.bfloat16)
    w = torch.rand(n, K, generator=gen)
    sc = torch.rand(n, HIDDEN // 128, generator=gen) + 0.5 if fp8 else None
    return n, x, w, sc, routing(kind, n, gen, it)


def check_dispatch(tag, n, x, w, sc, idx, out, out_w, out_s, out_idx, total, src_pos) -> None:
    counts = torch.zeros(world, dtype=torch.int64)
    all_gather_single(counts, torch.tensor([n], dtype=torch.int64))
    ax, aw, ai = gather(padded(x, n)), gather(padded(w, n)), gather(padded(idx, n, -1))
    asc = gather(padded(sc, n)) if sc is not None else None
    rows = [
        (s, t)
        for s in range(world)
        for t in range(int(counts[s]))
        if rank in {int(e) // EPR for e in ai[s][t] if e >= 0}
    ]
    assert total == len(rows), f"{tag}: total_recv {total}, expected {len(rows)}"
    want_pos = torch.tensor([s * world * M + t for s, t in rows], dtype=torch.int32)
    assert torch.equal(src_pos, want_pos), f"{tag}: src pos"
    if not rows:
        return

    def sel(a):
        return torch.stack([a[s][t] for s, t in rows])

    assert torch.equal(out[:total].view(torch.uint8), sel(ax).view(torch.uint8)), f"{tag}: tokens"
    assert torch.equal(out_w[:total].view(torch.int32), sel(aw).view(torch.int32)), f"{tag}: w"
    assert torch.equal(out_idx[:total], sel(ai)), f"{tag}: indices"
    if asc is not None:
        assert torch.equal(out_s[:total].view(torch.int32), sel(asc).view(torch.int32)), tag


def check_combine(tag, n, x, w, sc, idx, cout, cw) -> None:
    assert cout.shape == (n, HIDDEN) and cw.shape == (n, K), f"{tag}: shapes"
    # Sums start from -0.0 for a token with a destination, +0.0 for one without
    # (README, Semantics): an fp8 token whose parts are all -0.0 sums to -0.0.
    has_part = (idx >= 0).any(dim=1) if n else torch.zeros(0, dtype=torch.bool)
    want, want_w = sum_start(has_part, HIDDEN), sum_start(has_part, K)
    for t in range(n):
        for d in sorted({int(e) // EPR for e in idx[t] if e >= 0}):
            want[t] += expert(x[t : t + 1], sc[t : t + 1] if sc is not None else None, d)[0].float()
            want_w[t] += w[t] * factor(d)
    assert torch.equal(cout.view(torch.int16), want.to(torch.bfloat16).view(torch.int16)), (
        f"{tag}: combine differs from the ordered fp32 sum"
    )
    assert torch.equal(cw.view(torch.int32), want_w.view(torch.int32)), f"{tag}: weights"


def run_random(fp8: bool, base_seed: int) -> float:
    op = make_op(fp8)
    spent = 0.0
    for it in range(iters):
        kind = ROUTINGS[it % len(ROUTINGS)]
        blocks, warps = LAUNCH[it % len(LAUNCH)]
        tag = f"{'fp8' if fp8 else 'bf16'} it {it} ({kind}, launch {blocks}x{warps})"
        n, x, w, sc, idx = inputs(kind, it, base_seed, fp8)
        xg, wg, idxg = x.cuda(), w.cuda(), idx.cuda()
        scg = sc.cuda() if fp8 else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out, out_w, out_s, out_idx, total_t = op.dispatch(xg, wg, scg, idxg, blocks, -1, warps)
        torch.cuda.synchronize()
        spent += time.perf_counter() - t0
        assert total_t.device.type == "cuda" and total_t.dtype == torch.int32
        total = int(total_t.item())
        src_pos = op.get_dispatch_src_token_pos().cpu()
        o, ow = out[:total].cpu(), out_w[:total].cpu()
        os_ = out_s[:total].cpu() if fp8 else None
        check_dispatch(tag, n, x, w, sc, idx, o, ow, os_, out_idx[:total].cpu(), total, src_pos)

        y = expert(o, os_, rank)
        yw = ow * factor(rank)
        if it % 2:  # capacity rows, junk past total_recv
            cap = world * M
            yy = torch.randn(cap, HIDDEN).to(torch.bfloat16)
            yy[:total] = y
            yyw = torch.rand(cap, K)
            yyw[:total] = yw
            y, yw = yy, yyw
        yg, ywg = y.cuda(), yw.cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cout, cw = op.combine(yg, ywg, None, blocks, -1, warps)
        torch.cuda.synchronize()
        spent += time.perf_counter() - t0
        check_combine(tag, n, x, w, sc, idx, cout.cpu(), cw.cpu())
    op.close()
    return spent


def run_graph(base_seed: int) -> None:
    op = make_op(False)
    n = M if rank == 0 else M // 2 + 3
    static = [t.cuda() for t in inputs("random", 0, base_seed, False, n)[1:] if t is not None]
    xs, ws, idxs = static

    def step():
        out, out_w, out_s, out_idx, total = op.dispatch(xs, ws, None, idxs)
        y = (out.float() * factor(rank)).to(torch.bfloat16)
        cout, cw = op.combine(y, out_w * factor(rank), None)
        return out, out_w, out_idx, total, cout, cw

    step()  # eager warm-up (both ranks make the same calls)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, out_w, out_idx, total_t, cout, cw = step()
    for rep in range(iters):
        kind = ROUTINGS[rep % len(ROUTINGS)] if rep % len(ROUTINGS) not in (1, 5, 6) else "random"
        _, x, w, _, idx = inputs(kind, 100 + rep, base_seed, False, n)
        xs.copy_(x)
        ws.copy_(w)
        idxs.copy_(idx)
        g.replay()
        torch.cuda.synchronize()
        total = int(total_t.item())
        tag = f"graph replay {rep} ({kind})"
        src_pos = op.get_dispatch_src_token_pos().cpu()
        check_dispatch(
            tag,
            n,
            x,
            w,
            None,
            idx,
            out[:total].cpu(),
            out_w[:total].cpu(),
            None,
            out_idx[:total].cpu(),
            total,
            src_pos,
        )
        check_combine(tag, n, x, w, None, idx, cout.cpu(), cw.cpu())
    print(f"rank {rank}: {iters} graph replays ok")
    del g
    op.close()


# Runtime calls that block the host on the GPU (CUPTI names them as CPU-side events).
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)


def profiled(fn):
    """fn()'s result, the CUDA activity names (kernels, copies, memsets) and the
    host-blocking runtime calls made while fn ran (the profiler's own synchronisation
    when it stops lies outside fn's range)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("mori_call"):
            res = fn()
    torch.cuda.synchronize()
    events = prof.events()
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA  # the range also shows as a GPU annotation
    (call,) = [e.time_range for e in events if e.name == "mori_call" and e.device_type == cpu]
    kernels = [e.name for e in events if e.device_type == gpu and e.name != "mori_call"]
    syncs = [
        e.name
        for e in events
        if e.device_type == cpu
        and e.name in SYNC_CALLS
        and call.start <= e.time_range.start <= call.end
    ]
    return res, kernels, syncs


def costs_of(fp8: bool, base_seed: int) -> None:
    op = make_op(fp8)
    _, x, w, sc, idx = inputs("random", 0, base_seed, fp8, M)
    xg, wg, idxg = x.cuda(), w.cuda(), idx.cuda()
    scg = sc.cuda() if fp8 else None
    idx64 = idxg.long()
    tag = "fp8" if fp8 else "bf16"
    for rep in range(3):  # the first round also warms torch and the profiler up
        records = []
        for ids, weighted in ((idxg, False), (idxg, True), (idx64, False)):
            kind = "int64" if ids.dtype == torch.int64 else "int32"
            (out, out_w, *_), k, sy = profiled(lambda ids=ids: op.dispatch(xg, wg, scg, ids))
            records.append((f"dispatch {kind}", k, sy))
            y = (out.float() * factor(rank)).to(torch.bfloat16)
            cw = out_w if weighted else None
            _, k, sy = profiled(lambda y=y, cw=cw, ids=ids: op.combine(y, cw, ids))
            records.append((f"combine(out, {'w' if weighted else 'None'}, {kind} ids)", k, sy))
        if rep == 0:
            continue
        for name, kernels, syncs in records:
            print(f"rank {rank} {tag} {name}: kernels {kernels} syncs {syncs}")
            assert not syncs, f"{tag} {name}: host synchronisation {syncs}"
            mine = [k for k in kernels if "mori" in k and "Kernel" in k]
            want = "Dispatch" if name.startswith("dispatch") else "Combine"
            assert len(mine) == 1 and want in mine[0], f"{tag} {name}: mori kernels {mine}"
            others = [k for k in kernels if k not in mine]
            if name == "dispatch int64":
                assert len(others) <= 2, f"{tag} {name}: more than the ids' cast: {others}"
            else:
                assert not others, f"{tag} {name}: other kernels or copies {others}"
    op.close()


def run_costs(base_seed: int) -> None:
    """What one call costs beyond its kernel: the profiler's records of eager calls
    with inputs already on the GPU. Each dispatch and each combine (MORI's
    combine(out, None, topk_ids) and the weighted one), bf16 and fp8, must launch
    exactly one kernel, mori's own, and no torch kernel or copy; no call may block the
    host on the GPU. int64 ids add only their cast (two torch kernels) to dispatch."""
    costs_of(False, base_seed)
    costs_of(True, base_seed + 1)
    print(f"rank {rank}: costs ok")


if mode == "random":
    spent = run_random(False, seed) + run_random(True, seed + 1)
    print(f"rank {rank}: {2 * iters} dispatch+combine in {spent * 1e3:.0f} ms")
elif mode == "graph":
    run_graph(seed)
elif mode == "costs":
    run_costs(seed)
else:
    raise SystemExit(f"unknown mode {mode}")
torch.cuda.synchronize()
shmem.barrier_all()
import gc  # noqa: E402

gc.collect()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
