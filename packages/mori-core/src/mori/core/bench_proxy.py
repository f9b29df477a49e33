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
- write bandwidth to rank 1 for each of ``--sizes`` (write commands back to back),
  beside the same bytes over a plain TCP socket between the same two processes
  (``sendall`` of each size, timed until the receiver's one-byte acknowledgement).

The loops run in C++ (mori/proxy/bench.hpp). With ``--device cuda`` the heaps are
CUDA heaps on GPU 0 and a kernel pushes (mori/proxy/queue_device.cuh): commands per
second of ``--blocks`` blocks pushing into one queue (then a device quiet), and the
push -> retire latency of one kernel thread, and 64-byte writes pushed the same way
(commands per second, and writes per wait of the proxy's CUDA streams: the TCP
sender waits once per proxy round for its staging copies, the mapped path likewise;
rank 0's waits only); the ranks share GPU 0 (time-sliced), so
the rank-to-rank figures there are for correctness, the self column is the
proxy's own cost; beside them, the PCIe round trip of a host-mapped flag between a
kernel thread and a host thread (the floor of a kernel's push -> retire).
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
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--blocks", type=int, default=8, help="--device cuda: pushing blocks")
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
        count = _write_count(size, args.count)
        n, secs = p._p._measure_throughput("write", peer, off_dst, off_src, size, 0, count)
        bw.append({"bytes": size, "commands": n, "gbps": n * size / secs / 1e9})
    out["write"] = bw
    return out


def _measure_cuda(p, me, peer, off_word, off_src, off_dst, args) -> dict:
    import time

    import torch

    stream = torch.cuda.current_stream().cuda_stream
    out: dict = {}
    per_block = max(1, args.count // args.blocks)
    lat_buf = torch.zeros(args.latency_count, dtype=torch.int64, device="cuda")
    for name, pe in (("self", me), ("peer", peer)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        p._p._device_push("atomic_add", pe, 0, 0, 0, off_word, 1, per_block, args.blocks, True,
                          stream)  # fmt: skip
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        p._p._device_push_latency("atomic_add", pe, 0, 0, 0, off_word, args.latency_count,
                                  lat_buf.data_ptr(), stream)  # fmt: skip
        torch.cuda.synchronize()
        lat = sorted(lat_buf.cpu().tolist())
        waits = p.stats()["lane_waits"]
        t0 = time.perf_counter()
        p._p._device_push("write", pe, off_dst, off_src, 64, 0, 0, per_block, args.blocks, True,
                          stream)  # fmt: skip
        torch.cuda.synchronize()
        write_secs = time.perf_counter() - t0
        waits = p.stats()["lane_waits"] - waits
        out[name] = {
            "path": p.path_to(pe),
            "commands_per_s": per_block * args.blocks / secs,
            "latency_median_us": statistics.median(lat) / 1000,
            "latency_p99_us": lat[int(0.99 * (len(lat) - 1))] / 1000,
            "writes64_per_s": per_block * args.blocks / write_secs,
            "writes64_per_lane_wait": per_block * args.blocks / max(1, waits),
        }
    out["write"] = []
    from mori.core import _C

    pp = sorted(_C.proxy_mapped_ping_pong(0, args.latency_count))
    out["mapped_ping_pong_median_us"] = statistics.median(pp) / 1000
    out["mapped_ping_pong_p99_us"] = pp[int(0.99 * (len(pp) - 1))] / 1000
    return out


def _raw_socket_gbps(boot, rank: int, sizes: list[int], count_of) -> list[float]:
    """Rank 0 -> rank 1 over one loopback TCP connection: GB/s per size."""
    import socket
    import time

    listener = None
    if rank == 1:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    else:
        port = 0
    ports = boot.all_gather(port.to_bytes(4, "little"))
    out = []
    if rank == 0:
        conn = socket.create_connection(("127.0.0.1", int.from_bytes(ports[1], "little")))
    else:
        conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(120)
    for size in sizes:
        count = count_of(size)
        if rank == 0:
            block = bytes(size)
            t0 = time.perf_counter()
            for _ in range(count):
                conn.sendall(block)
            conn.recv(1)
            out.append(count * size / (time.perf_counter() - t0) / 1e9)
        else:
            buf = bytearray(1 << 20)
            view = memoryview(buf)
            left = count * size
            while left:
                got = conn.recv_into(view[: min(left, len(buf))])
                if not got:
                    raise RuntimeError("bench_proxy: the raw socket baseline's sender closed")
                left -= got
            conn.sendall(b"k")
    conn.close()
    if listener is not None:
        listener.close()
    return out


def _write_count(size: int, count: int) -> int:
    return max(16, min(count, (256 << 20) // max(size, 1)))


def worker(args: argparse.Namespace) -> None:
    rank, world, _ = scaffold.rank_env()
    os.environ["MORI_SHMEM_NODE_ID"] = f"bench-node-{rank}"
    from mori.core import proxy, shmem
    from mori.core.bootstrap import TcpBootstrap

    sizes = [scaffold.parse_size(s) for s in args.sizes]
    cuda = args.device == "cuda"
    if cuda:
        import torch

        torch.cuda.set_device(0)
        sizes = []
    boot = TcpBootstrap.from_env()
    heap = scaffold.heap_bytes(2 * max(sizes, default=0) + (4 << 20))
    shmem.init(device=0 if cuda else "cpu", heap_size=heap, bootstrap=boot, timeout_s=120)
    word = shmem.malloc(8, 8)
    src = shmem.malloc(max(sizes, default=256))
    dst = shmem.malloc(max(sizes, default=256))
    results = {}
    for transport in ("auto", "tcp"):
        p = proxy.Proxy(boot, transport=transport, timeout_s=120,
                        producer="cuda" if cuda else "host")  # fmt: skip
        boot.barrier()
        if rank == 0 and cuda:
            results[transport] = _measure_cuda(
                p, 0, 1, proxy.heap_offset(word), proxy.heap_offset(src),
                proxy.heap_offset(dst), args,
            )  # fmt: skip
        elif rank == 0:
            results[transport] = _measure(
                p, 0, 1, proxy.heap_offset(word), proxy.heap_offset(src),
                proxy.heap_offset(dst), args,
            )  # fmt: skip
        boot.barrier()
        p.close()
    raw = _raw_socket_gbps(boot, rank, sizes, lambda s: _write_count(s, args.count))
    if rank == 0:
        print(
            f"mori proxy bench ({'kernel' if cuda else 'CPU'} producer): {world} ranks on one "
            f"host, one emulated node each; rank 0 pushes, one proxy thread per rank; "
            f"{os.cpu_count()} CPUs, "
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
        if cuda:
            rows = [[t, f"{name} ({r[name]['path']})", r[name]["writes64_per_s"] / 1e6,
                     r[name]["writes64_per_lane_wait"]]
                    for t, r in results.items() for name in ("self", "peer")]  # fmt: skip
            print(scaffold.table(
                rows, ["transport", "to", "64 B writes M/s", "writes per lane wait"],
                floatfmt=".2f",
            ))  # fmt: skip
            r = results["auto"]
            print(
                f"baseline: host-mapped flag ping-pong (kernel thread <-> host thread) median "
                f"{r['mapped_ping_pong_median_us']:.2f} us, p99 {r['mapped_ping_pong_p99_us']:.2f} us"
            )
        rows = []
        for i, size in enumerate(sizes if not cuda else []):
            rows.append([scaffold.format_size(size)]
                        + [results[t]["write"][i]["gbps"] for t in results]
                        + [raw[i]])  # fmt: skip
        if rows:
            print(scaffold.table(
                rows, ["write size"] + [f"{t} ({results[t]['peer']['path']}) GB/s"
                                        for t in results] + ["raw socket GB/s"],
                floatfmt=".3f",
            ))  # fmt: skip
        if args.json:
            scaffold.write_json(args.json, {"machine": scaffold.machine(), "results": results,
                                            "raw_socket_gbps": dict(zip(map(str, sizes), raw, strict=True))})  # fmt: skip
    shmem.finalize(force=True)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if scaffold.run_or_launch("mori.core.bench_proxy", argv, args, worker, args.world_size):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
