# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The inter-node kernel types in ``python -m mori.ep.bench``: emulated nodes, the
op's byte counts, and the raw transport figure of the same run, on host heaps (the CPU
implementation) and on CUDA heaps (the kernels pushing into the proxy's queues).

Nodes: ``--gpu-per-node L`` puts rank ``r`` on node ``r // L``
(``MORI_SHMEM_NODE_ID``), so the heap maps only a node's own ranks and every byte to
another node goes through the op's proxy; ``--proxy-transport tcp`` (the default)
forces the proxy's TCP transport (``MORI_PROXY_TRANSPORT``).

The raw figures, between the same processes, moving the same bytes the op put on its
inter-node link in the phase (``link_token + link_meta + link_signal`` of
``op._mode.bytes(phase)``), each rank's bytes split evenly over the ranks of the other
nodes, every rank sending and receiving at once, timed like the op on CPU (barrier,
wall clock, median of ``--iters``):

- ``raw``: a plain TCP stream (one loopback connection per pair of ranks on different
  nodes, set up once, ``TCP_NODELAY``; a sender and a receiver thread per peer) from a
  source buffer of the share's size into a destination buffer of that size, as the op
  reads its rows from the input and lands them in its receive buffers. On CUDA both
  buffers are in GPU memory and the stream is staged through pinned host memory, as
  the proxy's TCP path stages: 1 MiB chunks, each copied GPU -> pinned before it is
  sent and pinned -> GPU after it arrived (``raw_host``: the same stream between host
  buffers, the CPU figure).
- ``raw_block``: the same stream sending one 1 MiB block over and over and receiving
  into one 1 MiB buffer (the bench's first raw figure): both stay in the CPU's caches,
  so on a machine with little memory bandwidth it is faster than any transfer whose
  bytes come from and go to memory; kept for comparison.
- ``mori_io``: mori-io's TCP batch (``IOEngine.batch_write`` over its TCP backend, one
  batch per peer from a registered source buffer into the peer's registered
  destination buffer, waiting for every status), when mori-io is installed; timed with
  transfers of the op's token row size (``mori_io_row``) and with one transfer per
  peer (``mori_io_one``); ``mori_io`` is the faster of the two. On CUDA the buffers are
  GPU memory (mori-io's TCP backend stages them through its pinned buffers), unless a
  probe at set-up fails on some rank (then host buffers; ``mori_io_memory`` says which).
- ``copy``: one copy of the same bytes within this rank's memory (``copy_floor_us``: on
  CUDA ``Floors.copy_us``, a device-to-device ``copy_`` in a graph, GPU time; on CPU the
  fastest of a few wall-clock copies): the floor of moving them.

On CUDA the calls run eagerly (graph replays of them are checked in
test_internode_gpu.py; the bench times each call on its own, so nothing holds the CUDA
context while the kernels wait for the proxy), each followed by a stream synchronisation (``timing.eager_times``): ``us`` are CUDA
events around each call, ``kern us`` the kernels' GPU time (profiler). Processes that
share one GPU time-slice it and their proxies move bytes between them through its
memory or loopback TCP: those figures measure the proxy's overhead and the kernels'
correctness, not a NIC; no all_to_all baseline runs there (NCCL cannot put two ranks on
one GPU; gloo over host copies would not be a GPU baseline). With a GPU per process
the NCCL all_to_all baseline of the intra-node rows runs as well.

``op / raw`` = raw us / op us: the share of the raw rate that the op reaches with the
whole call counted (count exchange, local copies, the reduction, the proxy) against
the bare transport. ``leg``: the op's inter-node leg alone (``link_leg_us``: the link
commands of the call replayed through the same link: the proxy's staging copy, its
commands and thread, the TCP transport), ``leg / x`` = x us / leg us: the share of the
baseline's rate the leg reaches, which is what "the proxy costs <= 20 %" measures.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

INTERNODE = ("InterNode", "InterNodeV1", "InterNodeV1LL")
CHUNK = 1 << 20


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise RuntimeError("bench: a raw stream peer closed during set-up")
        buf += got
    return buf


def link_bytes(b: dict) -> int:
    """Bytes one rank put on its inter-node link in one phase (payload, metadata and
    signals), from ``op._mode.bytes(phase)``."""
    return b["link_token"] + b["link_meta"] + b["link_signal"]


class RawMesh:
    """One TCP connection per pair of ranks on different nodes (``node_of(r)``),
    collective: ports are exchanged with torch.distributed's gloo group."""

    def __init__(self, rank: int, world: int, node_of, timeout_s: float = 120.0) -> None:
        import torch.distributed as dist

        self.rank, self.world = rank, world
        self.peers = [p for p in range(world) if node_of(p) != node_of(rank)]
        listener = socket.create_server(("127.0.0.1", 0), backlog=max(1, world))
        listener.settimeout(timeout_s)
        ports = [None] * world
        dist.all_gather_object(ports, listener.getsockname()[1])
        self.conns: dict[int, socket.socket] = {}
        # The lower rank connects, the higher accepts (and learns who from a 4-byte id).
        for p in self.peers:
            if p > rank:
                c = socket.create_connection(("127.0.0.1", ports[p]), timeout=timeout_s)
                c.sendall(rank.to_bytes(4, "little"))
                self.conns[p] = c
        for _ in (p for p in self.peers if p < rank):
            c, _ = listener.accept()
            c.settimeout(timeout_s)
            self.conns[int.from_bytes(_recv_exact(c, 4), "little")] = c
        listener.close()
        for c in self.conns.values():
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.block = bytes(CHUNK)
        self.sink = bytearray(CHUNK)
        self.device = None
        self.src: dict[int, bytearray] = {}
        self.dst: dict[int, bytearray] = {}

    def buffers(self, send: dict[int, int], recv: dict[int, int], device=None) -> None:
        """Source and destination buffers of the shares' sizes, pages touched; with a
        CUDA ``device``: GPU buffers and a pinned 1 MiB staging chunk per peer and
        direction (``exchange`` then stages through them)."""
        self.device = device
        if device is None:
            self.src = {p: bytearray(b"\x5a" * n) for p, n in send.items()}
            self.dst = {p: bytearray(b"\x00" * n) for p, n in recv.items()}
            return
        import torch

        def pinned(n):
            return torch.empty(max(1, min(n, CHUNK)), dtype=torch.uint8, pin_memory=True)

        self.src = {p: torch.full((n,), 0x5A, dtype=torch.uint8, device=device)
                    for p, n in send.items()}  # fmt: skip
        self.dst = {p: torch.zeros(n, dtype=torch.uint8, device=device) for p, n in recv.items()}
        self.stage_out = {p: pinned(n) for p, n in send.items()}
        self.stage_in = {p: pinned(n) for p, n in recv.items()}

    def exchange(self, send: dict[int, int], recv: dict[int, int], block: bool = False) -> None:
        """Send ``send[p]`` bytes to and receive ``recv[p]`` bytes from every peer at once:
        from/into the buffers of ``buffers`` (``block``: one 1 MiB block and sink)."""
        errors: list[BaseException] = []

        def run(fn, *a):
            try:
                fn(*a)
            except BaseException as e:  # re-raised below, on the calling thread
                errors.append(e)

        threads = [threading.Thread(target=run, args=(self._send, p, n, block))
                   for p, n in send.items() if n]  # fmt: skip
        threads += [threading.Thread(target=run, args=(self._recv, p, n, block))
                    for p, n in recv.items() if n]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _send(self, peer: int, n: int, block: bool) -> None:
        if not block and self.device is not None:
            # GPU -> pinned chunk -> socket (a synchronous copy_ of each chunk).
            src, stage = self.src[peer], self.stage_out[peer]
            view = memoryview(stage.numpy())
            for at in range(0, n, CHUNK):
                k = min(CHUNK, n - at)
                stage[:k].copy_(src[at : at + k])
                self.conns[peer].sendall(view[:k])
            return
        if not block:
            self.conns[peer].sendall(memoryview(self.src[peer])[:n])
            return
        view = memoryview(self.block)
        while n:
            k = min(n, CHUNK)
            self.conns[peer].sendall(view[:k])
            n -= k

    def _recv(self, peer: int, n: int, block: bool) -> None:
        if not block and self.device is not None:
            # socket -> pinned chunk -> GPU.
            dst, stage = self.dst[peer], self.stage_in[peer]
            view = memoryview(stage.numpy())
            for at in range(0, n, CHUNK):
                k, got = min(CHUNK, n - at), 0
                while got < k:
                    r = self.conns[peer].recv_into(view[got:k])
                    if not r:
                        raise RuntimeError(f"bench: raw stream from rank {peer} closed early")
                    got += r
                dst[at : at + k].copy_(stage[:k])
            return
        view = memoryview(self.dst[peer] if not block else bytearray(min(n, CHUNK)))
        at = 0
        while n:
            k = min(n, len(view) - at)
            got = self.conns[peer].recv_into(view[at : at + k])
            if not got:
                raise RuntimeError(f"bench: raw stream from rank {peer} closed early")
            n -= got
            at = 0 if block else at + got

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()


def shares(ctx, nbytes: int) -> tuple[dict[int, int], dict[int, int]]:
    """Every rank's ``nbytes`` split evenly over its peers on other nodes: (what this
    rank sends to each peer, what it receives from each). Collective."""
    import torch.distributed as dist

    every = [None] * ctx.world
    dist.all_gather_object(every, nbytes)

    def share(src: int, dst: int) -> int:
        peers = [p for p in range(ctx.world) if ctx.node_of(p) != ctx.node_of(src)]
        if dst not in peers:
            return 0
        q, r = divmod(every[src], len(peers))
        return q + (1 if peers.index(dst) < r else 0)

    peers = [p for p in range(ctx.world) if ctx.node_of(p) != ctx.node_of(ctx.rank)]
    return ({p: share(ctx.rank, p) for p in peers}, {p: share(p, ctx.rank) for p in peers})


def timed_us(fn, iters: int) -> float:
    """Median wall-clock us of ``fn()`` over ``iters`` calls after a warm-up call, each
    started after a barrier, and a barrier after the last: a rank whose own sends of the
    last call finished goes on only once every peer's sends into it have too. Collective."""
    import torch.distributed as dist

    times = []
    for i in range(iters + 1):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        if i:  # the first call warms the connections
            times.append((time.perf_counter() - t0) * 1e6)
    dist.barrier()
    return statistics.median(times)


def raw_stream_us(
    ctx, mesh: RawMesh, nbytes: int, iters: int, block: bool = False, device=None
) -> float:
    """Median wall-clock us of one exchange in which every rank streams its ``nbytes``
    (split evenly over its peers on other nodes) while receiving the others' shares
    (``block``: the 1 MiB block stream; ``device``: GPU buffers staged through pinned
    chunks). Collective."""
    send, recv = shares(ctx, nbytes)
    if not block:
        mesh.buffers(send, recv, device)
    return timed_us(lambda: mesh.exchange(send, recv, block), iters)


def copy_floor_us(ctx, nbytes: int, iters: int) -> float:
    """us of one copy of ``nbytes`` in this rank's memory: on CUDA the GPU time of a
    device-to-device copy (``Floors.copy_us``); on CPU the fastest of ``max(5, iters)``
    wall-clock single-threaded copies (numpy: torch's CPU copy splits across threads,
    which other ranks' and proxies' threads hold on a small machine)."""
    if ctx.cuda:
        return ctx.floors.copy_us(nbytes)
    import numpy as np

    src = np.full(max(nbytes, 1), 0x5A, np.uint8)
    dst = np.zeros_like(src)
    times = []
    for _ in range(max(5, iters)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append((time.perf_counter() - t0) * 1e6)
    return min(times)


def link_leg_us(ctx, op, phase: str, iters: int) -> float | None:
    """Median wall-clock us of the op's inter-node leg alone: the link writes and
    signals of its last ``phase`` call replayed (``InterNodeCpu.replay_link``: the
    proxy's staging, its commands and the TCP transport, from a barrier until
    everything landed everywhere). Collective; leaves scratch bytes in the op's
    buffers (the timed calls are done)."""
    impl = op._mode.impl
    if not hasattr(impl, "replay_link"):
        return None
    times = [impl.replay_link(phase) * 1e6 for _ in range(iters + 1)]
    return statistics.median(times[1:])


class MoriIoTcp:
    """mori-io's TCP backend between the ranks of different nodes: an IOEngine per rank
    (collective: engine and memory descriptors are exchanged over torch.distributed).
    ``MoriIoTcp.create`` returns None where mori-io is not installed."""

    @classmethod
    def create(cls, ctx):
        try:
            import mori.io  # noqa: F401
        except ImportError:
            return None
        try:
            ok, io = True, cls(ctx)
        except Exception as e:  # noqa: BLE001 - a missing baseline must not stop the bench
            print(f"rank {ctx.rank}: mori-io TCP baseline unavailable: {e}", flush=True)
            ok, io = False, None
        # Every rank uses it or none does (its set-up and timing are collective).
        import torch.distributed as dist

        every = [None] * ctx.world
        dist.all_gather_object(every, ok)
        if not all(every):
            if io is not None:
                io.close()
            return None
        io.connect()
        if ctx.cuda:
            io.probe_device()
        return io

    def __init__(self, ctx) -> None:
        from mori.io import BackendType, IOEngine, IOEngineConfig

        self.ctx = ctx
        self.peers = [p for p in range(ctx.world) if ctx.node_of(p) != ctx.node_of(ctx.rank)]
        self.eng = IOEngine(f"ep-bench-{ctx.rank}", IOEngineConfig("127.0.0.1", 0))
        self.eng.create_backend(BackendType.TCP)
        self.bufs: list = []
        self.device = None  # where prepare() puts the buffers: None = host memory

    def connect(self) -> None:
        """Registers every peer's engine. Collective."""
        import torch.distributed as dist

        from mori.io import EngineDesc

        ctx = self.ctx
        descs = [None] * ctx.world
        dist.all_gather_object(descs, self.eng.get_engine_desc().pack())
        for p in self.peers:
            self.eng.register_remote_engine(EngineDesc.unpack(descs[p]))

    def probe_device(self) -> None:
        """Use GPU buffers (mori-io's TCP backend staging them) if one small exchange
        with them succeeds on every rank, else keep host buffers. Collective."""
        import torch.distributed as dist

        self.device, ok = self.ctx.device, True
        try:
            send = {p: 4096 for p in self.peers}
            self.prepare(send, dict(send))
            self.exchange(4096, wait_ms=20000)
        except Exception as e:  # noqa: BLE001 - the baseline falls back, the bench goes on
            print(f"rank {self.ctx.rank}: mori-io TCP with GPU buffers failed ({e}); "
                  "its figure uses host buffers", flush=True)  # fmt: skip
            ok = False
        every = [None] * self.ctx.world
        dist.all_gather_object(every, ok)
        if not all(every):
            self.device = None

    def prepare(self, send: dict[int, int], recv: dict[int, int]) -> None:
        """Registered source buffers (one per peer) and destination buffers (one per
        peer), in host memory or on ``self.device``, exchanged with the peers.
        Collective."""
        import numpy as np
        import torch
        import torch.distributed as dist

        from mori.io import MemoryDesc

        for m in self.bufs:
            self.eng.deregister_memory(m)
        self.bufs = []
        mine, error = None, None
        try:  # a local failure is raised on every rank after the exchange below
            if self.device is None:
                self.src = {p: np.full(max(n, 1), 0x5A, np.uint8) for p, n in send.items()}
                self.dst = {p: np.zeros(max(n, 1), np.uint8) for p, n in recv.items()}
                register = self.eng.register_array
            else:
                dev = self.device
                self.src = {p: torch.full((max(n, 1),), 0x5A, dtype=torch.uint8, device=dev)
                            for p, n in send.items()}  # fmt: skip
                self.dst = {p: torch.zeros(max(n, 1), dtype=torch.uint8, device=dev)
                            for p, n in recv.items()}  # fmt: skip
                register = self.eng.register_torch_tensor
            self.src_mem = {p: register(a) for p, a in self.src.items()}
            dst_mem = {p: register(a) for p, a in self.dst.items()}
            self.bufs = list(self.src_mem.values()) + list(dst_mem.values())
            mine = {p: m.pack() for p, m in dst_mem.items()}
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            error = e
        every = [None] * self.ctx.world
        dist.all_gather_object(every, mine)
        if error is not None:
            raise error
        failed = [r for r, v in enumerate(every) if v is None]
        if failed:
            raise RuntimeError(f"bench: mori-io buffers could not be registered on ranks {failed}")
        # Where my share lands at each peer: its destination buffer for me.
        self.remote = {p: MemoryDesc.unpack(every[p][self.ctx.rank]) for p in self.peers}
        self.send = send

    def exchange(self, row: int, wait_ms: int = 120000) -> None:
        statuses = []
        for p, n in self.send.items():
            if n == 0:
                continue
            offsets = list(range(0, n, row))
            sizes = [min(row, n - o) for o in offsets]
            uid = self.eng.allocate_transfer_uid()
            statuses.append(
                self.eng.batch_write(self.src_mem[p], offsets, self.remote[p], offsets, sizes, uid)
            )
        from mori.io import StatusCode

        for st in statuses:
            for s in st if isinstance(st, list) else [st]:
                if s.WaitFor(wait_ms) == StatusCode.IN_PROGRESS:
                    raise TimeoutError(
                        f"bench: a mori-io TCP batch did not finish within {wait_ms} ms"
                    )
                if not s.Succeeded():
                    raise RuntimeError(f"bench: mori-io TCP batch failed: {s.Message()}")

    def us(self, nbytes: int, row: int, iters: int) -> float:
        send, recv = shares(self.ctx, nbytes)
        self.prepare(send, recv)
        return timed_us(lambda: self.exchange(row), iters)

    def close(self) -> None:
        for m in self.bufs:
            self.eng.deregister_memory(m)
        self.bufs = []
        self.eng.close()


def attach(args, ctx, op, rec: dict, phase_bytes: dict | None = None) -> None:
    """Add an inter-node op's byte counts (``phase_bytes``: ``op._mode.bytes(phase)``
    read after the eager calls, the same routing as the timed ones; default: read now),
    its GB/s, the raw transport figures and the copy floor of the same bytes to
    ``rec``. Collective."""
    gbps = lambda nbytes, us: nbytes / us / 1e3 if us and us > 0 else None  # noqa: E731
    device = ctx.device if ctx.cuda else None
    io = getattr(ctx, "mori_io", None)
    for phase in ("dispatch", "combine"):
        b = (phase_bytes or {}).get(phase) or op._mode.bytes(phase)
        us = rec[f"{phase}_us"]
        link = link_bytes(b)
        leg_us = link_leg_us(ctx, op, phase, args.iters)
        raw_us = raw_stream_us(ctx, ctx.raw_mesh, link, args.iters, device=device)
        host_us = raw_stream_us(ctx, ctx.raw_mesh, link, args.iters) if ctx.cuda else raw_us
        block_us = raw_stream_us(ctx, ctx.raw_mesh, link, args.iters, block=True)
        row = b["link_token"] // b["physical_rows"] if b["physical_rows"] else CHUNK
        io_row_us = io.us(link, row, args.iters) if io is not None else None
        io_one_us = io.us(link, max(link, 1), args.iters) if io is not None else None
        copy_us = copy_floor_us(ctx, link, args.iters)
        rec.update({
            f"{phase}_bytes": b,
            f"{phase}_algo_gbps": gbps(b["algo_token"], us),
            f"{phase}_physical_gbps": gbps(b["physical_token"], us),
            f"{phase}_link_bytes": link,
            f"{phase}_link_gbps": gbps(link, us),
            f"{phase}_leg_us": leg_us,
            f"{phase}_leg_gbps": gbps(link, leg_us),
            f"{phase}_raw_us": raw_us,
            f"{phase}_raw_gbps": gbps(link, raw_us),
            f"{phase}_raw_host_us": host_us,
            f"{phase}_raw_block_us": block_us,
            f"{phase}_mori_io_row_us": io_row_us,
            f"{phase}_mori_io_one_us": io_one_us,
            # The faster of the two batch shapes: the stricter baseline.
            f"{phase}_mori_io_us": min(io_row_us, io_one_us) if io is not None else None,
            f"{phase}_copy_us": copy_us,
            f"{phase}_copy_gbps": gbps(link, copy_us),
        })  # fmt: skip
    rec["link"] = op._mode.impl.link_name
    rec["gpu_per_node"] = ctx.gpu_per_node
    rec["raw_staged"] = ctx.cuda  # raw: GPU buffers staged through pinned host chunks
    rec["mori_io_memory"] = (
        None if io is None else ("gpu" if io.device is not None else "host")
    )  # fmt: skip


def table(records) -> tuple[list[list], list[str]] | None:
    """Rank 0's inter-node table: per phase the call and kernel time, algo/physical MB
    and GB/s, the link's and the proxy's MB, the raw figures, the leg and the copy floor
    of the same bytes, slowest rank per column."""
    inter = [r for r in records if "dispatch_bytes" in r]
    if not inter:
        return None

    def worst(rs, key):
        vals = [r.get(key) for r in rs]
        return max(vals) if vals and all(v is not None for v in vals) else None

    rows = []
    keys = sorted({(r["tokens"], r["dtype"], r["impl"]) for r in inter})
    for n, dt, impl in keys:
        rs = [r for r in inter if (r["tokens"], r["dtype"], r["impl"]) == (n, dt, impl)]
        for phase in ("dispatch", "combine"):
            us = max(r[f"{phase}_us"] for r in rs)
            kern = worst(rs, f"{phase}_kernel_us")
            raw = max(r[f"{phase}_raw_us"] for r in rs)
            block = max(r.get(f"{phase}_raw_block_us") or 0 for r in rs)
            leg = worst(rs, f"{phase}_leg_us")
            io = worst(rs, f"{phase}_mori_io_us")
            copy = worst(rs, f"{phase}_copy_us")
            algo = max(r[f"{phase}_bytes"]["algo_token"] for r in rs)
            phys = max(r[f"{phase}_bytes"]["physical_token"] for r in rs)
            link = max(r[f"{phase}_link_bytes"] for r in rs)
            moved = max(r[f"{phase}_bytes"]["moved"] for r in rs)
            pct = lambda base, t=us: f"{100 * base / t:.0f} %" if t and base else "-"  # noqa: E731
            rows.append([
                n, dt, impl, phase, us, "-" if kern is None else kern, algo / 1e6,
                algo / us / 1e3 if us else 0, phys / 1e6, phys / us / 1e3 if us else 0,
                link / 1e6, link / us / 1e3 if us else 0, moved / 1e6, raw,
                link / raw / 1e3 if raw else 0, pct(raw), "-" if io is None else io, pct(io),
                block or "-", pct(block), "-" if leg is None else leg, pct(raw, leg),
                pct(io, leg), "-" if copy is None else copy, pct(copy),
            ])  # fmt: skip
    headers = [
        "tokens", "dtype", "impl", "phase", "us", "kern us", "algo MB", "algo GB/s", "phys MB",
        "phys GB/s", "link MB", "link GB/s", "moved MB", "raw us", "raw GB/s", "op / raw",
        "mori-io us", "op / mori-io", "raw 1MiB us", "op / raw 1MiB", "leg us", "leg / raw",
        "leg / mori-io", "copy us", "op / copy",
    ]  # fmt: skip
    return rows, headers
