# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The engine's failure contract (README, "Failure behaviour"): a live but stuck peer
(SIGSTOP, or a socket that never reads) fails its transfers within transfer_timeout_ms while the engine serves
others; deregistering memory that transfers still use is refused; unpopped inbound
statuses stay bounded."""

import os
import random
import signal
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

import mori.core as mc
from mori.io import (
    _C,
    BackendType,
    IOEngine,
    MemoryDesc,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
)

WORKER = str(Path(__file__).with_name("io_peer_worker.py"))
TIMEOUT_MS = 1000  # transfer_timeout_ms of the engines under test
# Detection is promised within the timeout plus one scan period (<= 200 ms); the rest
# is slack for a loaded 2-core CI machine.
BOUND_S = TIMEOUT_MS / 1000 + 1.5
MIB = 1 << 20


def _engine(key, **cfg):
    e = IOEngine(key)
    e.create_backend(BackendType.TCP, TcpBackendConfig(transfer_timeout_ms=TIMEOUT_MS, **cfg))
    return e


def _wait_failed(status, code):
    t0 = time.monotonic()
    assert status.WaitFor(int(BOUND_S * 1000) + 5000) != StatusCode.IN_PROGRESS, (
        "transfer to a stuck peer hung"
    )
    elapsed = time.monotonic() - t0
    assert status.Failed() and status.Detail() == code, (status.Detail(), status.Message())
    return elapsed


@pytest.fixture
def stopped_target(peer_target):
    """A target engine in another process; yields (desc, remote mem, seed, process)."""
    return peer_target


def test_stopped_peer_times_out_and_engine_serves_others(stopped_target):
    desc, remote, seed, proc = stopped_target
    eng = _engine("initiator", chunk_size=64 << 10)
    other = _engine("other")
    eng.register_remote_engine(desc)
    eng.register_remote_engine(other.get_engine_desc())
    buf = np.zeros(remote.size, np.uint8)
    mem = eng.register_array(buf)
    st = eng.read(mem, 0, remote, 0, 4096, eng.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()

    os.kill(proc.pid, signal.SIGSTOP)
    reads = eng.read(mem, 0, remote, 0, remote.size, eng.allocate_transfer_uid())
    wbuf = np.full(8 * MIB, 0x5A, np.uint8)
    writes = eng.write(
        eng.register_array(wbuf), 0, remote, 0, wbuf.size, eng.allocate_transfer_uid()
    )
    # Another peer is served while the stuck one's transfers wait for their deadline.
    obuf = np.arange(MIB, dtype=np.uint8)
    omem = MemoryDesc.unpack(other.register_array(obuf).pack())
    st = eng.write(mem, 0, omem, 0, MIB, eng.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert reads.InProgress(), "the stopped peer answered"
    # Memory a transfer still uses cannot be withdrawn.
    with pytest.raises(mc.InvalidStateError, match=r"has 1 transfer\(s\) in flight"):
        eng.deregister_memory(mem)

    for s in (reads, writes):
        assert _wait_failed(s, StatusDetail.ERR_TIMEOUT) < BOUND_S
        assert "stuck" in s.Message() and "transfer_timeout_ms 1000" in s.Message()
    assert eng._engine.ledger_stats()["live"] == 0
    # Later transfers fail at once, even after the peer resumes, until it is registered
    # again; then it is served as before.
    os.kill(proc.pid, signal.SIGCONT)
    st = eng.read(mem, 0, remote, 0, 16, eng.allocate_transfer_uid())
    assert st.Failed() and st.Detail() == StatusDetail.ERR_PEER_LOST
    assert "register it again" in st.Message()
    eng.register_remote_engine(desc)
    buf[:] = 0
    st = eng.read(mem, 0, remote, 0, remote.size, eng.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    expect = np.random.default_rng(seed).integers(0, 256, remote.size, dtype=np.uint8)
    # A failed write may have been partly applied: bytes the kernel had buffered for the
    # stopped target land when it resumes. Nothing else changed.
    head = slice(0, wbuf.size)
    assert np.all((buf[head] == expect[head]) | (buf[head] == 0x5A))
    assert np.array_equal(buf[wbuf.size :], expect[wbuf.size :])
    eng.deregister_memory(mem)  # nothing in flight any more
    eng.close()
    other.close()


HDR = struct.Struct("<BBHIQQQQQ")  # wire::Header: type, status, version, num_parts, uid,
VERSION = _C.wire_version  # mem_id, offset, length, capability


def _raw_initiator(target, key=b"raw"):
    """A peer speaking the wire protocol by hand that never reads its socket."""
    s = socket.create_connection(("127.0.0.1", target._engine.port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    secret = target._engine.secret  # a peer given the target's EngineDesc
    s.sendall(HDR.pack(1, 0, VERSION, 0, 0, 0, 0, len(secret) + len(key), 0) + secret + key)
    return s


def _deregister_when_free(eng, mem):
    t0 = time.monotonic()
    while True:
        try:
            eng.deregister_memory(mem)
            return time.monotonic() - t0
        except mc.InvalidStateError:
            assert time.monotonic() - t0 < BOUND_S, "the stuck connection was never closed"
            time.sleep(0.02)


def test_target_refuses_deregistration_while_serving_a_stuck_reader():
    target = _engine("target")
    buf = np.ones(32 * MIB, np.uint8)
    mem = target.register_array(buf)
    s = _raw_initiator(target)
    try:
        # 32 MiB of read response cannot fit the socket buffers of a peer that never reads.
        s.sendall(HDR.pack(3, 0, VERSION, 1, 7, mem.id, 0, buf.size, mem.capability))
        time.sleep(0.2)
        with pytest.raises(mc.InvalidStateError, match=r"memory \d+ of engine 'target' has 1 "):
            target.deregister_memory(mem)
        assert _deregister_when_free(target, mem) < BOUND_S
    finally:
        s.close()
        target.close()


def test_target_holds_memory_under_an_unfinished_shm_write_grant():
    target = _engine("target")
    target.create_backend(BackendType.SHM)
    buf = np.zeros(MIB, np.uint8)
    mem = target.register_array(buf)
    s = _raw_initiator(target)
    try:
        # A granted SHM write whose kShmWriteDone never comes: the initiator may still be
        # copying into the region, so it stays registered until the connection is dropped.
        s.sendall(HDR.pack(8, 0, VERSION, 1, 5, mem.id, 0, 4096, mem.capability))
        grant = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert grant[0] == 10 and grant[1] == 0 and grant[6] == buf.ctypes.data
        with pytest.raises(mc.InvalidStateError, match="1 transfer"):
            target.deregister_memory(mem)
        assert _deregister_when_free(target, mem) < BOUND_S
    finally:
        s.close()
        target.close()


def test_a_cma_grant_holder_that_never_lets_go_is_cut_off():
    """A CMA grant outlives a transfer, so deregistration revokes it (kP2pRevoke) and
    waits for the holder's acknowledgement, bounded by transfer_timeout_ms: a holder that
    never answers makes that deregister_memory raise TimeoutError naming it, with the
    region still registered, and is cut off (its connection closed, its grant dropped),
    so the next deregister_memory completes at once, while its socket is still open at
    its end."""
    target = _engine("target")
    target.create_backend(BackendType.SHM)
    buf = np.zeros(MIB, np.uint8)
    mem = target.register_array(buf)
    s = _raw_initiator(target)
    try:
        s.sendall(HDR.pack(29, 0, VERSION, 0, 0, mem.id, 0, 0, mem.capability))  # kShmCmaReq
        grant = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert grant[0] == 30 and grant[1] == 0 and grant[7] == 40, grant  # kShmCmaGrant
        pid, _, addr, size, _, _, tid, _ = struct.unpack(
            "<iiQQiIiI", s.recv(40, socket.MSG_WAITALL)
        )
        assert (pid, addr, size) == (os.getpid(), buf.ctypes.data, MIB)
        assert tid > 0  # the liveness word is offered
        # An id that is not registered is refused (kUnknownMemory) and records nothing.
        s.sendall(HDR.pack(29, 0, VERSION, 0, 0, mem.id + 1000, 0, 0, mem.capability))
        refusal = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert refusal[0] == 30 and refusal[1] == 1 and refusal[7] == 0, refusal
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="'raw', which did not confirm letting go"):
            target.deregister_memory(mem)
        assert time.monotonic() - t0 < BOUND_S
        revoke = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert revoke[0] == 21 and revoke[5] == mem.id, revoke  # kP2pRevoke
        assert target.pop_inbound_transfer_status("raw", 0) is None
        assert _closed_by_peer(s, BOUND_S), "the holder that did not confirm was not cut off"
        # Still registered after the raise: a real initiator writes into it.
        ini = _engine("ini")
        try:
            ini.register_remote_engine(target.get_engine_desc())
            src = np.full(4096, 7, np.uint8)
            st = ini.write(ini.register_array(src), 0, mem, 0, 4096, ini.allocate_transfer_uid())
            assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
            assert (buf[:4096] == 7).all()
        finally:
            ini.close()
        t0 = time.monotonic()
        target.deregister_memory(mem)  # the holder's grant was dropped: no wait
        assert time.monotonic() - t0 < 0.5
    finally:
        s.close()
    target.close()


def _closed_by_peer(s, timeout_s):
    """True once the peer closed `s` (FIN or RST) within timeout_s; False if it did not."""
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_connection_that_never_completes_its_hello_is_closed():
    """Before its hello an inbound connection is nobody's: one that sends nothing, or
    half a hello, is closed within peer_timeout_ms (plus a scan period) instead of
    holding a descriptor and a buffer for ever; initiators that do say hello still work."""
    target = _engine("target", peer_timeout_ms=500)
    buf = np.zeros(4096, np.uint8)
    mem = target.register_array(buf)
    port = target._engine.port
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)
    partial = socket.create_connection(("127.0.0.1", port), timeout=5)
    secret = target._engine.secret
    partial.sendall(HDR.pack(1, 0, VERSION, 0, 0, 0, 0, len(secret) + 3, 0) + secret[:5])
    try:
        t0 = time.monotonic()
        for s in (silent, partial):
            assert _closed_by_peer(s, 10), "a connection without a complete hello stayed open"
        assert time.monotonic() - t0 < 5
        s = _raw_initiator(target)  # a complete hello: served
        s.sendall(HDR.pack(2, 0, VERSION, 1, 7, mem.id, 0, 16, mem.capability) + b"\x05" * 16)
        ack = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert ack[0] == 4 and ack[1] == 0 and bytes(buf[:16]) == b"\x05" * 16
        s.close()
    finally:
        silent.close()
        partial.close()
        target.close()


def test_a_write_that_trickles_its_payload_cannot_hold_its_region():
    """Each byte of a payload resets the stuck clock, so a peer sending one byte every
    50 ms used to keep the region it writes into from being deregistered for as long as
    it liked. The payload now has transfer_timeout_ms (plus its length at 1 MiB/s) to
    arrive; then the connection is closed and deregistration goes through."""
    target = _engine("target")
    buf = np.zeros(MIB, np.uint8)
    mem = target.register_array(buf)
    s = _raw_initiator(target)
    try:
        s.sendall(HDR.pack(2, 0, VERSION, 1, 9, mem.id, 0, 64 << 10, mem.capability) + b"\x07")
        t0 = time.monotonic()
        took = None
        while time.monotonic() - t0 < BOUND_S + 3:
            try:
                s.sendall(b"\x07")
            except OSError:
                pass  # closed by the target: fine
            try:
                target.deregister_memory(mem)
                took = time.monotonic() - t0
                break
            except mc.InvalidStateError:
                time.sleep(0.05)
        assert took is not None, "a trickling write kept its region registered"
        assert took < BOUND_S + 1
    finally:
        s.close()
        target.close()


def test_unpopped_statuses_of_a_long_key_cost_memory_by_entry_not_by_key(rss_bytes):
    """A target whose application does not pop keeps up to max_inbound_statuses
    (65,536) statuses; announced under a 4000-byte key (the hello allows 4096), each one
    held a copy of the key (+256 MiB). The key is now shared by its statuses."""
    target = _engine("target")
    target.create_backend(BackendType.SHM)
    mem = target.register_array(np.zeros(4096, np.uint8))
    key = b"k" * 4000
    n = 1 << 16
    frames = b"".join(HDR.pack(15, 0, VERSION, 1, uid, mem.id, 0, 64, 0) for uid in range(1, n + 1))
    s = _raw_initiator(target, key=key)
    try:
        # Announcements count only for a region the initiator holds a grant of.
        s.sendall(HDR.pack(29, 0, VERSION, 0, 0, mem.id, 0, 0, mem.capability))  # kShmCmaReq
        grant = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert grant[0] == 30 and grant[1] == 0, grant
        s.recv(grant[7], socket.MSG_WAITALL)
        rss0 = rss_bytes()
        s.sendall(frames)  # kP2pWriteDone for uids 1..n: unanswered
        deadline = time.monotonic() + 60
        while target._engine.inbound_stats()["held"] < n:
            assert time.monotonic() < deadline, target._engine.inbound_stats()
            time.sleep(0.01)
        grown = rss_bytes() - rss0
        print(f"{n} statuses under a {len(key)}-byte key: +{grown / 2**20:.1f} MiB")
        assert grown < 64 << 20, f"+{grown / 2**20:.0f} MiB for {n} statuses"
        st = target.pop_inbound_transfer_status(key.decode(), 77)
        assert st is not None and st.Succeeded()
    finally:
        s.close()
        target.close()


def _ask_notice_ring(target, key):
    """(connection, status) of a kNoticeRingReq under `key`, its grant read."""
    s = _raw_initiator(target, key=key)
    s.sendall(HDR.pack(26, 0, VERSION, 0, 0, 0, 0, 0, 0))  # kNoticeRingReq
    h = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
    assert h[0] == 27, h  # kNoticeRingGrant
    if h[7]:
        s.recv(h[7], socket.MSG_WAITALL)
    return s, h[1]


def test_notice_rings_are_bounded_and_a_gone_initiator_gives_its_ring_up(monkeypatch):
    """Each initiator key that asked got a ring (131 KiB of shared memory and an fd) until
    shutdown, from any engine. Now an engine without SHM or P2P grants none, one grants
    at most MORI_IO_MAX_NOTICE_RINGS (beyond: refused, announcements go over TCP), a key
    asking again replaces its ring, and at the cap the rings of keys with no connection
    left are reclaimed."""
    monkeypatch.setenv("MORI_IO_MAX_NOTICE_RINGS", "3")
    target = _engine("target")
    target.create_backend(BackendType.SHM)
    tcp_only = _engine("tcp-only")
    socks = []
    try:
        s, status = _ask_notice_ring(tcp_only, b"k")
        s.close()
        assert status == 10 and tcp_only._engine.notice_rings_granted == 0  # kNotShareable
        for i in range(5):
            s, status = _ask_notice_ring(target, f"k{i}".encode())
            socks.append(s)
            assert status == (0 if i < 3 else 10), (i, status)
        assert target._engine.notice_rings_granted == 3
        s, status = _ask_notice_ring(target, b"k1")  # a holder asks again: replaced
        socks.append(s)
        assert status == 0 and target._engine.notice_rings_granted == 3
        socks[0].close()  # k0 has no connection left
        deadline = time.monotonic() + BOUND_S
        while True:
            s, status = _ask_notice_ring(target, b"k3")
            socks.append(s)
            if status == 0:
                break
            assert time.monotonic() < deadline, "the ring of a gone initiator was not reclaimed"
            time.sleep(0.02)
        assert target._engine.notice_rings_granted == 3
    finally:
        for s in socks:
            s.close()
        target.close()
        tcp_only.close()


def test_a_peer_that_floods_reads_and_never_takes_the_answers_is_bounded(rss_bytes):
    """A peer sending read requests without ever reading the answers kept the target
    reading them (each request refreshed the stuck clock) and queueing answers without
    bound, each answer holding the region (deregistration refused throughout). The target
    now stops reading from a connection whose answers pile up, so the flood stalls, the
    connection is closed as stuck and the region can be deregistered; the target's memory
    stays bounded meanwhile."""
    import threading

    target = _engine("target")
    buf = np.ones(MIB, np.uint8)
    mem = target.register_array(buf)
    s = _raw_initiator(target)
    s.settimeout(0.5)
    chunk = b"".join(
        HDR.pack(3, 0, VERSION, 1, 7, mem.id, 0, 64 << 10, mem.capability) for _ in range(10_000)
    )
    stop = threading.Event()
    first_sent = threading.Event()

    def flood():
        while not stop.is_set():
            try:
                s.sendall(chunk)  # kRead x 10,000, answers never read
                first_sent.set()
            except TimeoutError:
                continue  # the target stopped reading: keep trying
            except OSError:
                return  # closed by the target

    rss0 = rss_bytes()
    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        assert first_sent.wait(10), "the flood did not start"
        time.sleep(0.2)
        # Served: answers are queued, each holding the region.
        with pytest.raises(mc.InvalidStateError):
            target.deregister_memory(mem)
        t0 = time.monotonic()
        took = None
        peak = 0
        while time.monotonic() - t0 < BOUND_S + 3:
            peak = max(peak, rss_bytes() - rss0)
            try:
                target.deregister_memory(mem)
                took = time.monotonic() - t0
                break
            except mc.InvalidStateError:
                time.sleep(0.05)
        print(f"deregistered after {took} s; target RSS +{peak / 2**20:.1f} MiB at most")
        assert took is not None, "a flood of unread reads kept the region registered"
        assert peak < 256 << 20, f"the target grew by {peak / 2**20:.0f} MiB"
    finally:
        stop.set()
        flooder.join(10)
        s.close()
        target.close()
    assert not flooder.is_alive()


def test_no_write_lands_after_deregistration_returned():
    target = _engine("target")
    buf = np.zeros(4 * MIB, np.uint8)
    mem = target.register_array(buf)
    s = _raw_initiator(target)
    try:
        # Half of a write's payload: the target is mid-write into the region.
        s.sendall(HDR.pack(2, 0, VERSION, 1, 9, mem.id, 0, 2 * MIB, mem.capability) + b"\x07" * MIB)
        time.sleep(0.2)
        with pytest.raises(mc.InvalidStateError, match="1 transfer"):
            target.deregister_memory(mem)
        _deregister_when_free(target, mem)
        before = buf.copy()
        try:
            s.sendall(b"\x07" * MIB)  # the rest, after deregistration returned
        except OSError:
            pass  # the target closed the connection: fine
        time.sleep(0.2)
        assert np.array_equal(buf, before), "bytes landed after deregistration returned"
    finally:
        s.close()
        target.close()


def test_unpopped_inbound_statuses_are_capped_oldest_first():
    cap = 4
    a = _engine("a")
    b = _engine("b", max_inbound_statuses=cap)
    a.register_remote_engine(b.get_engine_desc())
    x = np.arange(4096, dtype=np.uint8)
    mx = a.register_array(x)
    my = MemoryDesc.unpack(b.register_array(np.zeros(4096, np.uint8)).pack())
    uids = []
    for _ in range(3 * cap + 1):
        uids.append(a.allocate_transfer_uid())
        st = a.write(mx, 0, my, 0, 4096, uids[-1])
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    stats = b._engine.inbound_stats()
    assert (stats["held"], stats["evicted"], stats["initiators"]) == (cap, 2 * cap + 1, 1), stats
    for uid in uids[:-cap]:
        assert b.pop_inbound_transfer_status("a", uid) is None
    for uid in uids[-cap:]:
        st = b.pop_inbound_transfer_status("a", uid)
        assert st is not None and st.Succeeded()
    assert b._engine.inbound_stats()["held"] == 0
    # Popping as they come keeps nothing, however many transfers pass.
    for _ in range(200):
        uid = a.allocate_transfer_uid()
        assert a.write(mx, 0, my, 0, 64, uid).WaitFor(10000) != StatusCode.IN_PROGRESS
        assert b.pop_inbound_transfer_status("a", uid).Succeeded()
    stats = b._engine.inbound_stats()
    # Nothing held: not even the initiator's key.
    assert stats["held"] == stats["initiators"] == stats["bytes"] == 0, stats
    assert stats["evicted"] == 2 * cap + 1, stats
    a.close()
    b.close()


def test_shm_read_grant_holds_the_region_until_the_read_is_done():
    """A granted SHM read holds the target's region until the initiator says its CMA
    copy out of it ended (kShmReadDone): deregistration cannot free memory a peer is
    still reading. Spoken by hand so the window is exact."""
    target = _engine("target")
    target.create_backend(BackendType.SHM)
    buf = np.ones(4096, np.uint8)
    mem = target.register_array(buf)
    s = _raw_initiator(target)
    try:
        s.settimeout(5)
        s.sendall(HDR.pack(9, 0, VERSION, 1, 3, mem.id, 0, 16, mem.capability))  # kShmReadReq
        t, status, *_ = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
        assert (t, status) == (10, 0)  # kShmGrant, ok
        with pytest.raises(mc.InvalidStateError, match="has 1 transfer"):
            target.deregister_memory(mem)
        s.sendall(HDR.pack(23, 0, VERSION, 1, 3, mem.id, 0, 0, mem.capability))  # kShmReadDone
        assert _deregister_when_free(target, mem) < BOUND_S
        # A done with no granted read is a protocol violation: the connection closes.
        s.sendall(HDR.pack(23, 0, VERSION, 1, 4, mem.id, 0, 0, mem.capability))
        assert _closed_by_peer(s, 5)
    finally:
        s.close()
        target.close()


def test_tcp_write_announcements_start_the_stall_clock(monkeypatch):
    """With the notice ring off, every SHM-over-CMA write is announced by a TCP message
    that answers nothing. The connection it rides is busy from the moment the message is
    queued: its stall clock starts then, not at the connection's last byte (never, on a
    connection that carried nothing yet, or long ago on one that idled). Batches of
    64 x 2 MiB (the reactor copies half of each, then scans for stuck connections),
    first on fresh connections and again after idling past transfer_timeout_ms, all
    complete with exact bytes and every write's status reaches the target."""
    monkeypatch.setenv("MORI_IO_SHM_MAP", "0")
    monkeypatch.setenv("MORI_IO_NOTICE_RING", "0")
    timeout_ms = 40  # the reaper scans every 10 ms
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    a, b = (IOEngine(k) for k in ("a", "b"))
    try:
        for e in (a, b):
            e.create_backend(BackendType.TCP, TcpBackendConfig(transfer_timeout_ms=timeout_ms))
            e.create_backend(BackendType.SHM)
        a.register_remote_engine(b.get_engine_desc())
        b.register_remote_engine(a.get_engine_desc())
        n, size = 64, 2 * MIB
        src = rng.integers(0, 256, n * size, dtype=np.uint8)
        dst = np.zeros(n * size, np.uint8)
        ms, md = a.register_array(src), b.register_array(dst)
        sess = a.create_session(ms, md)
        assert sess.backend()[0] == "SHM" and "CMA" in sess.backend()[1], sess.backend()
        offs = [i * size for i in range(n)]
        uids = []
        for rep in range(12):
            if rep % 4 == 3:
                time.sleep(3 * timeout_ms / 1000)  # idle past the bound, then busy again
            src[:] = rng.integers(0, 256, n * size, dtype=np.uint8)
            uid = a.allocate_transfer_uid()
            st = sess.batch_write(offs, offs, [size] * n, uid)
            assert st.WaitFor(20000) != StatusCode.IN_PROGRESS, "batch write hung"
            assert st.Succeeded(), f"repetition {rep}: {st.Message()}"
            assert np.array_equal(dst, src), f"repetition {rep}: bytes differ"
            uids.append(uid)
        deadline = time.monotonic() + 10
        for uid in uids:
            while (got := b.pop_inbound_transfer_status("a", uid)) is None:
                assert time.monotonic() < deadline, f"no inbound status for uid {uid}"
                time.sleep(0.002)
            assert got.Succeeded(), got.Message()
    finally:
        a.close()
        b.close()


def test_an_idle_connection_is_closed_and_the_next_transfer_reconnects():
    """A target closes authenticated inbound connections that carried nothing for
    idle_timeout_ms (telling the initiator first); the initiator's next transfer, through
    the engine or a session made before the close, connects again and moves exact bytes.
    With idle_timeout_ms=0 nothing is closed."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    idle_ms = 300
    target = IOEngine("idle-target")
    initiator = _engine("idle-initiator")
    never = IOEngine("never-idle")
    try:
        target.create_backend(BackendType.TCP, TcpBackendConfig(idle_timeout_ms=idle_ms))
        never.create_backend(BackendType.TCP, TcpBackendConfig(idle_timeout_ms=0))
        dst = np.zeros(MIB, np.uint8)
        md = target.register_array(dst)
        still = np.zeros(4096, np.uint8)
        mnever = never.register_array(still)
        src = rng.integers(0, 256, MIB, dtype=np.uint8)
        ms = initiator.register_array(src)
        initiator.register_remote_engine(target.get_engine_desc())
        initiator.register_remote_engine(never.get_engine_desc())
        sess = initiator.create_session(ms, md)

        def write(offset, size, via_session):
            src[offset : offset + size] = rng.integers(0, 256, size, dtype=np.uint8)
            uid = initiator.allocate_transfer_uid()
            if via_session:
                st = sess.write(offset, offset, size, uid)
            else:
                st = initiator.write(ms, offset, md, offset, size, uid)
            assert st.WaitFor(10000) != StatusCode.IN_PROGRESS, "write hung"
            assert st.Succeeded(), st.Message()
            assert np.array_equal(dst[offset : offset + size], src[offset : offset + size])

        write(0, 4096, False)
        st = initiator.write(ms, 0, mnever, 0, 4096, initiator.allocate_transfer_uid())
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        for round_, via_session in enumerate((False, True, False)):
            before = target._engine.idle_connections_closed
            deadline = time.monotonic() + idle_ms / 1000 + 3
            while target._engine.idle_connections_closed == before:
                assert time.monotonic() < deadline, "the idle connections were not closed"
                time.sleep(0.05)
            time.sleep(0.1)  # the initiator has seen the close
            write(round_ * 8192, 8192 if round_ < 2 else MIB - 16384, via_session)
        assert never._engine.idle_connections_closed == 0
        st = initiator.write(ms, 0, mnever, 0, 4096, initiator.allocate_transfer_uid())
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        assert np.array_equal(still, src[:4096])
    finally:
        for e in (initiator, target, never):
            e.close()
