# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Benchmark of the CUDA symmetric heap between two local GPUs.

    python -m mori.core.bench_shmem [--json PATH] [--min-size 1K] [--max-size 1G]
                                    [--blocks 32] [--threads 1024] [--iters 20]

Measures, in one run: kernel put bandwidth from pe 0 to pe 1 at block scope
(``PutBlock``, 16-byte vectorized) with ``--blocks`` blocks and also 16 and 8,
beside the copy-engine baselines ``cudaMemcpyAsync`` through the peer mapping and
torch's cross-device ``copy_`` (cudaMemcpyPeerAsync); then ``barrier_all`` (host)
and ``barrier_on_stream`` latency (a CUDA graph of N device barriers, replayed).
Times are medians of ``--iters`` trials timed with CUDA events. Run it as is (it
starts 2 local processes, one per GPU) or under torchrun with 2 processes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from mori.core import bench as scaffold

NVLINK_SPEC_GBPS = 450.0  # H100/H200 NVLink 4, 18 links: 450 GB/s per direction


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mori.core.bench_shmem",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scaffold.add_output_args(p)
    p.add_argument("--min-size", type=scaffold.parse_size, default=1 << 10)
    p.add_argument("--max-size", type=scaffold.parse_size, default=1 << 30)
    p.add_argument("--blocks", type=int, default=32, help="blocks (SMs) of the main put column")
    p.add_argument("--threads", type=int, default=1024, help="threads per block")
    p.add_argument("--iters", type=int, default=20, help="timed trials per point (median)")
    p.add_argument("--barriers", type=int, default=100, help="barriers per graph replay")
    p.add_argument("--timeout-s", type=float, default=540.0)
    return p.parse_args(argv)


def _median_ms(fn, reps: int, trials: int, sync_fn=None) -> float:
    """Median over trials of (elapsed of `reps` back-to-back fn calls) / reps, in ms."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        if sync_fn is not None:
            sync_fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from mori.core import _C, shmem

    _, _, local = scaffold.rank_env()
    ngpu = torch.cuda.device_count()
    if ngpu == 0:
        raise SystemExit("bench_shmem needs CUDA GPUs")
    dev = local % ngpu
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo", init_method="env://")
    heap = scaffold.heap_bytes(args.max_size + (64 << 20))
    shmem.init(device=dev, heap_size=heap, timeout_s=120)
    me, n = shmem.my_pe(), shmem.n_pes()
    peer = (me + 1) % n
    peer_dev = (dev + 1) % ngpu if ngpu > 1 else dev
    info = shmem.info()
    stream = torch.cuda.current_stream().cuda_stream

    dst = shmem.empty((args.max_size,), torch.uint8)
    src = torch.randint(0, 256, (args.max_size,), dtype=torch.uint8, device="cuda")
    peer_dst = shmem.peer_view(dst, peer)
    cross = None
    if me == 0 and peer_dev != dev:
        cross = torch.empty(args.max_size, dtype=torch.uint8, device=f"cuda:{peer_dev}")
    torch.cuda.synchronize()
    shmem.barrier_all()

    block_counts = sorted({args.blocks, 16, 8}, reverse=True)
    sizes = []
    s = args.min_size
    while s <= args.max_size:
        sizes.append(s)
        s *= 4
    rows, records = [], []
    for nbytes in sizes:
        if me == 0:
            reps = max(1, min(100, (64 << 20) // nbytes))
            rec = {"bytes": nbytes, "put_gbps": {}}
            dst_ptr = dst.data_ptr()
            for b in block_counts:
                ms = _median_ms(
                    lambda b=b, nbytes=nbytes, dst_ptr=dst_ptr: _C._shmem_put_kernel(
                        dst_ptr,
                        src.data_ptr(),
                        nbytes,
                        peer,
                        "block",
                        b,
                        args.threads,
                        stream,
                    ),
                    reps,
                    args.iters,
                )
                rec["put_gbps"][str(b)] = nbytes / (ms * 1e-3) / 1e9
            view_copy = peer_dst[:nbytes]
            ms = _median_ms(lambda v=view_copy, s=src[:nbytes]: v.copy_(s), reps, args.iters)
            del view_copy
            rec["memcpy_peer_view_gbps"] = nbytes / (ms * 1e-3) / 1e9
            if cross is not None:
                ms = _median_ms(
                    lambda c=cross[:nbytes], s=src[:nbytes]: c.copy_(s), reps, args.iters
                )
                rec["memcpy_peer_device_gbps"] = nbytes / (ms * 1e-3) / 1e9
            ref = max(rec["memcpy_peer_view_gbps"], rec.get("memcpy_peer_device_gbps", 0.0))
            rec["pct_of_peer_copy"] = 100.0 * rec["put_gbps"][str(args.blocks)] / ref
            records.append(rec)
            row = [scaffold.format_size(nbytes)]
            row += [rec["put_gbps"][str(b)] for b in block_counts]
            row += [
                rec["memcpy_peer_view_gbps"],
                rec.get("memcpy_peer_device_gbps", float("nan")),
                rec["pct_of_peer_copy"],
            ]
            rows.append(row)
        torch.cuda.synchronize()
        shmem.barrier_all()

    # Host barrier.
    for _ in range(20):
        shmem.barrier_all()
    host_times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        for _ in range(50):
            shmem.barrier_all()
        host_times.append((time.perf_counter() - t0) / 50 * 1e6)
    host_us = statistics.median(host_times)

    # barrier_on_stream: a graph of N device barriers, replayed.
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(args.barriers):
            shmem.barrier_on_stream()
    torch.cuda.synchronize()
    shmem.barrier_all()
    graph_ms = _median_ms(
        g.replay, 1, args.iters, sync_fn=lambda: (torch.cuda.synchronize(), shmem.barrier_all())
    )
    graph_us = graph_ms * 1e3 / args.barriers
    # One kernel looping over device barriers (no launch between barriers).
    loop_ms = _median_ms(
        lambda: _C._shmem_barrier_loop(args.barriers, stream),
        1,
        args.iters,
        sync_fn=lambda: (torch.cuda.synchronize(), shmem.barrier_all()),
    )
    loop_us = loop_ms * 1e3 / args.barriers
    torch.cuda.synchronize()
    shmem.barrier_all()

    if me == 0:
        name = torch.cuda.get_device_name(dev)
        headers = (
            ["size"]
            + [f"put {b}blk GB/s" for b in block_counts]
            + ["memcpy via view GB/s", "memcpyPeer GB/s", f"put {args.blocks}blk % of copy"]
        )
        print(
            f"mori shmem bench: {n} pes, pe 0 on GPU {dev} ({name}) -> pe 1 on GPU {peer_dev}; "
            f"handle {info['handle_type']}; {args.threads} threads/block; median of "
            f"{args.iters} trials (CUDA events)"
        )
        print(scaffold.table(rows, headers))
        big = [r for r in records if r["bytes"] >= (16 << 20)]
        worst = min((r["pct_of_peer_copy"] for r in big), default=float("nan"))
        ref_peak = max(
            (
                max(r["memcpy_peer_view_gbps"], r.get("memcpy_peer_device_gbps", 0.0))
                for r in records
            ),
            default=float("nan"),
        )
        print(
            f"physical reference: NVLink 4 NV18 {NVLINK_SPEC_GBPS:.0f} GB/s per direction "
            f"(spec); measured peer copy peak {ref_peak:.1f} GB/s is the practical limit"
        )
        print(
            f"put at >= 16M with {args.blocks} blocks: worst {worst:.1f}% of peer copy "
            f"(target >= 90%)"
        )
        print(
            f"barrier_all (host): {host_us:.1f} us; barrier_on_stream (graph of "
            f"{args.barriers}): {graph_us:.2f} us/barrier; in-kernel barrier loop: "
            f"{loop_us:.2f} us/barrier (target <= 5 us)"
        )
        if args.json:
            out = {
                "device": name,
                "n_pes": n,
                "devices": [dev, peer_dev],
                "handle_type": info["handle_type"],
                "threads_per_block": args.threads,
                "iters": args.iters,
                "nvlink_spec_gbps": NVLINK_SPEC_GBPS,
                "put": records,
                "put_worst_pct_ge_16M": worst,
                "barrier_all_host_us": host_us,
                "barrier_on_stream_graph_us": graph_us,
                "barrier_kernel_loop_us": loop_us,
            }
            scaffold.write_json(args.json, out)
    del peer_dst, dst, g
    import gc

    gc.collect()
    shmem.finalize()
    dist.destroy_process_group()


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if scaffold.run_or_launch("mori.core.bench_shmem", argv, parse_args(argv), worker, 2):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
