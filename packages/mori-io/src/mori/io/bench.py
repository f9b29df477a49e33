# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Transfer-engine benchmark with MORI's flags, beside the limit measured in the same run.

    python -m mori.io.bench [--op-type read|write] [--buffer-size 1M]
                            [--transfer-batch-size 1] [--enable-batch-transfer]
                            [--enable-sess] [--num-qp-per-transfer 2]
                            [--num-worker-threads 1] [--disable-chunking]
                            [--num-initiator-dev 1] [--num-target-dev 1]
                            [--all --sweep-start-size 1K --sweep-max-size 16M]
                            [--iters 128] [--reps 1] [--preset mw-chunkoff|mw-chunkon|hi-iops]
                            [--json PATH] [--plot out.png]
    python -m mori.io.bench --ablate [--ablate-reps 5] [--ablate-backends tcp,shm-cma,shm-map]
                            [--ablate-presets mw-chunkoff,mw-chunkon,hi-iops] [--json PATH]
                            [--ablate-deadline-s SECONDS]

Rank 0 is the initiator, rank 1 the target. Run as is (two processes on this host)
or under torchrun with two processes (``--host`` names the address the other host
reaches this one at). Each iteration submits ``--transfer-batch-size`` transfers of
``--buffer-size`` bytes (one batch call with ``--enable-batch-transfer``, through a
session with ``--enable-sess``) and waits for all of them; its latency is one sample.
MaxBW/AvgBW are TotalSize over the min/mean latency (GB/s = 1e9 B/s); Xfer/s counts
transfers; CPU us/xfer is each process's CPU time (all threads, ``time.process_time``)
over the timed iterations divided by the transfers. With ``--reps N`` the whole
measurement repeats N times and each figure is shown as mean±stdev.

The limit, measured at each size right after the engine: ``RawBW`` streams the same
messages over a loopback TCP connection between two native threads with blocking
send/recv (``mori.io._C.raw_socket_stream``); ``RawAckBW`` waits for a one-byte
answer after each message (one round trip per message, the pattern of a single
acknowledged write). ``%Raw`` is AvgBW / RawBW. With ``--backend shm`` the limit is
a native memcpy of the same size in one process (``mori.io._C.memcpy_stream``):
``RawBW`` is then that memcpy bandwidth and ``RawAckBW`` is not measured. With
``--backend p2p`` (GPU memory; the initiator on GPU 0, the target on GPU 1 when there
is one) the limit is a native copy of each iteration's bytes, as one copy, between the
first lane's two GPUs in the initiator's process (``mori.io._C.cuda_copy_seconds``):
``cudaMemcpyPeerAsync`` when they are two GPUs, a same-device ``cudaMemcpyAsync``
(device to device) when both engines are on one GPU, where no peer link is involved.
The table's RawBW header names which. ``RawBW`` streams the iterations' copies with
one synchronisation at the end, ``RawAckBW`` synchronises after each iteration, as the
engine's loop waits for its statuses. ``%Ack`` is AvgBW / RawAckBW. The JSON rows also
hold ``raw_per_copy_bw``: one copy call per transfer, the runtime's call rate at small
sizes rather than a limit.

``--preset`` runs one of MORI's three regimes for CPU-overhead changes (``PRESETS``
holds their argument vectors); flags given beside it win over the preset's values.

``--ablate`` turns each hot-path switch of the engine off alone and all together, beside
the defaults, in interleaved repetitions on one point of each preset, and prints the
table and the keep/remove verdicts (``mori.io.bench_ablation`` says how).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import struct
import sys
import time
from typing import NamedTuple

from mori.core import bench as scaffold
from mori.core import env
from mori.io import bench_ablation
from mori.io.bench_presets import PRESETS, expand_preset

CHILD_ENV = "MORI_IO_BENCH_CHILD"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mori.io.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", choices=sorted(PRESETS),
        help="MORI's regimes: their arguments are read before the command line's, so a "
        "flag given there still wins",
    )  # fmt: skip
    p.add_argument(
        "--backend", default="tcp", choices=["tcp", "shm", "p2p", "xgmi"],
        help="tcp, shm (same host, CMA) or p2p (alias xgmi: same host, GPU memory, CUDA "
        "IPC); checked to be the backend actually chosen",
    )  # fmt: skip
    p.add_argument("--op-type", default="write", choices=["read", "write"])
    p.add_argument(
        "--buffer-size", type=scaffold.parse_size, default=1 << 20, help="bytes per transfer"
    )
    p.add_argument("--transfer-batch-size", type=int, default=1, help="transfers per iteration")
    p.add_argument("--enable-batch-transfer", action="store_true", help="one batch call")
    p.add_argument("--enable-sess", action="store_true", help="transfer through a session")
    p.add_argument(
        "--num-qp-per-transfer", type=int, default=2,
        help="MORI: RDMA queue pairs per transfer; here the TCP backend's connections per "
        "peer (shm and p2p copy without them: p2p's streams are --p2p-num-streams)",
    )  # fmt: skip
    p.add_argument(
        "--num-worker-threads", type=int, default=1,
        help="MORI: the RDMA backend's worker threads; here the TCP backend's epoll "
        "reactors (shm and p2p copy without them)",
    )  # fmt: skip
    p.add_argument(
        "--disable-chunking", action="store_true",
        help="one part per transfer (TCP: chunking splits transfers into --chunk-size parts)",
    )  # fmt: skip
    p.add_argument(
        "--chunk-size", "--chunk-bytes", dest="chunk_size", type=scaffold.parse_size,
        default=1 << 20,
        help="bytes per part when chunking (--chunk-bytes: MORI's name)",
    )  # fmt: skip
    p.add_argument(
        "--sock-buf-bytes", type=scaffold.parse_size, default=0, help="0: kernel autotuning"
    )
    p.add_argument(
        "--num-initiator-dev", type=int, default=1,
        help="buffers (GPUs with --backend p2p: cuda:0..N-1) the initiator spreads transfers over",
    )  # fmt: skip
    p.add_argument(
        "--num-target-dev", type=int, default=1,
        help="buffers of the target (GPUs with p2p: the next M GPUs, modulo the count)",
    )  # fmt: skip
    p.add_argument(
        "--host-alloc", choices=["numpy", "shared"], default="numpy",
        help="host buffers: numpy arrays (SHM copies with CMA) or allocate_shared_host_memory "
        "(SHM maps the target's region and copies with memcpy)",
    )  # fmt: skip
    p.add_argument("--p2p-max-blocks", type=int, default=64, help="SMs of a P2P batch kernel")
    p.add_argument("--p2p-num-streams", type=int, default=4, help="P2P copy streams per GPU")
    p.add_argument("--all", action="store_true", help="sweep the message size (powers of 2)")
    p.add_argument("--sweep-start-size", type=scaffold.parse_size, default=8)
    p.add_argument("--sweep-max-size", type=scaffold.parse_size, default=1 << 20)
    p.add_argument("--iters", type=int, default=128, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=8, help="untimed iterations per size")
    p.add_argument("--reps", type=int, default=1, help="repetitions (mean and stdev)")
    p.add_argument(
        "--offsets-as",
        choices=["array", "list"],
        default="array",
        help="how batch offsets/sizes are passed (numpy arrays or lists)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the raw socket stream")
    p.add_argument("--host", help="address this engine listens on (default: loopback if local)")
    scaffold.add_output_args(
        p, json_help="write config, machine and rows here",
        plot_help="write a bandwidth plot here (needs matplotlib)",
    )  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=600.0, help="bound on the whole run")
    bench_ablation.add_arguments(p)
    return p


def _is_p2p(args) -> bool:
    return args.backend in ("p2p", "xgmi")


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    pre, _ = parser.parse_known_args(argv)
    args = parser.parse_args(expand_preset(pre.preset) + argv)
    if args.transfer_batch_size < 1 or args.iters < 1 or args.reps < 1:
        parser.error("--transfer-batch-size, --iters and --reps must be >= 1")
    if args.num_initiator_dev < 1 or args.num_target_dev < 1:
        parser.error(
            f"--num-initiator-dev {args.num_initiator_dev} / --num-target-dev "
            f"{args.num_target_dev}: each must be >= 1"
        )
    return args


def sizes_of(args) -> list[int]:
    if not args.all:
        return [args.buffer_size]
    out, s = [], max(1, args.sweep_start_size)
    while s <= args.sweep_max_size:
        out.append(s)
        s *= 2
    return out


# -- measurement ----------------------------------------------------------------------


def _engine(args, rank: int):
    from mori.io import BackendType, IOEngine, IOEngineConfig, P2pBackendConfig, TcpBackendConfig

    host = args.host
    if host is None:
        local = env.get_str("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost")
        host = "127.0.0.1" if local else _routable_address()
    eng = IOEngine(f"bench-{'initiator' if rank == 0 else 'target'}", IOEngineConfig(host, 0))
    cfg = TcpBackendConfig(
        num_worker_threads=args.num_worker_threads,
        qp_per_transfer=args.num_qp_per_transfer,
        enable_chunking=not args.disable_chunking,
        chunk_size=args.chunk_size,
        sock_buf_bytes=args.sock_buf_bytes,
    )
    eng.create_backend(BackendType.TCP, cfg)
    if args.backend == "shm":
        eng.create_backend(BackendType.SHM)
    if _is_p2p(args):
        eng.create_backend(
            BackendType.P2P,
            P2pBackendConfig(num_streams=args.p2p_num_streams, max_blocks=args.p2p_max_blocks),
        )
    return eng


def _routable_address() -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((env.get_str("MASTER_ADDR", "127.0.0.1"), 1))  # no packet is sent
        return s.getsockname()[0]


def lanes_of(batch: int, n_init: int, n_target: int) -> dict[tuple[int, int], list[int]]:
    """Transfer j of an iteration goes from initiator buffer j % n_init to target buffer
    j % n_target at offset j * size in both: {(initiator buffer, target buffer): [j...]}."""
    lanes: dict[tuple[int, int], list[int]] = {}
    for j in range(batch):
        lanes.setdefault((j % n_init, j % n_target), []).append(j)
    return lanes


def _issue_lanes(args, eng, lanes, size):
    """One iteration over every (local, remote) lane; returns all statuses."""
    out = []
    for local, remote, sess, offsets in lanes:
        out += _issue(args, eng, sess, local, remote, size, offsets)
    return out


def _issue(args, eng, sess, local, remote, size, offsets):
    """One iteration: submit the batch and return its statuses."""
    write = args.op_type == "write"
    n = len(offsets)
    if args.enable_batch_transfer:
        uid = eng.allocate_transfer_uid()
        sizes = _sizes(size, n, type(offsets))
        if sess is not None:
            f = sess.batch_write if write else sess.batch_read
            return [f(offsets, offsets, sizes, uid)]
        f = eng.batch_write if write else eng.batch_read
        return [f(local, offsets, remote, offsets, sizes, uid)]
    if sess is not None:
        f = sess.write if write else sess.read
        return [f(o, o, size, eng.allocate_transfer_uid()) for o in offsets]
    f = eng.write if write else eng.read
    return [f(local, o, remote, o, size, eng.allocate_transfer_uid()) for o in offsets]


_SIZES: dict = {}


def _sizes(size: int, n: int, kind: type):
    key = (size, n, kind)
    if key not in _SIZES:
        if kind is list:
            _SIZES[key] = [size] * n
        else:
            import numpy as np

            _SIZES[key] = np.full(n, size, np.uint64)
    return _SIZES[key]


def _unpack_descs(blob: bytes, cls) -> list:
    """Descriptors packed back to back, each after its 4-byte little-endian length."""
    out, i = [], 0
    while i < len(blob):
        n = int.from_bytes(blob[i : i + 4], "little")
        out.append(cls.unpack(blob[i + 4 : i + 4 + n]))
        i += 4 + n
    return out


def _wait(statuses) -> None:
    from mori.io import StatusCode

    for s in statuses:
        if s.WaitFor(30000) == StatusCode.IN_PROGRESS:
            raise TimeoutError("a transfer did not finish within 30 s")
        if not s.Succeeded():
            raise RuntimeError(f"transfer failed: {s.Code().name}: {s.Message()}")


def _raw(size: int, count: int, ack: bool, sock_buf_bytes: int) -> float:
    from mori.io import _C

    r = _C.raw_socket_stream(size, count, ack, sock_buf_bytes)
    return r["bytes"] / r["seconds"] / 1e9


def _memcpy(size: int, count: int) -> float:
    from mori.io import _C

    r = _C.memcpy_stream(size, count)
    return r["bytes"] / r["seconds"] / 1e9


class Baseline(NamedTuple):
    """The limit a run is judged by: ``kind`` for programs, ``label`` for the table
    header and the plot, ``detail`` for the line printed above the table."""

    kind: str
    label: str
    detail: str


def baseline_of(backend: str, src_gpu: int | None = None, dst_gpu: int | None = None) -> Baseline:
    """The limit of ``backend``; for p2p (alias xgmi) that of a copy from GPU ``src_gpu``
    to GPU ``dst_gpu``. Both on one GPU, no peer link is involved: the limit is a
    same-device copy, and a peer-copy label would compare unlike things."""
    if backend in ("p2p", "xgmi"):
        if src_gpu == dst_gpu:
            return Baseline(
                "same_device_copy", "same-device D2D copy",
                f"cudaMemcpyAsync device to device on cuda:{src_gpu} (initiator and target "
                "buffers on one GPU)",
            )  # fmt: skip
        return Baseline(
            "peer_copy", "cudaMemcpyPeerAsync",
            f"cudaMemcpyPeerAsync cuda:{src_gpu} -> cuda:{dst_gpu}, peer access enabled",
        )  # fmt: skip
    if backend == "shm":
        return Baseline("memcpy", "memcpy", "memcpy between two buffers of one process")
    return Baseline(
        "tcp_stream", "loopback TCP stream",
        "blocking send/recv over a loopback TCP connection between two native threads",
    )  # fmt: skip


def p2p_copy_pair(op_type: str, n_init: int, ngpu: int) -> tuple[int, int]:
    """(source GPU, destination GPU) of the first lane's transfers, whose copy is the P2P
    run's limit: the initiator's first buffer is on cuda:0, the target's on
    cuda:(n_init % ngpu) (run_worker's placement); writes move initiator -> target."""
    initiator, target = 0, n_init % ngpu
    return (initiator, target) if op_type == "write" else (target, initiator)


def gpu_copy_limit(
    size: int, batch: int, iters: int, src_gpu: int, dst_gpu: int, copy_seconds=None
) -> dict[str, float]:
    """The P2P limit in GB/s, measured with native copies from ``src_gpu`` to ``dst_gpu``
    (``copy_seconds``: ``mori.io._C.cuda_copy_seconds`` unless given).

    Each round moves the iteration's ``batch`` x ``size`` bytes as one copy (the
    transfers cover one contiguous range): ``raw_bw`` streams the rounds with one
    synchronisation at the end, ``raw_ack_bw`` synchronises after each, as the engine's
    loop waits for its statuses. With ``batch`` > 1, ``raw_per_copy_bw`` issues one
    copy per transfer instead: at small sizes that times the runtime's cost per call
    (a few microseconds), not the GPU, which is why it is no limit for a batch kernel."""
    if copy_seconds is None:
        from mori.io import _C

        copy_seconds = _C.cuda_copy_seconds
    total = size * batch
    count = max(iters, (256 << 20) // total)
    out = {
        "raw_bw": total * count / copy_seconds(src_gpu, dst_gpu, size, batch, count, False, False),
        "raw_ack_bw": total * iters / copy_seconds(src_gpu, dst_gpu, size, batch, iters, True, False),
    }  # fmt: skip
    if batch > 1:
        sec = copy_seconds(src_gpu, dst_gpu, size, batch, iters, False, True)
        out["raw_per_copy_bw"] = total * iters / sec
    return {k: v / 1e9 for k, v in out.items()}


def run_worker(args) -> list[dict] | None:
    """Both ranks call this; rank 0 returns the rows, rank 1 None."""
    import numpy as np

    from mori.core.bootstrap import TcpBootstrap
    from mori.io import EngineDesc, MemoryDesc

    bs = TcpBootstrap.from_env()
    if bs.world_size != 2:
        raise SystemExit(f"mori.io.bench needs 2 processes, got {bs.world_size}")
    rank = bs.rank
    sizes = sizes_of(args)
    batch = args.transfer_batch_size
    eng = _engine(args, rank)
    n_init, n_target = args.num_initiator_dev, args.num_target_dev
    nbuf = n_init if rank == 0 else n_target
    bufs, mems = [], []
    baseline = baseline_of(args.backend)  # p2p: replaced once the GPUs are known
    if _is_p2p(args):
        import torch

        ngpu = torch.cuda.device_count()
        # Initiator on cuda:0..N-1, target on the next M GPUs (modulo the count).
        first = 0 if rank == 0 else n_init
        devs = [torch.device("cuda", (first + i) % ngpu) for i in range(nbuf)]
        copy_pair = p2p_copy_pair(args.op_type, n_init, ngpu)
        baseline = baseline_of(args.backend, *copy_pair)
        torch.cuda.set_device(devs[0])
        for d in devs:
            bufs.append(torch.full((max(sizes) * batch,), 0xFF, dtype=torch.uint8, device=d))
            mems.append(eng.register_torch_tensor(bufs[-1]))
    else:
        from mori.io import allocate_shared_host_memory

        for _ in range(nbuf):
            n = max(sizes) * batch
            if args.host_alloc == "shared":
                # A numpy view of it (zero-copy): the bench fills and checks with numpy.
                bufs.append(np.asarray(allocate_shared_host_memory(n)))
            else:
                bufs.append(np.zeros(n, np.uint8))
            bufs[-1].fill(0xFF)  # pages touched before the first transfer
            mems.append(eng.register_array(bufs[-1]))
    descs = bs.all_gather(eng.get_engine_desc().pack())
    all_mems = bs.all_gather(b"".join(len(m.pack()).to_bytes(4, "little") + m.pack() for m in mems))
    peer = EngineDesc.unpack(descs[1 - rank])
    eng.register_remote_engine(peer)
    remotes = _unpack_descs(all_mems[1 - rank], MemoryDesc)
    lane_js = lanes_of(batch, n_init, n_target)
    if rank == 0:
        for li, ri in lane_js:
            chosen, why = eng.backend_for(mems[li], remotes[ri])
            if chosen.lower() != ("p2p" if _is_p2p(args) else args.backend):
                raise SystemExit(
                    f"--backend {args.backend} asked, but the pair uses {chosen}: {why}"
                )

    rows = []
    sessions = {}
    if rank == 0 and args.enable_sess:
        sessions = {lane: eng.create_session(mems[lane[0]], remotes[lane[1]]) for lane in lane_js}
    for si, size in enumerate(sizes):
        lanes = []  # the initiator's (local, remote, session, offsets) per lane
        for (li, ri), js in lane_js.items() if rank == 0 else ():
            offsets = [j * size for j in js]
            if args.enable_batch_transfer and args.offsets_as == "array":
                offsets = np.asarray(offsets, np.uint64)  # read in place by the binding
            lanes.append((mems[li], remotes[ri], sessions.get((li, ri)), offsets))
        total = size * batch
        # The side that is read from (target for reads, initiator for writes) holds the
        # byte pattern; the other side checks it after the run.
        pattern = si % 251
        source = (rank == 0) == (args.op_type == "write")
        for buf in bufs:
            buf[:total] = pattern if source else 0xFF
        if _is_p2p(args):
            torch.cuda.synchronize()  # the engine's copies run on streams of their own
        bs.barrier()  # both buffers are set before the first transfer
        reps = []
        for _ in range(args.reps):
            if rank == 0:
                for _ in range(args.warmup):
                    _wait(_issue_lanes(args, eng, lanes, size))
            bs.barrier()
            cpu0 = time.process_time()
            lat, issue = [], []
            if rank == 0:
                for _ in range(args.iters):
                    t0 = time.perf_counter()
                    statuses = _issue_lanes(args, eng, lanes, size)
                    t1 = time.perf_counter()
                    _wait(statuses)
                    lat.append(time.perf_counter() - t0)
                    issue.append(t1 - t0)
                cpu = time.process_time() - cpu0
            bs.barrier()
            if rank != 0:
                cpu = time.process_time() - cpu0  # the target's window ends at the barrier
            cpu_target = struct.unpack("d", bs.all_gather(struct.pack("d", cpu))[1])[0]
            if rank != 0:
                continue
            n = args.iters * batch
            rep = {
                "max_bw": total / min(lat) / 1e9,
                "avg_bw": total / statistics.fmean(lat) / 1e9,
                "min_lat_us": min(lat) * 1e6,
                "avg_lat_us": statistics.fmean(lat) * 1e6,
                "p50_lat_us": statistics.median(lat) * 1e6,
                "p99_lat_us": sorted(lat)[min(len(lat) - 1, (99 * len(lat)) // 100)] * 1e6,
                # Time in the issuing calls (Python, submission, copies launched): the
                # rest of AvgLat is the transfer and its completion reaching the waiter.
                "issue_us": statistics.fmean(issue) * 1e6,
                "xfer_per_s": n / sum(lat),
                "cpu_us_init": cpu / n * 1e6,
                "cpu_us_target": cpu_target / n * 1e6,
            }
            if not args.no_baseline and _is_p2p(args):
                rep.update(gpu_copy_limit(size, batch, args.iters, *copy_pair))
                rep["pct_raw"] = 100.0 * rep["avg_bw"] / rep["raw_bw"]
            elif not args.no_baseline and args.backend == "shm":
                count = min(max(n, (256 << 20) // size), 200_000)
                rep["raw_bw"] = _memcpy(size, count)
                rep["pct_raw"] = 100.0 * rep["avg_bw"] / rep["raw_bw"]
            elif not args.no_baseline:
                # At least 32 MiB per stream so small sizes are not timed on a handful
                # of messages; the acked variant is one round trip per message, so fewer.
                count = min(max(n, (32 << 20) // size), 200_000)
                rep["raw_bw"] = _raw(size, count, False, args.sock_buf_bytes)
                rep["raw_ack_bw"] = _raw(
                    size, min(max(n, (8 << 20) // size), 4000), True, args.sock_buf_bytes
                )
                rep["pct_raw"] = 100.0 * rep["avg_bw"] / rep["raw_bw"]
            if rep.get("raw_ack_bw"):
                rep["pct_raw_ack"] = 100.0 * rep["avg_bw"] / rep["raw_ack_bw"]
            reps.append(rep)
        # Every transfer's destination range holds the pattern (its buffer: its lane's).
        for (li, ri), js in lane_js.items():
            buf = bufs[li if rank == 0 else ri]
            for j in js:
                if not bool((buf[j * size : (j + 1) * size] == pattern).all()):
                    raise RuntimeError(
                        f"size {size}, transfer {j}: bytes at the destination differ from the source"
                    )
        bs.barrier()
        if rank == 0:
            row = {"msg_size": size, "batch_size": batch, "total_size": total}
            for k in reps[0]:
                vals = [r[k] for r in reps]
                row[k] = statistics.fmean(vals)
                row[k + "_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
            if "raw_bw" in row:
                row["baseline"], row["baseline_kind"] = baseline.label, baseline.kind
                row["baseline_detail"] = baseline.detail
            rows.append(row)
    bs.barrier()
    if env.get("MORI_TELEMETRY"):
        # Scoped timers of both processes, printed by rank 0 (MORI_TELEMETRY=io).
        from mori.core import telemetry

        mine = json.dumps(telemetry.stats()).encode()
        both = [json.loads(b) for b in bs.all_gather(mine)]
        if rank == 0:
            for who, stats in zip(("initiator", "target"), both, strict=True):
                for t in stats:
                    if t["count"]:
                        print(f"telemetry {who:9s} {t['name']:24s} n={t['count']:<9d} "
                              f"mean={t['mean_ns'] / 1e3:9.2f} us total={t['total_ns'] / 1e6:9.2f} ms")  # fmt: skip
    return rows if rank == 0 else None


# -- output -----------------------------------------------------------------------------

COLUMNS = [
    ("MsgSize", "msg_size", "size"),
    ("BatchSize", "batch_size", "int"),
    ("TotalSize", "total_size", "size"),
    ("MaxBW(GB/s)", "max_bw", ".3f"),
    ("AvgBW(GB/s)", "avg_bw", ".3f"),
    ("MinLat(us)", "min_lat_us", ".1f"),
    ("AvgLat(us)", "avg_lat_us", ".1f"),
    ("P50Lat(us)", "p50_lat_us", ".1f"),
    ("P99Lat(us)", "p99_lat_us", ".1f"),
    ("Issue(us)", "issue_us", ".1f"),
    ("Xfer/s", "xfer_per_s", ",.0f"),
    ("CPU us/xfer init", "cpu_us_init", ".2f"),
    ("CPU us/xfer target", "cpu_us_target", ".2f"),
    ("RawBW(GB/s)", "raw_bw", ".3f"),
    ("RawAckBW(GB/s)", "raw_ack_bw", ".3f"),
    ("%Raw", "pct_raw", ".0f"),
    ("%Ack", "pct_raw_ack", ".0f"),
]


def format_table(rows: list[dict], reps: int) -> str:
    from tabulate import tabulate

    cols = [c for c in COLUMNS if rows and c[1] in rows[0]]
    label = rows[0].get("baseline") if rows else None
    headers = [f"{h} [{label}]" if key == "raw_bw" and label else h for h, key, _ in cols]
    body = []
    for r in rows:
        line = []
        for _, key, fmt in cols:
            v = r[key]
            if fmt == "size":
                line.append(scaffold.format_size(v))
            elif fmt == "int":
                line.append(str(v))
            elif reps > 1:
                line.append(f"{v:{fmt}}±{r[key + '_sd']:{fmt}}")
            else:
                line.append(f"{v:{fmt}}")
        body.append(line)
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def describe(args) -> str:
    mode = "batch" if args.enable_batch_transfer else "single"
    return (
        f"mori.io.bench: backend={args.backend} op={args.op_type} {mode}"
        f"{' session' if args.enable_sess else ''} batch={args.transfer_batch_size} "
        f"workers={args.num_worker_threads} qp={args.num_qp_per_transfer} "
        f"chunking={'off' if args.disable_chunking else scaffold.format_size(args.chunk_size)} "
        f"iters={args.iters} reps={args.reps}"
        f"{' preset=' + args.preset if args.preset else ''}"
    )


def write_plot(rows: list[dict], path: str) -> None:
    plt = scaffold.pyplot(path)
    if plt is None:
        return
    x = [r["total_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar(x, [r["avg_bw"] for r in rows], yerr=[r["avg_bw_sd"] for r in rows],
                marker="o", label="mori.io AvgBW")  # fmt: skip
    what = f" ({rows[0]['baseline']})" if rows[0].get("baseline") else ""
    if "raw_bw" in rows[0]:
        ax.plot(x, [r["raw_bw"] for r in rows], "k--", label=f"RawBW{what}: limit, streamed")
    if "raw_ack_bw" in rows[0]:
        ax.plot(
            x,
            [r["raw_ack_bw"] for r in rows],
            "k:",
            label=f"RawAckBW{what}: limit, one wait per iteration",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per iteration")
    ax.set_ylabel("GB/s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def report(args, rows: list[dict]) -> None:
    m = scaffold.machine()
    print(describe(args))
    print(f"machine: {m['cpu']}, {m['cores']} cores, Linux {m['kernel']}")
    if rows and rows[0].get("baseline"):
        print(f"RawBW: {rows[0]['baseline']}: {rows[0]['baseline_detail']}")
    print(format_table(rows, args.reps))
    if args.json:
        doc = {
            "benchmark": "mori.io.bench",
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "config": vars(args),
            "preset_argv": expand_preset(args.preset),
            "machine": m,
            "rows": rows,
        }
        scaffold.write_json(args.json, doc, note="json written to {}")
    if args.plot:
        write_plot(rows, args.plot)


def main(argv=None) -> int:
    args = parse_args(argv)
    if scaffold.replot(args, lambda doc, path: write_plot(doc["rows"], path)):
        return 0
    if args.ablate:
        return bench_ablation.main(args)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not scaffold.is_rank() and CHILD_ENV not in os.environ:
        return scaffold.launch_ranks("mori.io.bench", argv, 2, args.timeout_s, {CHILD_ENV: "1"})
    rows = run_worker(args)
    if rows is not None:
        report(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
