# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Microbenchmark of the proxy on host heaps, with CPU producers.

    python -m mori.core.bench_proxy [--world-size 2] [--count 200000]
                                    [--latency-count 20000] [--sizes 64,4K,64K,1M]
                                    [--json PATH]

Starts ``--world-size`` local ranks, each its own emulated node
(MORI_SHMEM_NODE_ID), and measures on rank 0, once per path to rank 1 (``auto``:
CMA where the kernel permits it, else TCP; then ``tcp`` forced):

- commands per second through one proxy thread: atomic adds pushed back to back
  into one queue (a full queue back-pressures) until the last retired; to itself
  (``mapped``: the queue and the proxy alone) and to rank 1 (the transport too);
- push -> retire latency of one command at a time (median, p99): the producer's
  push, the proxy's pop, the post, the retire it publishes;
- write bandwidth to rank 1 for each of ``--sizes`` (write commands back to back).

The loops run in C++ (mori/proxy/bench.hpp). The GPU version (a kernel pushing
through mori/proxy/queue_device.cuh) is not measured here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from mori.core import bench as scaffold


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mori.core.bench_proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scaffold.add_output_args(p)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--count", type=int, default=200000, help="commands per throughput run")
    p.add_argument("--latency-count", type=int, default=20000, help="round trips timed")
    p.add_argument(
        "--sizes", type=scaffold.comma_list, default=["64", "4K", "64K", "1M"],
        help="write sizes for the bandwidth column",
    )  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=540.0)
    return p.parse_args(argv)


def _measure(p, me, peer, off_word, off_src, off_dst, args) -> dict:
    out: dict = {}
    for name, pe in (("self", me), ("peer", peer)):
        n, secs = p._p._measure_throughput("atomic_add", pe, 0, 0, 0, off_word, args.count)
        lat = p._p._measure_latency("atomic_add", pe, 0, 0, 0, off_word, args.latency_count)
        lat.sort()
        out[name] = {
            "path": p.path_to(pe),
            "commands_per_s": n / secs,
            "latency_median_us": statistics.median(lat) / 1000,
            "latency_p99_us": lat[int(0.99 * (len(lat) - 1))] / 1000,
        }
    bw = []
    for text in args.sizes:
        size = scaffold.parse_size(text)
        count = max(16, min(args.count, (256 << 20) // max(size, 1)))
        n, secs = p._p._measure_throughput("write", peer, off_dst, off_src, size, 0, count)
        bw.append({"bytes": size, "commands": n, "gbps": n * size / secs / 1e9})
    out["write"] = bw
    return out


def worker(args: argparse.Namespace) -> None:
    rank, world, _ = scaffold.rank_env()
    os.environ["MORI_SHMEM_NODE_ID"] = f"bench-node-{rank}"
    from mori.core import proxy, shmem
    from mori.core.bootstrap import TcpBootstrap

    sizes = [scaffold.parse_size(s) for s in args.sizes]
    boot = TcpBootstrap.from_env()
    shmem.init(device="cpu", heap_size=scaffold.heap_bytes(2 * max(sizes) + (4 << 20)),
               bootstrap=boot, timeout_s=120)  # fmt: skip
    word = shmem.malloc(8, 8)
    src = shmem.malloc(max(sizes))
    dst = shmem.malloc(max(sizes))
    results = {}
    for transport in ("auto", "tcp"):
        p = proxy.Proxy(boot, transport=transport, timeout_s=120)
        boot.barrier()
        if rank == 0:
            results[transport] = _measure(
                p, 0, 1, proxy.heap_offset(word), proxy.heap_offset(src),
                proxy.heap_offset(dst), args,
            )  # fmt: skip
        boot.barrier()
        p.close()
    if rank == 0:
        print(
            f"mori proxy bench: {world} ranks on one host, one emulated node each; rank 0 "
            f"pushes, one proxy thread per rank; {os.cpu_count()} CPUs, "
            f"{scaffold.compilers_running()} compilers running"
        )
        rows = []
        for transport, r in results.items():
            for name in ("self", "peer"):
                m = r[name]
                rows.append([transport, f"{name} ({m['path']})", m["commands_per_s"] / 1e6,
                             m["latency_median_us"], m["latency_p99_us"]])  # fmt: skip
        print(scaffold.table(
            rows, ["transport", "to", "Mcommands/s", "push->retire med us", "p99 us"],
            floatfmt=".2f",
        ))  # fmt: skip
        rows = []
        for i, size in enumerate(sizes):
            rows.append([scaffold.format_size(size)]
                        + [results[t]["write"][i]["gbps"] for t in results])  # fmt: skip
        print(scaffold.table(
            rows, ["write size"] + [f"{t} ({results[t]['peer']['path']}) GB/s" for t in results],
            floatfmt=".3f",
        ))  # fmt: skip
        if args.json:
            scaffold.write_json(args.json, {"machine": scaffold.machine(), "results": results})
    shmem.finalize(force=True)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if scaffold.run_or_launch("mori.core.bench_proxy", argv, args, worker, args.world_size):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
