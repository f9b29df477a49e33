# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A careless or hostile peer cannot make an engine spin, forge its log lines, or land
part of a transfer it refused."""

import dataclasses
import hashlib
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mori.io import (
    _C,
    BackendType,
    EngineDesc,
    IOEngine,
    MemoryDesc,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
    allocate_shared_host_memory,
)

WORKER = str(Path(__file__).with_name("hostile_target_worker.py"))
HDR = struct.Struct("<BBHIQQQQQ")  # wire::Header: type, status, version, num_parts, uid,
VERSION = _C.wire_version  # mem_id, offset, length, capability
T = getattr(_C, "_testing", None)  # test builds only; conftest skips io_testing tests without
K_HELLO, K_WRITE, K_WRITE_ACK, K_EXTENT = 1, 2, 4, 28  # wire::MsgType
K_SHM_CMA_REQ, K_SHM_CMA_GRANT, K_IDLE_CLOSE = 29, 30, 31
K_OUT_OF_BOUNDS = 2  # wire::WireStatus
MIB = 1 << 20


class _Target:
    """hostile_target_worker.py in a subprocess; stderr goes to a file (its log)."""

    def __init__(self, tmp_path, env=None):
        self.log = tmp_path / "target.log"
        self._err = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env={**os.environ, **(env or {})},
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.desc = EngineDesc.unpack(bytes.fromhex(self._line(30)))
        self.mem = MemoryDesc.unpack(bytes.fromhex(self._line(30)))

    def _line(self, timeout_s):
        # Every command answers within its own bound; a hung worker fails the test there.
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"the target worker did not answer in {timeout_s} s") from None
        assert line, f"the target worker exited ({self.proc.poll()})"
        return line

    def _read(self):
        for raw in self.proc.stdout:
            self._lines.put(raw.decode().strip())
        self._lines.put("")

    def ask(self, cmd, timeout_s=30):
        self.proc.stdin.write(cmd.encode() + b"\n")
        self.proc.stdin.flush()
        return self._line(timeout_s)

    def close(self):
        try:
            self.proc.stdin.write(b"quit\n")
            self.proc.stdin.flush()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()
        return self.log.read_bytes()


def _hello(port, key, secret):
    """A raw connection whose hello presents `secret` (the target's, from its EngineDesc,
    for a peer that was given it) and names `key`."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(HDR.pack(K_HELLO, 0, VERSION, 0, 0, 0, 0, len(secret) + len(key), 0) + secret + key)
    return s


def _write_ok(initiator, local, remote, size):
    st = initiator.write(local, 0, remote, 0, size, initiator.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS, "write hung"
    return st


def test_out_of_descriptors_the_target_backs_off_and_recovers(tmp_path):
    """With a connection waiting in the backlog and accept failing with EMFILE, the target
    neither spins nor floods its log; once descriptors are free it accepts again."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("under AddressSanitizer (nox -s sanitize) the exhausted worker cannot run")
    target = _Target(tmp_path)
    initiator = IOEngine("initiator")
    waiting = None
    try:
        assert int(target.ask("exhaust")) > 0
        waiting = _hello(
            target.desc.port, b"waiting", target.desc.secret
        )  # completes in the kernel's backlog
        cpu = float(target.ask("cpu 1.0"))
        print("CPU seconds used by the target in 1 s out of descriptors:", cpu)
        assert cpu < 0.3, f"the target used {cpu:.2f} s of CPU in 1 s: its reactor spins"
        assert target.ask("free") == "freed"
        initiator.create_backend(BackendType.TCP, TcpBackendConfig(transfer_timeout_ms=5000))
        initiator.register_remote_engine(target.desc)
        src = np.arange(4096, dtype=np.uint32).view(np.uint8)[:4096].copy()
        st = _write_ok(initiator, initiator.register_array(src), target.mem, src.size)
        assert st.Succeeded(), st.Message()
        expect = hashlib.sha256(src.tobytes() + bytes(target.mem.size - src.size)).hexdigest()
        assert target.ask("sha") == expect
    finally:
        if waiting is not None:
            waiting.close()
        initiator.close()
        log = target.close()
    lines = [ln for ln in log.splitlines() if b"accept failed" in ln]
    print(len(log), "bytes of log;", len(lines), "accept warnings")
    assert 1 <= len(lines) <= 5 and len(log) < 8192, log[-2000:]


FORGED = b"evil\n[mori 2026-01-01 00:00:00.000000 1:1 io ERROR x.cpp:1] forged"


def test_peer_keys_cannot_forge_or_flood_log_lines(tmp_path):
    """An initiator's key reaches the target's log escaped and truncated: a newline in it
    starts no line, and a 4 KiB key writes a bounded one."""
    target = _Target(tmp_path, env={"MORI_LOG_LEVEL": "debug"})
    try:
        for key in (FORGED, b"k" * 4096):
            s = _hello(target.desc.port, key, target.desc.secret)
            s.close()
        time.sleep(0.3)  # the target logs the connections and their close
    finally:
        log = target.close()
    lines = log.splitlines()
    for ln in lines:
        assert not ln.startswith(b"[mori 2026-01-01"), f"forged log line: {ln!r}"
        assert len(ln) < 512, f"log line of {len(ln)} bytes: {ln[:200]!r}..."
    assert any(b"inbound connection from 'evil\\n[mori" in ln for ln in lines), log[-2000:]
    assert any(b"'" + b"k" * 64 + b"...' (4096 bytes)" in ln for ln in lines), log[-2000:]


def test_peer_keys_are_escaped_in_inbound_statuses():
    """The message of a refused inbound transfer names its initiator escaped too."""
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    mem = target.register_array(np.zeros(4096, np.uint8))
    key = FORGED + b"x" * 3000  # a hello carries at most 4096 bytes
    s = _hello(target._engine.port, key, target._engine.secret)
    try:
        s.settimeout(5)
        s.sendall(HDR.pack(K_WRITE, 0, VERSION, 1, 7, mem.id, 4096, 16, mem.capability) + bytes(16))
        ack = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert ack[0] == K_WRITE_ACK and ack[1] != 0
        st = target.pop_inbound_transfer_status(key.decode(), 7)
        assert st is not None and st.Failed()
        msg = st.Message()
        assert "\n" not in msg and len(msg) < 512, msg
        assert "'evil\\n[mori" in msg and "bytes)" in msg, msg
    finally:
        s.close()
        target.close()


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("route", ["tcp", "cma", "mapped"])
def test_a_refused_write_lands_no_byte(engine_pair, route, batch):
    """A write with one span past the target's registered region is refused whole: none
    of its in-bounds parts or spans land. The initiator's descriptor claims more than the
    target registered (stale or wrong), so only the target can tell."""
    backends = (BackendType.TCP,) if route == "tcp" else (BackendType.TCP, BackendType.SHM)
    a, b = engine_pair(*backends)
    size = 3 * MIB // 2
    block = allocate_shared_host_memory(size) if route == "mapped" else np.empty(size, np.uint8)
    dst = np.asarray(block)
    dst[:] = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
    before = hashlib.sha256(dst.tobytes()).hexdigest()
    remote = dataclasses.replace(MemoryDesc.unpack(b.register_array(dst).pack()), size=2 * MIB)
    src = np.full(2 * MIB, 0xAB, np.uint8)
    sess = a.create_session(a.register_array(src), remote)
    assert sess.backend()[0] == ("TCP" if route == "tcp" else "SHM"), sess.backend()
    uid = a.allocate_transfer_uid()
    if batch:  # four spans, two parts per connection; only the last one is out of bounds
        offs = [0, 4096, 2 * 4096, size - 2048]
        st = sess.batch_write([0, 4096, 8192, 12288], offs, [4096] * 4, uid)
    else:  # two 1 MiB parts, the second past the region's end
        st = sess.write(0, 0, 2 * MIB, uid)
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS, "write hung"
    assert st.Failed() and st.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS, st.Message()
    time.sleep(0.2)  # any part still on its way would land meanwhile
    assert hashlib.sha256(dst.tobytes()).hexdigest() == before, "a refused write landed bytes"
    if route == "mapped":
        assert a._engine.shm_mapping_state("b", remote.id) == 1
    elif route == "cma":
        assert a._engine.shm_mapping_state("b", remote.id) != 1


def test_target_checks_a_multi_part_transfer_whole_before_any_part():
    """Spoken by hand: a part of a multi-part write lands only after its transfer's
    extent (kTransferExtent) passed the registry; a part without one closes the
    connection."""
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    buf = np.zeros(4096, np.uint8)
    mem = target.register_array(buf)
    s = _hello(target._engine.port, b"raw", target._engine.secret)
    try:
        s.settimeout(5)
        # Extent [0, 4097) is past the region: the in-bounds part that follows is refused.
        s.sendall(HDR.pack(K_EXTENT, 0, VERSION, 2, 5, mem.id, 0, buf.size + 1, mem.capability))
        s.sendall(HDR.pack(K_WRITE, 0, VERSION, 2, 5, mem.id, 0, 16, mem.capability) + b"\x07" * 16)
        ack = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert ack[0] == K_WRITE_ACK and ack[1] == K_OUT_OF_BOUNDS, ack
        # Within bounds: served.
        s.sendall(HDR.pack(K_EXTENT, 0, VERSION, 2, 6, mem.id, 0, 32, mem.capability))
        s.sendall(
            HDR.pack(K_WRITE, 0, VERSION, 2, 6, mem.id, 16, 16, mem.capability) + b"\x08" * 16
        )
        ack = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert ack[0] == K_WRITE_ACK and ack[1] == 0, ack
        assert not buf[:16].any() and (buf[16:32] == 8).all() and not buf[32:].any()
        # A part of another multi-part transfer, without its extent: a protocol violation.
        s.sendall(HDR.pack(K_WRITE, 0, VERSION, 2, 7, mem.id, 0, 16, mem.capability) + b"\x09" * 16)
        try:
            assert s.recv(HDR.size) == b"", "the target answered a part without an extent"
        except ConnectionResetError:
            pass
        assert not buf[:16].any()
    finally:
        s.close()
        target.close()


def _sha(buf):
    return hashlib.sha256(buf.tobytes()).hexdigest()


def _closed_without_answer(s, timeout_s=5):
    """True once the target closed `s` without sending a byte (a reset counts)."""
    s.settimeout(timeout_s)
    try:
        return s.recv(HDR.size) == b""
    except ConnectionResetError:
        return True


def _refused_for_now(s, timeout_s=5):
    """True once the target closed `s` having sent nothing but kIdleClose (what it tells a
    hello that holds its secret but may not speak for its key: connect again later)."""
    s.settimeout(timeout_s)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got in (b"", HDR.pack(K_IDLE_CLOSE, 0, VERSION, 0, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("hello", ["no-secret-short", "no-secret", "zeros", "one-bit-off"])
def test_a_hello_without_the_target_secret_is_refused(hello, capfd):
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    buf = np.zeros(4096, np.uint8)
    mem = target.register_array(buf)
    before = _sha(buf)
    real = target._engine.secret
    assert len(real) == 16 and real != bytes(16)
    key = b"raw-initiator-key"  # longer than a secret: its head cannot pass for one
    if hello == "no-secret-short":
        key = b"raw"
    if hello.startswith("no-secret"):  # the version-6 hello: the key alone
        payload = key
    elif hello == "zeros":
        payload = bytes(16) + key
    else:
        payload = bytes([real[0] ^ 1]) + real[1:] + key
    s = socket.create_connection(("127.0.0.1", target._engine.port), timeout=5)
    try:
        s.sendall(HDR.pack(K_HELLO, 0, VERSION, 0, 0, 0, 0, len(payload), 0) + payload)
        s.sendall(HDR.pack(K_WRITE, 0, VERSION, 1, 7, mem.id, 0, 16, mem.capability) + b"\x07" * 16)
        assert _closed_without_answer(s), "the target answered a connection without its secret"
    finally:
        s.close()
    assert _sha(buf) == before, "a connection without the secret wrote into a region"
    assert target.pop_inbound_transfer_status(key.decode(), 7) is None
    assert target._engine.hellos_refused == 1
    if hello != "no-secret-short":  # the key was read: the refusal names it
        assert "lacks this engine's secret" in capfd.readouterr().err
    # An initiator given the EngineDesc is served as before.
    initiator = IOEngine("initiator")
    initiator.create_backend(BackendType.TCP)
    initiator.register_remote_engine(target.get_engine_desc())
    src = np.full(4096, 3, np.uint8)
    assert _write_ok(initiator, initiator.register_array(src), mem, 4096).Succeeded()
    assert np.array_equal(buf, src) and target._engine.hellos_refused == 1
    initiator.close()
    target.close()


def test_an_engine_desc_without_the_secret_cannot_connect():
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    buf = np.zeros(64, np.uint8)
    mem = target.register_array(buf)
    initiator = IOEngine("initiator")
    initiator.create_backend(BackendType.TCP)
    initiator.register_remote_engine(dataclasses.replace(target.get_engine_desc(), secret=b""))
    st = initiator.write(initiator.register_array(np.ones(64, np.uint8)), 0, mem, 0, 64,
                         initiator.allocate_transfer_uid())  # fmt: skip
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Failed(), st.Message()
    assert not buf.any() and target._engine.hellos_refused >= 1
    initiator.close()
    target.close()


@pytest.mark.io_testing
def test_siphash_matches_its_published_vectors():
    key = bytes(range(16))
    assert T.siphash24(key, bytes(range(15))) == 0xA129CA6149BE45E5  # the paper's example
    assert T.siphash24(key, b"") == 0x726FDB47DD0E0E31


def _announce(port, target_secret, key, credential, uid, mem_id, capability=None):
    """A raw hello claiming `key` (with `credential`, or none), then (given the region's
    `capability`) a CMA grant of `mem_id`, and an announcement that transfer `uid` of that
    key wrote 64 bytes into `mem_id` (kP2pWriteDone)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    n = len(key) if credential else 0
    payload = target_secret + key + credential
    s.sendall(HDR.pack(K_HELLO, 0, VERSION, n, 0, 0, 0, len(payload), 0) + payload)
    if capability is not None:
        s.sendall(HDR.pack(K_SHM_CMA_REQ, 0, VERSION, 0, 0, mem_id, 0, 0, capability))
        grant = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert grant[0] == K_SHM_CMA_GRANT and grant[1] == 0, grant
        s.recv(grant[7], socket.MSG_WAITALL)
    s.sendall(HDR.pack(15, 0, VERSION, 1, uid, mem_id, 0, 64, 0))
    return s


@pytest.mark.io_testing
def test_a_hello_cannot_speak_for_another_initiator():
    """A hello proves its key with a MAC of the target's secret and the key under the
    initiator's own engine secret. A peer holding only the target's EngineDesc cannot
    speak for an initiator the target registered (announce writes for its uids, take its
    notice ring), nor for an unregistered one while that one's connections are open:
    the connection is closed unread. Whoever holds the initiator's EngineDesc can (the
    trust model's rule), and the real initiators keep working."""
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    target.create_backend(BackendType.SHM)  # the proven peer takes a CMA grant
    a, c = IOEngine("a"), IOEngine("c")
    buf = np.zeros(4096, np.uint8)
    mem = target.register_array(buf)
    try:
        for e in (a, c):
            e.create_backend(BackendType.TCP)
            e.register_remote_engine(target.get_engine_desc())
        target.register_remote_engine(a.get_engine_desc())  # c stays unregistered there
        src = {e: np.full(64, i + 1, np.uint8) for i, e in enumerate((a, c))}
        local = {e: e.register_array(src[e]) for e in (a, c)}
        for e in (a, c):
            assert _write_ok(e, local[e], mem, 64).Succeeded()
        port, ts = target._engine.port, target._engine.secret
        refused = target._engine.hellos_refused
        wrong_secret = bytes(16)
        forged = [
            (b"a", b""),  # no credential
            (b"a", os.urandom(16)),
            (b"a", T.initiator_credential(wrong_secret, ts, b"a")),
            (b"a", T.initiator_credential(a._engine.secret, ts, b"c")),  # another key's
            (b"c", b""),
            (b"c", os.urandom(16)),
        ]
        for key, credential in forged:
            s = _announce(port, ts, key, credential, 4242, mem.id)
            try:
                assert _refused_for_now(s), f"a hello speaking for {key!r} was served"
            finally:
                s.close()
        assert target._engine.hellos_refused == refused + len(forged)
        time.sleep(0.1)
        for key in ("a", "c"):
            assert target.pop_inbound_transfer_status(key, 4242) is None, key
        # Holding a's EngineDesc (its secret) is what it takes to speak for it.
        good = T.initiator_credential(a._engine.secret, ts, b"a")
        s = _announce(port, ts, b"a", good, 4243, mem.id, mem.capability)
        try:
            deadline = time.monotonic() + 10
            while (st := target.pop_inbound_transfer_status("a", 4243)) is None:
                assert time.monotonic() < deadline, "a proven hello was not served"
                time.sleep(0.005)
            assert st.Succeeded()
        finally:
            s.close()
        for e in (a, c):
            assert _write_ok(e, local[e], mem, 64).Succeeded()
        assert np.array_equal(buf[:64], src[c])
    finally:
        a.close()
        c.close()
        target.close()


def test_announcements_need_a_grant_of_the_region():
    """A proven initiator announcing a one-sided write (kP2pWriteDone) into a region it
    holds no grant of (P2P, shared-memory map, CMA) cannot have made it: the announcement
    is refused and counted, and pop_inbound_transfer_status finds nothing; with a grant of
    that region the same announcement is recorded. The connection stays open."""
    target = IOEngine("target")
    try:
        target.create_backend(BackendType.TCP)
        target.create_backend(BackendType.SHM)
        held, other = (target.register_array(np.zeros(4096, np.uint8)) for _ in range(2))
        port, ts = target._engine.port, target._engine.secret
        refused = target._engine.announcements_refused
        s = _announce(port, ts, b"raw-announcer", b"", 51, other.id)  # no grant at all
        try:
            # A grant of one region does not cover another.
            s.sendall(HDR.pack(K_SHM_CMA_REQ, 0, VERSION, 0, 0, held.id, 0, 0, held.capability))
            grant = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
            assert grant[0] == K_SHM_CMA_GRANT and grant[1] == 0, grant
            s.recv(grant[7], socket.MSG_WAITALL)
            s.sendall(HDR.pack(15, 0, VERSION, 1, 52, other.id, 0, 64, 0))
            s.sendall(HDR.pack(15, 0, VERSION, 1, 53, held.id, 0, 64, 0))
            deadline = time.monotonic() + 10
            while (st := target.pop_inbound_transfer_status("raw-announcer", 53)) is None:
                assert time.monotonic() < deadline, "the granted announcement was not recorded"
                time.sleep(0.005)
            assert st.Succeeded()
            for uid in (51, 52):
                assert target.pop_inbound_transfer_status("raw-announcer", uid) is None, uid
            assert target._engine.announcements_refused == refused + 2
            s.settimeout(0.2)
            with pytest.raises(TimeoutError):  # still open, nothing more to read
                s.recv(1)
        finally:
            s.close()
    finally:
        target.close()
