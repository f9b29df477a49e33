# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The inter-node kernel types in ``python -m mori.ep.bench``: emulated nodes, the
op's byte counts, and the raw transport figure of the same run.

Nodes: ``--gpu-per-node L`` puts rank ``r`` on node ``r // L``
(``MORI_SHMEM_NODE_ID``), so the heap maps only a node's own ranks and every byte to
another node goes through the op's proxy; ``--proxy-transport tcp`` (the default)
forces the proxy's TCP transport (``MORI_PROXY_TRANSPORT``).

The raw figure: a plain TCP stream (one loopback connection per pair of ranks on
different nodes, set up once, ``TCP_NODELAY``) between the same processes, moving the
same bytes the op put on its inter-node link in the phase (``link_token + link_meta +
link_signal`` of ``op._mode.bytes(phase)``), each rank's bytes split evenly over the
ranks of the other nodes, every rank sending and receiving at once (a sender and a
receiver thread per peer). Timed like the op on CPU (barrier, wall clock, median of
``--iters``); the ratio ``raw us / op us`` is the share of the raw stream's rate that
the op's inter-node leg reaches, the op's whole call (count exchange, local copies,
the proxy) against the bare transport.
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

    def exchange(self, send: dict[int, int], recv: dict[int, int]) -> None:
        """Send ``send[p]`` bytes to and receive ``recv[p]`` bytes from every peer at once."""
        errors: list[BaseException] = []

        def run(fn, *a):
            try:
                fn(*a)
            except BaseException as e:  # re-raised below, on the calling thread
                errors.append(e)

        threads = [threading.Thread(target=run, args=(self._send, p, n))
                   for p, n in send.items() if n]  # fmt: skip
        threads += [threading.Thread(target=run, args=(self._recv, p, n))
                    for p, n in recv.items() if n]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _send(self, peer: int, n: int) -> None:
        view = memoryview(self.block)
        while n:
            k = min(n, CHUNK)
            self.conns[peer].sendall(view[:k])
            n -= k

    def _recv(self, peer: int, n: int) -> None:
        view = memoryview(bytearray(min(n, CHUNK)))
        while n:
            got = self.conns[peer].recv_into(view[: min(n, len(view))])
            if not got:
                raise RuntimeError(f"bench: raw stream from rank {peer} closed early")
            n -= got

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()


def raw_stream_us(ctx, mesh: RawMesh, nbytes: int, iters: int) -> float:
    """Median wall-clock us of one exchange in which every rank streams its ``nbytes``
    (split evenly over its peers on other nodes) while receiving the others' shares.
    Collective."""
    import torch.distributed as dist

    every = [None] * ctx.world
    dist.all_gather_object(every, nbytes)

    def share(src: int, dst: int) -> int:
        peers = [p for p in range(ctx.world) if ctx.node_of(p) != ctx.node_of(src)]
        if dst not in peers:
            return 0
        q, r = divmod(every[src], len(peers))
        return q + (1 if peers.index(dst) < r else 0)

    send = {p: share(ctx.rank, p) for p in mesh.peers}
    recv = {p: share(p, ctx.rank) for p in mesh.peers}
    times = []
    for i in range(iters + 1):
        dist.barrier()
        t0 = time.perf_counter()
        mesh.exchange(send, recv)
        if i:  # the first exchange warms the connections
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def attach(args, ctx, op, rec: dict) -> None:
    """Add an inter-node op's byte counts (of the eager pass: the same routing as the
    timed calls), its GB/s and the raw stream of the same bytes to ``rec``."""
    gbps = lambda nbytes, us: nbytes / us / 1e3 if us > 0 else float("nan")  # noqa: E731
    for phase in ("dispatch", "combine"):
        b = op._mode.bytes(phase)
        us = rec[f"{phase}_us"]
        link = link_bytes(b)
        raw_us = raw_stream_us(ctx, ctx.raw_mesh, link, args.iters)
        rec.update({
            f"{phase}_bytes": b,
            f"{phase}_algo_gbps": gbps(b["algo_token"], us),
            f"{phase}_physical_gbps": gbps(b["physical_token"], us),
            f"{phase}_link_bytes": link,
            f"{phase}_link_gbps": gbps(link, us),
            f"{phase}_raw_us": raw_us,
            f"{phase}_raw_gbps": gbps(link, raw_us),
        })  # fmt: skip
    rec["link"] = op._mode.impl.link_name
    rec["gpu_per_node"] = ctx.gpu_per_node


def table(records) -> tuple[list[list], list[str]] | None:
    """Rank 0's inter-node table: per phase the time, algo/physical MB and GB/s, the
    link's MB and GB/s beside the raw stream's of the same bytes, slowest rank."""
    inter = [r for r in records if "dispatch_bytes" in r]
    if not inter:
        return None
    rows = []
    keys = sorted({(r["tokens"], r["dtype"], r["impl"]) for r in inter})
    for n, dt, impl in keys:
        rs = [r for r in inter if (r["tokens"], r["dtype"], r["impl"]) == (n, dt, impl)]
        for phase in ("dispatch", "combine"):
            us = max(r[f"{phase}_us"] for r in rs)
            raw = max(r[f"{phase}_raw_us"] for r in rs)
            algo = max(r[f"{phase}_bytes"]["algo_token"] for r in rs)
            phys = max(r[f"{phase}_bytes"]["physical_token"] for r in rs)
            link = max(r[f"{phase}_link_bytes"] for r in rs)
            rows.append([
                n, dt, impl, phase, us, algo / 1e6, algo / us / 1e3 if us else 0,
                phys / 1e6, phys / us / 1e3 if us else 0, link / 1e6,
                link / us / 1e3 if us else 0, raw, link / raw / 1e3 if raw else 0,
                f"{100 * raw / us:.0f} %" if us else "-",
            ])  # fmt: skip
    headers = [
        "tokens", "dtype", "impl", "phase", "us", "algo MB", "algo GB/s", "phys MB",
        "phys GB/s", "link MB", "link GB/s", "raw us", "raw GB/s", "op / raw",
    ]  # fmt: skip
    return rows, headers
