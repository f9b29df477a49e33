# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.io beside NIXL and Mooncake on one host: the same workloads, the same bytes,
interleaved rounds, one markdown table. Not run in CI.

    python packages/mori-io/benchmarks/compare_peers.py [--rounds 9]
        [--peers-python /tmp/peers-venv/bin/python] [--systems mori-tcp,nixl-ucx,...]
        [--scale 1.0] [--json PATH]

Every workload writes scattered blocks of host memory from an initiator process to a
target process: block j leaves initiator offset 2j x size and lands in target slot
2 perm(j) + 1 (perm drawn per round), so no system can merge neighbouring blocks into
one copy. Workloads: 1024 x 4 KiB, 256 x 64 KiB and 4 x 1 MiB batch writes (latency
of one batch call, submission to completion seen by the initiator, ms), a single 4 KiB
write (µs, median and p99), and the CPU time per transfer of both processes over the
1024 x 4 KiB batches (``getrusage(RUSAGE_SELF)``, all threads, user + system).

After each workload the target compares its whole destination region with what it
must hold: every block equal to the initiator's (random bytes from a seed drawn per
round), every gap still holding the poison byte. A mismatch fails that round.

Systems, each in its own pair of processes, restarted every round, their order rotated
from round to round (interleaving, so drift of the shared machine hits all alike):

- ``mori-tcp``: mori.io TCP backend, sessions, default ``TcpBackendConfig``.
- ``mori-shm-cma``: mori.io SHM, numpy buffers and ``MORI_IO_SHM_MAP=0``: CMA
  (``process_vm_writev``) under a cached grant.
- ``mori-shm-map``: mori.io SHM, both buffers from ``allocate_shared_host_memory``:
  the initiator maps the target's region and copies with memcpy.
- ``nixl-ucx``: NIXL's UCX backend with UCX's default transports (its put is
  ``cma/memory``, zero-copy CMA; ``UCX_PROTO_INFO=y`` shows it), the initiator's
  progress thread off, the target's on (the default).
- ``nixl-tcp``: the same with ``UCX_TLS=tcp``.
- ``mooncake-tcp``: Mooncake's transfer engine, ``protocol="tcp"``, P2P handshake (no
  metadata server), ``batch_transfer_sync_write`` / ``transfer_sync_write``.

NIXL's transfer handle is built once per workload (``initialize_xfer``) and posted
again every iteration, its intended use for repeated transfers; mori's session call
and Mooncake's call carry the offsets every iteration. All networking is loopback
(``UCX_NET_DEVICES=lo``, 127.0.0.1). NIXL and Mooncake run from their own venv
(``--peers-python``), created and filled on first use unless ``--no-install``:
``nixl`` and ``nixl-cu12`` without dependencies (they would pull a CUDA torch; the UCX
plugin needs only numpy), and ``mooncake-transfer-engine-non-cuda`` (the default wheel
links libcudart and libcuda, absent on a machine without a GPU). A system that cannot
be installed or run here gets a row saying why.

Each cell: the median over rounds of each round's median (p99: of each round's p99),
with the min-max over rounds; ``×r`` is the ratio to the like-for-like mori path
(NIXL UCX to mori SHM CMA, NIXL tcp and Mooncake to mori TCP): above 1, mori is faster.

The single writes run apart from the batches: each round, after every system's batches
(one pair per system in turn), one fresh pair per system times its single writes in
``--single-blocks`` blocks (30 untimed writes, then a tenth of the timed ones), block b
of every system in turn, the waiting pairs stopped with SIGSTOP (NIXL's idle pairs poll).
This VM's CPU runs at one of two speeds for seconds at a time, longer than one system's
3000 writes take, so alternating short blocks lets every system meet the same states.
Each block also times a fixed pure-Python loop (the calibration) first; a second table
gives each system's single-write median over the blocks whose calibration was within
1.25x of that system's quickest block ("fast") and over the others ("slow"), so that
systems are also compared within one state. ``--single-blocks 0``: the former method,
the single writes after each system's batches in its one pair.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import queue
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)
POISON = 0xA5
BLOCK_WARMUP = 30  # untimed single writes at the start of each alternated block
BUF_BYTES = 32 << 20  # the largest region: 2 x 256 x 64 KiB

# (key, label, blocks, block bytes, timed iterations, warm-up iterations)
WORKLOADS = [
    ("b4k", "1024 × 4 KiB batch (ms)", 1024, 4 << 10, 40, 4),
    ("b64k", "256 × 64 KiB batch (ms)", 256, 64 << 10, 40, 4),
    ("b1m", "4 × 1 MiB batch (ms)", 4, 1 << 20, 150, 10),
    ("s4k", "single 4 KiB write (µs)", 1, 4 << 10, 3000, 300),
]

_LO = {"UCX_NET_DEVICES": "lo"}
# key: (label, runtime, backend, env, like-for-like mori system for ratios)
SYSTEMS = {
    "mori-tcp": ("mori TCP", "mori", "tcp", {}, None),
    "mori-shm-cma": ("mori SHM (CMA)", "mori", "shm-cma", {"MORI_IO_SHM_MAP": "0"}, None),
    "mori-shm-map": ("mori SHM (mapped)", "mori", "shm-map", {}, None),
    "nixl-ucx": ("NIXL UCX (CMA put)", "peers", "nixl", dict(_LO), "mori-shm-cma"),
    "nixl-tcp": ("NIXL UCX_TLS=tcp", "peers", "nixl", {**_LO, "UCX_TLS": "tcp"}, "mori-tcp"),
    "mooncake-tcp": ("Mooncake TE tcp", "peers", "mooncake", {"GLOG_minloglevel": "2"}, "mori-tcp"),
}  # fmt: skip

PEER_PACKAGES = [  # tested versions; see the module docstring for why no-deps
    (["--no-deps", "nixl==1.5.1", "nixl-cu12==1.5.1"], "nixl"),
    (["numpy>=1.24"], "numpy"),
    (["mooncake-transfer-engine-non-cuda==0.3.13.post1"], "mooncake"),
]
PEER_IMPORTS = {"nixl": "from nixl._api import nixl_agent", "mooncake": "import mooncake.engine"}


# -- control channel between the two processes of a pair --------------------------------


class Channel:
    """Length-prefixed pickled messages over one loopback socket (both ends are this
    script, started by the driver)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, obj) -> None:
        data = pickle.dumps(obj)
        self.sock.sendall(struct.pack("<I", len(data)) + data)

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the other process of the pair closed the channel")
            out += chunk
        return bytes(out)

    def recv(self):
        (n,) = struct.unpack("<I", self._exact(4))
        return pickle.loads(self._exact(n))


def _calibrate(reps: int = 5, calls: int = 2000) -> float:
    """ns per call of a fixed pure-Python loop, the best of `reps` blocks of `calls` calls
    (about 1 µs each): how fast this process's CPU ran just then."""

    def spin():
        x = 0
        for i in range(20):
            x += i
        return x

    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            spin()
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best


def _cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- the systems' two sides ---------------------------------------------------------------


class MoriSide:
    def __init__(self, role: str, backend: str):
        import numpy as np

        from mori.io import BackendType, IOEngine, IOEngineConfig, allocate_shared_host_memory

        self.backend = backend
        self.eng = IOEngine(f"cp-{role}", IOEngineConfig("127.0.0.1", 0))
        self.eng.create_backend(BackendType.TCP)
        if backend != "tcp":
            self.eng.create_backend(BackendType.SHM)
        if backend == "shm-map":
            self._shared = allocate_shared_host_memory(BUF_BYTES)
            self.buf = np.asarray(self._shared)
        else:
            self.buf = np.zeros(BUF_BYTES, np.uint8)
        self.mem = self.eng.register_array(self.buf)
        self.sess = None

    def meta(self):
        return {"engine": self.eng.get_engine_desc().pack(), "mem": self.mem.pack()}

    def connect(self, peer, initiator: bool) -> str:
        from mori.io import EngineDesc, MemoryDesc

        self.eng.register_remote_engine(EngineDesc.unpack(peer["engine"]))
        if not initiator:
            return ""
        remote = MemoryDesc.unpack(peer["mem"])
        self.sess = self.eng.create_session(self.mem, remote)
        name, why = self.sess.backend()
        want = "tcp" if self.backend == "tcp" else "shm"
        if name.lower() != want:
            raise RuntimeError(f"mori backend {self.backend}: the session uses {name}: {why}")
        mapped = "mapped" in why
        if (self.backend == "shm-map") != mapped and self.backend != "tcp":
            raise RuntimeError(f"mori backend {self.backend}: the session copies by: {why}")
        return why

    def describe(self, remote_offsets, size):
        return None

    def prepare(self, local_offsets, remote_offsets, size, info):
        import numpy as np

        from mori.io import StatusCode

        sess, eng = self.sess, self.eng
        lo = np.asarray(local_offsets, np.uint64)
        ro = np.asarray(remote_offsets, np.uint64)
        sizes = np.full(len(lo), size, np.uint64)

        def done(st):
            if st.WaitFor(30000) == StatusCode.IN_PROGRESS:
                raise TimeoutError("a mori transfer did not finish within 30 s")
            if not st.Succeeded():
                raise RuntimeError(f"mori transfer failed: {st.Code().name}: {st.Message()}")

        if len(lo) == 1:
            l0, r0 = int(lo[0]), int(ro[0])
            return lambda: done(sess.write(l0, r0, size, eng.allocate_transfer_uid()))
        return lambda: done(sess.batch_write(lo, ro, sizes, eng.allocate_transfer_uid()))

    def close(self):
        self.eng.close()


class NixlSide:
    def __init__(self, role: str, backend: str):
        import numpy as np
        from nixl._api import nixl_agent, nixl_agent_config

        # The initiator polls its own transfers; the target has no calls to make, so
        # its progress thread (NIXL's default) serves UCX's active messages (tcp).
        cfg = nixl_agent_config(enable_prog_thread=role == "target", backends=["UCX"])
        self.agent = nixl_agent(f"cp-{role}", cfg)
        if "UCX" not in self.agent.backends:
            raise RuntimeError(f"NIXL has no UCX backend here (plugins: {self.agent.plugin_list})")
        self.buf = np.zeros(BUF_BYTES, np.uint8)
        self.addr = self.buf.ctypes.data
        self.reg = self.agent.register_memory([(self.addr, BUF_BYTES, 0, "")], "DRAM")
        self.remote = None
        self.handle = None

    def meta(self):
        return self.agent.get_agent_metadata()

    def connect(self, peer, initiator: bool) -> str:
        if initiator:
            self.remote = self.agent.add_remote_agent(peer)
        return "UCX"

    def _descs(self, offsets, size):
        import numpy as np

        arr = np.array([(self.addr + int(o), size, 0) for o in offsets], np.uint64)
        return self.agent.get_xfer_descs(arr, "DRAM")

    def describe(self, remote_offsets, size):
        return self.agent.get_serialized_descs(self._descs(remote_offsets, size))

    def prepare(self, local_offsets, remote_offsets, size, info):
        if self.handle is not None:
            self.agent.release_xfer_handle(self.handle)
        local = self._descs(local_offsets, size)
        remote = self.agent.deserialize_descs(info)
        agent = self.agent
        h = self.handle = agent.initialize_xfer("WRITE", local, remote, self.remote)

        def go():
            st = agent.transfer(h)
            while st == "PROC":
                st = agent.check_xfer_state(h)
            if st != "DONE":
                raise RuntimeError(f"NIXL transfer ended in state {st}")

        return go

    def close(self):
        if self.handle is not None:
            self.agent.release_xfer_handle(self.handle)
        self.agent.deregister_memory(self.reg)


class MooncakeSide:
    def __init__(self, role: str, backend: str):
        import numpy as np
        from mooncake.engine import TransferEngine

        self.eng = TransferEngine()
        rc = self.eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"Mooncake initialize returned {rc}")
        self.buf = np.zeros(BUF_BYTES, np.uint8)
        self.addr = self.buf.ctypes.data
        rc = self.eng.register_memory(self.addr, BUF_BYTES)
        if rc != 0:
            raise RuntimeError(f"Mooncake register_memory returned {rc}")
        self.peer = None

    def meta(self):
        return {"host": f"127.0.0.1:{self.eng.get_rpc_port()}", "addr": self.addr}

    def connect(self, peer, initiator: bool) -> str:
        self.peer = peer
        return "tcp"

    def describe(self, remote_offsets, size):
        return None

    def prepare(self, local_offsets, remote_offsets, size, info):
        eng, host, base = self.eng, self.peer["host"], self.peer["addr"]
        la = [self.addr + int(o) for o in local_offsets]
        ra = [base + int(o) for o in remote_offsets]
        lens = [size] * len(la)

        def check(rc):
            if rc != 0:
                raise RuntimeError(f"Mooncake transfer returned {rc}")

        if len(la) == 1:
            l0, r0 = la[0], ra[0]
            return lambda: check(eng.transfer_sync_write(host, l0, r0, size))
        return lambda: check(eng.batch_transfer_sync_write(host, la, ra, lens))

    def close(self):
        self.eng.unregister_memory(self.addr)


SIDES = {"mori": MoriSide, "nixl": NixlSide, "mooncake": MooncakeSide}


def _side(system: str, role: str):
    _, runtime, backend, _, _ = SYSTEMS[system]
    kind = "mori" if runtime == "mori" else backend
    return SIDES[kind](role, backend)


# -- the two workers -----------------------------------------------------------------------


def _layout(n: int, size: int, seed: int):
    """Offsets of block j: 2j x size at the initiator, slot 2 perm(j) + 1 at the target."""
    import numpy as np

    perm = np.random.default_rng(seed).permutation(n)
    local = [2 * j * size for j in range(n)]
    remote = [int(2 * perm[j] + 1) * size for j in range(n)]
    return local, remote


def _payload(n: int, size: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed + 1).integers(0, 256, n * size, dtype=np.uint8)


def run_target(system: str) -> int:
    side = _side(system, "target")
    lsock = socket.create_server(("127.0.0.1", 0))
    print(f"CTL {lsock.getsockname()[1]}", flush=True)
    lsock.settimeout(120)
    conn, _ = lsock.accept()
    ch = Channel(conn)
    ch.send(side.meta())
    side.connect(ch.recv(), initiator=False)
    ch.send("connected")
    cpu0 = 0.0
    while True:
        msg = ch.recv()
        if msg[0] == "prep":
            _, n, size, seed = msg
            _, remote = _layout(n, size, seed)
            region = 2 * n * size
            side.buf[:region] = POISON
            ch.send(side.describe(remote, size))
        elif msg[0] == "start":
            cpu0 = _cpu_s()
            ch.send("started")
        elif msg[0] == "stop":
            cpu = _cpu_s() - cpu0
            _, n, size, seed = msg
            ch.send({"cpu_s": cpu, "problem": _verify(side.buf, n, size, seed)})
        elif msg[0] == "end":
            side.close()
            ch.send("bye")
            return 0


def _verify(buf, n: int, size: int, seed: int) -> str | None:
    """None when the target's region holds exactly what it must, else what differs."""
    import numpy as np

    _, remote = _layout(n, size, seed)
    src = _payload(n, size, seed)
    want = np.full(2 * n * size, POISON, np.uint8)
    for j, ro in enumerate(remote):
        want[ro : ro + size] = src[j * size : (j + 1) * size]
    got = buf[: 2 * n * size]
    if np.array_equal(got, want):
        return None
    bad = np.flatnonzero(got != want)
    return f"{len(bad)} bytes differ, the first at target offset {int(bad[0])}"


def run_initiator(system: str, port: int, seed: int, scale: float, phase: str, blocks: int) -> int:
    """Runs the workloads of `phase` ("all", "batches": all but the single write,
    "single": only the single write, timed in `blocks` blocks, each started by a "go"
    line on stdin and ended by a "BLOCK" line on stdout; a "finish" line then lets it
    check the target's bytes and report)."""
    import numpy as np

    side = _side(system, "initiator")
    ch = Channel(socket.create_connection(("127.0.0.1", port), timeout=120))
    ch.sock.settimeout(None)
    peer = ch.recv()
    ch.send(side.meta())
    route = side.connect(peer, initiator=True)
    ch.recv()
    out = {"system": system, "route": route, "seed": seed, "workloads": {}}
    for wi, (key, _, n, size, iters, warmup) in enumerate(WORKLOADS):
        if (phase == "batches" and key == "s4k") or (phase == "single" and key != "s4k"):
            continue
        iters = max(3, int(iters * scale))
        wseed = seed * 16 + wi
        local, remote = _layout(n, size, wseed)
        src = _payload(n, size, wseed)
        side.buf[: 2 * n * size] = 0
        for j, lo in enumerate(local):
            side.buf[lo : lo + size] = src[j * size : (j + 1) * size]
        ch.send(("prep", n, size, wseed))
        go = side.prepare(local, remote, size, ch.recv())
        for _ in range(warmup):
            go()
        ch.send(("start",))
        ch.recv()
        calib = [_calibrate()] if key == "s4k" else []
        lat = []
        cpu0 = _cpu_s()
        if phase == "single":
            print("READY", flush=True)
            per = -(-iters // blocks)
            block_stats = []  # per block: median µs, calibration ns
            for b in range(blocks):
                if sys.stdin.readline().strip() != "go":
                    raise RuntimeError("the driver ended the single writes early")
                block_calib = _calibrate(3, 500)
                for _ in range(BLOCK_WARMUP):
                    go()
                first = len(lat)
                for _ in range(min(per, iters - b * per)):
                    t0 = time.perf_counter()
                    go()
                    lat.append(time.perf_counter() - t0)
                if len(lat) > first:  # a small --scale leaves the last blocks empty
                    block_stats.append([float(np.median(lat[first:])) * 1e6, block_calib])
                print("BLOCK", flush=True)
            # Nothing runs here while other systems time their blocks.
            if sys.stdin.readline().strip() != "finish":
                raise RuntimeError("the driver ended the single writes early")
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                go()
                lat.append(time.perf_counter() - t0)
        cpu = _cpu_s() - cpu0
        if calib:
            calib.append(_calibrate())
        ch.send(("stop", n, size, wseed))
        reply = ch.recv()
        if reply["problem"]:
            raise RuntimeError(f"{system} {key}: target bytes wrong: {reply['problem']}")
        lat_sorted = sorted(lat)
        out["workloads"][key] = {
            "iters": iters,
            "median_s": float(np.median(lat)),
            "p99_s": lat_sorted[min(len(lat) - 1, (99 * len(lat)) // 100)],
            "cpu_init_us": cpu / (iters * n) * 1e6,
            "cpu_target_us": reply["cpu_s"] / (iters * n) * 1e6,
        }
        if calib:
            out["workloads"][key]["calib_ns"] = calib
        if phase == "single":
            out["workloads"][key]["blocks"] = block_stats
    ch.send(("end",))
    ch.recv()
    side.close()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# -- the driver -----------------------------------------------------------------------------


def peer_status(python: str, install: bool) -> dict[str, str | None]:
    """{"nixl": None or why it cannot run, "mooncake": ...}; installs into the venv of
    ``python`` (creating it) when a package is missing and ``install``."""

    def probe():
        out = {}
        for name, stmt in PEER_IMPORTS.items():
            if not os.path.exists(python):
                out[name] = f"{python} does not exist"
                continue
            p = subprocess.run([python, "-c", stmt], capture_output=True, text=True, timeout=120)
            tail = (p.stderr.strip().splitlines() or ["?"])[-1]
            out[name] = None if p.returncode == 0 else f"import failed: {tail}"
        return out

    status = probe()
    if install and any(status.values()):
        venv = os.path.dirname(os.path.dirname(python))
        log = []
        if not os.path.exists(python):
            p = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
            log.append(p.stderr)
        for pkgs, what in PEER_PACKAGES:
            p = subprocess.run(
                [python, "-m", "pip", "install", "-q", *pkgs], capture_output=True, text=True
            )
            if p.returncode != 0:
                log.append(f"pip install {what}: {p.stderr.strip().splitlines()[-1:]}")
        status = probe()
        for k, v in status.items():
            if v and log:
                status[k] = f"{v}; install: {' '.join(x for x in log if x)[-200:]}"
    return status


def _ctl_port(stream, timeout: float) -> str | None:
    """The port in the target's "CTL <port>" line (libraries may print lines before it)."""
    box: list[str] = []

    def read():
        for line in stream:
            if line.startswith("CTL "):
                box.append(line.split()[1])
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else None


def run_pair(system: str, python: str, seed: int, scale: float, timeout: float,
             phase: str = "all") -> dict:  # fmt: skip
    """One round of one system: both processes, the workloads of `phase`. The
    initiator's result, or {"error": why}."""
    env = {**os.environ, **SYSTEMS[system][3], "PYTHONUNBUFFERED": "1"}
    base = [python, HERE, "--worker", system, "--phase", phase]
    with tempfile.TemporaryFile("w+") as tgt_err:
        tgt = subprocess.Popen(
            [*base, "--role", "target"], env=env, stdout=subprocess.PIPE, stderr=tgt_err,
            text=True,
        )  # fmt: skip
        try:
            port = _ctl_port(tgt.stdout, 120)
            if port is None:
                tgt.kill()
                tgt.wait()
                tgt_err.seek(0)
                return {"error": "target did not start: " + _tail(tgt_err.read())}
            init = subprocess.Popen(
                [*base, "--role", "initiator", "--ctl", port, "--seed", str(seed),
                 "--scale", str(scale)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                out, err = init.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                init.kill()
                out, err = init.communicate()
                return {"error": f"initiator ran past {timeout:.0f} s: {_tail(err)}"}
            try:
                tgt.wait(30)
            except subprocess.TimeoutExpired:
                pass
            for ln in out.splitlines():
                if ln.startswith("RESULT "):
                    return json.loads(ln[7:])
            return {"error": f"initiator exit {init.returncode}: {_tail(err)}"}
        finally:
            if tgt.poll() is None:
                tgt.kill()
                tgt.wait()


class SinglePair:
    """One system's pair for the single writes alternated across systems: started with
    `start`, then each `block` runs one block of timed writes, `finish` collects the
    result. Every wait is bounded by `timeout` seconds."""

    def __init__(self, system: str, python: str, seed: int, scale: float, blocks: int,
                 timeout: float):  # fmt: skip
        self.system, self.timeout, self.error = system, timeout, None
        env = {**os.environ, **SYSTEMS[system][3], "PYTHONUNBUFFERED": "1"}
        base = [python, HERE, "--worker", system, "--phase", "single"]
        self.tgt_err = tempfile.TemporaryFile("w+")
        self.init_err = tempfile.TemporaryFile("w+")
        self.tgt = subprocess.Popen([*base, "--role", "target"], env=env,
                                    stdout=subprocess.PIPE, stderr=self.tgt_err, text=True)  # fmt: skip
        self.init = None
        self.lines: queue.Queue = queue.Queue()
        port = _ctl_port(self.tgt.stdout, timeout)
        if port is None:
            self.error = "target did not start: " + self._err(self.tgt_err)
            return
        self.init = subprocess.Popen(
            [*base, "--role", "initiator", "--ctl", port, "--seed", str(seed),
             "--scale", str(scale), "--single-blocks", str(blocks)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.init_err,
            text=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        self._expect("READY")

    def _read(self):
        for line in self.init.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    @staticmethod
    def _err(f) -> str:
        f.seek(0)
        return _tail(f.read())

    def _expect(self, prefix: str) -> str | None:
        """The initiator's next line starting with `prefix`, or None (self.error set)."""
        deadline = time.monotonic() + self.timeout
        while self.error is None:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.error = f"initiator sent no {prefix} within {self.timeout:.0f} s"
                break
            if line is None:
                self.init.wait(30)
                self.error = f"initiator exit {self.init.returncode}: {self._err(self.init_err)}"
                break
            if line.startswith(prefix):
                return line
        return None

    def block(self) -> None:
        if self.error is None:
            self.init.stdin.write("go\n")
            self.init.stdin.flush()
            self._expect("BLOCK")

    def pause(self, stop: bool) -> None:
        """Stops (SIGSTOP) or resumes (SIGCONT) both processes: a waiting pair uses no CPU
        while another system times its block (NIXL's pairs poll while idle)."""
        for proc in (self.tgt, self.init):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGSTOP if stop else signal.SIGCONT)

    def cpu_s(self) -> float:
        """User + system CPU seconds of both processes so far (0 where gone)."""
        total = 0.0
        for proc in (self.tgt, self.init):
            try:
                with open(f"/proc/{proc.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (AttributeError, OSError, IndexError, ValueError):
                pass
        return total

    def finish(self) -> dict:
        out = {"error": self.error} if self.error else None
        if out is None:
            self.init.stdin.write("finish\n")
            self.init.stdin.flush()
            line = self._expect("RESULT ")
            out = json.loads(line[7:]) if line else {"error": self.error}
        for proc in (self.init, self.tgt):
            if proc is None:
                continue
            try:
                proc.wait(30 if out.get("error") is None else 0.1)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.tgt_err.close()
        self.init_err.close()
        return out


def run_single_phase(order: list[str], pythons: dict[str, str], seed: int, scale: float,
                     blocks: int, timeout: float) -> tuple[dict[str, dict], float]:  # fmt: skip
    """The single writes of every system in `order`, one pair each, their blocks
    alternated (block b of each system in turn). Per system the initiator's result or
    {"error": why}, and the CPU the waiting pairs used meanwhile as a share of one CPU."""
    pairs = []
    try:
        for s in order:  # each started (and warmed up) while the others are stopped
            pairs.append(SinglePair(s, pythons[s], seed, scale, blocks, timeout))
            pairs[-1].pause(True)
        idle_cpu = wall = 0.0
        for _ in range(blocks):
            for p in pairs:
                others = [q for q in pairs if q is not p]
                p.pause(False)
                c0, t0 = sum(q.cpu_s() for q in others), time.monotonic()
                p.block()
                wall += time.monotonic() - t0
                idle_cpu += sum(q.cpu_s() for q in others) - c0
                p.pause(True)
    finally:
        for p in pairs:
            p.pause(False)
        results = {p.system: p.finish() for p in pairs}
    return results, idle_cpu / wall if wall > 0 else 0.0


def _tail(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else "(no output)"


def _conditions() -> dict:
    from mori.core import bench as scaffold  # here: the peers' venvs need no mori

    m = scaffold.machine()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu": m["cpu"], "cores": m["cores"], "kernel": m["kernel"],
            "loadavg": os.getloadavg(), "compilers_running": scaffold.compilers_running()}  # fmt: skip


def summarize(results: dict[str, list[dict]]) -> dict[str, dict]:
    """Per system and figure: median over rounds and (min, max)."""
    out = {}
    for system, rounds in results.items():
        ok = [r for r in rounds if "error" not in r]
        errors = [r["error"] for r in rounds if "error" in r]
        fig: dict[str, tuple[float, float, float]] = {}

        def put(name, vals, fig=fig):
            if vals:
                fig[name] = (statistics.median(vals), min(vals), max(vals))

        for key, _, _, _, _, _ in WORKLOADS:
            rows = [r["workloads"][key] for r in ok]
            unit = 1e6 if key == "s4k" else 1e3
            put(key, [w["median_s"] * unit for w in rows])
            if key == "s4k":
                put("s4k_p99", [w["p99_s"] * unit for w in rows])
            if key == "b4k":
                put("cpu", [w["cpu_init_us"] + w["cpu_target_us"] for w in rows])
                put("cpu_init", [w["cpu_init_us"] for w in rows])
                put("cpu_target", [w["cpu_target_us"] for w in rows])
        out[system] = {"figures": fig, "rounds_ok": len(ok), "errors": errors,
                       "route": ok[0]["route"] if ok else None}  # fmt: skip
    return out


FAST_STATE = 1.25  # a round's calibration within this factor of the system's quickest


def state_split(results: dict[str, list[dict]]) -> dict[str, dict[str, list[tuple]]]:
    """Per system, (single-write median µs, calibration ns) of its alternated blocks (or,
    without blocks, of its rounds, with the slower of the two calibrations taken around
    the writes) split into "fast" and "slow" CPU state; the threshold is relative to that
    system's own quickest block or round."""
    out = {}
    for system, rounds in results.items():
        rows = []
        for r in rounds:
            w = r.get("workloads", {}).get("s4k", {}) if "error" not in r else {}
            if "blocks" in w:
                rows += [tuple(b) for b in w["blocks"]]
            elif "calib_ns" in w:
                rows.append((w["median_s"] * 1e6, max(w["calib_ns"])))
        if not rows:
            continue
        quickest = min(c for _, c in rows)
        out[system] = {
            "fast": [x for x in rows if x[1] <= FAST_STATE * quickest],
            "slow": [x for x in rows if x[1] > FAST_STATE * quickest],
        }
    return out


def format_state_table(split: dict) -> str:
    head = ["system", "fast-state units", "single 4K µs median, fast", "calibration ns, fast",
            "slow-state units", "single 4K µs median, slow", "calibration ns, slow"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, (label, *_) in SYSTEMS.items():
        if system not in split:
            continue
        cells = [label]
        for state in ("fast", "slow"):
            rows = split[system][state]
            cells.append(str(len(rows)))
            if rows:
                lat = [x[0] for x in rows]
                cal = [x[1] for x in rows]
                cells.append(f"{statistics.median(lat):.2f} ({min(lat):.2f}–{max(lat):.2f})")
                cells.append(f"{statistics.median(cal):.0f}")
            else:
                cells += ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(figs, key, ref, digits=2) -> str:
    if key not in figs:
        return "–"
    med, lo, hi = figs[key]
    text = f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"
    if ref is not None and key in ref and ref[key][0] > 0:
        text += f" ×{med / ref[key][0]:.2f}"
    return text


def format_table(summary: dict, unavailable: dict[str, str]) -> str:
    head = ["system", "1024×4K batch ms", "256×64K batch ms", "4×1M batch ms",
            "single 4K µs median", "single 4K µs p99", "CPU µs/xfer 1024×4K init+target",
            "(init / target)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, (label, *_, like) in SYSTEMS.items():
        if system in unavailable:
            lines.append(f"| {label} | not run: {unavailable[system]} |" + " |" * (len(head) - 2))
            continue
        if system not in summary:
            continue
        s = summary[system]
        f = s["figures"]
        if not f:
            why = s["errors"][0] if s["errors"] else "no round ran"
            lines.append(f"| {label} | failed: {why} |" + " |" * (len(head) - 2))
            continue
        ref = summary.get(like, {}).get("figures") if like else None
        split = "–"
        if "cpu_init" in f:
            split = f"{f['cpu_init'][0]:.2f} / {f['cpu_target'][0]:.2f}"
        rounds = f" [{s['rounds_ok']} rounds" + (
            f", {len(s['errors'])} failed]" if s["errors"] else "]"
        )
        lines.append("| " + " | ".join([
            label + rounds, _cell(f, "b4k", ref), _cell(f, "b64k", ref), _cell(f, "b1m", ref),
            _cell(f, "s4k", ref, 1), _cell(f, "s4k_p99", ref, 1), _cell(f, "cpu", ref), split,
        ]) + " |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (>= 5 for a table)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated keys")
    p.add_argument("--peers-python", default="/tmp/peers-venv/bin/python",
                   help="interpreter with nixl and mooncake (its venv is created if missing)")  # fmt: skip
    p.add_argument("--no-install", action="store_true", help="never pip install the peers")
    p.add_argument("--scale", type=float, default=1.0, help="factor on timed iterations")
    p.add_argument("--pair-timeout", type=float, default=300.0, help="seconds per round")
    p.add_argument("--seed", type=int, default=None, help="first round's seed (default: random)")
    p.add_argument("--json", help="write every round's figures and the conditions here")
    p.add_argument("--single-blocks", type=int, default=10,
                   help="the single writes of all systems alternate in this many blocks "
                        "per round (0: each system's run straight through after its "
                        "batches)")  # fmt: skip
    p.add_argument("--phase", default="all", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--ctl", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        if args.role == "target":
            return run_target(args.worker)
        return run_initiator(args.worker, args.ctl, args.seed, args.scale, args.phase,
                             args.single_blocks)  # fmt: skip

    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}; known: {', '.join(SYSTEMS)}")
    unavailable: dict[str, str] = {}
    if any(SYSTEMS[s][1] == "peers" for s in systems):
        status = peer_status(args.peers_python, not args.no_install)
        for s in systems:
            kind = SYSTEMS[s][2]
            if SYSTEMS[s][1] == "peers" and status.get(kind):
                unavailable[s] = status[kind]
    run = [s for s in systems if s not in unavailable]
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "little")
    before = _conditions()
    print(f"compare_peers: {args.rounds} rounds, systems {', '.join(run)}, first seed {seed}; "
          f"{before['cpu']}, {before['cores']} cores, load {before['loadavg'][0]:.2f}, "
          f"compilers running {before['compilers_running']}", flush=True)  # fmt: skip
    results: dict[str, list[dict]] = {s: [] for s in run}
    pythons = {s: sys.executable if SYSTEMS[s][1] == "mori" else args.peers_python for s in run}
    blocks = args.single_blocks
    phase = "batches" if blocks > 0 else "all"
    idle_shares = []
    for r in range(args.rounds):
        order = run[r % len(run) :] + run[: r % len(run)] if run else []
        round_res = {s: run_pair(s, pythons[s], seed + r, args.scale, args.pair_timeout, phase)
                     for s in order}  # fmt: skip
        if blocks > 0:
            single, idle = run_single_phase(order, pythons, seed + r, args.scale, blocks,
                                            args.pair_timeout)  # fmt: skip
            idle_shares.append(idle)
            for s in order:
                res = round_res[s]
                if "error" in single[s] and "error" not in res:
                    round_res[s] = {"error": "single writes: " + single[s]["error"]}
                elif "error" not in res:
                    res["workloads"]["s4k"] = single[s]["workloads"]["s4k"]
        for s in order:
            res = round_res[s]
            results[s].append(res)
            tag = res.get("error") or " ".join(
                f"{k}={w['median_s'] * (1e6 if k == 's4k' else 1e3):.3g}"
                for k, w in res["workloads"].items()
            )
            print(f"round {r + 1}/{args.rounds} {s}: {tag}", flush=True)
    after = _conditions()
    summary = summarize(results)
    print()
    print(f"Conditions: {before['date']} – {after['date']}; load average "
          f"{before['loadavg'][0]:.2f} → {after['loadavg'][0]:.2f}; compiler processes "
          f"{before['compilers_running']} → {after['compilers_running']}")  # fmt: skip
    if idle_shares:
        print(f"Single writes: {blocks} blocks per system and round, alternated; the waiting "
              f"pairs used {statistics.median(idle_shares) * 100:.1f} % of a CPU meanwhile "
              f"(median over rounds, max {max(idle_shares) * 100:.1f} %)")  # fmt: skip
    for s in run:
        if summary[s]["route"]:
            print(f"{s}: {summary[s]['route']}")
    print()
    print(format_table(summary, unavailable))
    split = state_split(results)
    if split:
        print()
        unit = "alternated block" if blocks > 0 else "round"
        print(f"Single 4 KiB writes by CPU state, per {unit} (its median; calibration "
              f"within {FAST_STATE}x of the system's quickest {unit}: fast):")  # fmt: skip
        print()
        print(format_state_table(split))
    if args.json:
        doc = {"benchmark": "compare_peers", "conditions": [before, after], "seed": seed,
               "rounds": args.rounds, "scale": args.scale, "unavailable": unavailable,
               "results": results, "state_split": split, "single_blocks": blocks,
               "idle_cpu_shares": idle_shares,
               "summary": {s: {**v, "figures": {k: list(t) for k, t in v["figures"].items()}}
                           for s, v in summary.items()}}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"json written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
