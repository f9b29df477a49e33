# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""What a peer holding the target's EngineDesc can make the target keep is bounded, and
goes with the peer: inbound statuses (by count and bytes; a refused request naming no
region of the target records none), region grants (by holders and pairs; dropped once
their holder has no connection left), and the hold on an unregistered initiator's key
(which ends with the squatter's connections, without re-registering). Spoken by hand
on raw sockets where a real engine would not misbehave."""

import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from mori.io import (
    _C,
    BackendType,
    IOEngine,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
)

HDR = struct.Struct("<BBHIQQQQQ")  # wire::Header: type, status, version, num_parts, uid,
VERSION = _C.wire_version  # mem_id, offset, length, capability
K_HELLO, K_WRITE, K_WRITE_ACK = 1, 2, 4  # wire::MsgType
K_REVOKE, K_REVOKE_ACK, K_CMA_REQ, K_CMA_GRANT = 21, 22, 29, 30
UNKNOWN_MEMORY, OUT_OF_BOUNDS, TOO_MANY_GRANTS = 1, 2, 11  # wire::WireStatus
LONG = 4000  # bytes of the long keys (a hello carries at most 4096)


def _key(i):
    return b"%06d" % i + b"k" * (LONG - 6)


def _hello(port, secret, key, credential=b""):
    """A raw connection whose hello presents the target's `secret` (a peer given its
    EngineDesc) and claims `key`, with `credential` (none: a hello without one)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    n = len(key) if credential else 0
    payload = secret + key + credential
    s.sendall(HDR.pack(K_HELLO, 0, VERSION, n, 0, 0, 0, len(payload), 0) + payload)
    return s


def _recv_header(s):
    data = s.recv(HDR.size, socket.MSG_WAITALL)
    assert len(data) == HDR.size, f"the target closed the connection ({len(data)} bytes)"
    return HDR.unpack(data)


def _ask_cma_grant(s, mem):
    """kShmCmaReq for `mem` on `s`: the grant's status (its payload read)."""
    s.sendall(HDR.pack(K_CMA_REQ, 0, VERSION, 0, 0, mem.id, 0, 0, mem.capability))
    h = _recv_header(s)
    assert h[0] == K_CMA_GRANT, h
    if h[7]:
        s.recv(h[7], socket.MSG_WAITALL)
    return h[1]


def _wait(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


# (A) Inbound statuses.


def test_refused_writes_naming_no_region_of_the_target_record_no_status():
    """Writes under distinct 4000-byte keys into an id the target never registered, or
    into a registered one without its capability, are refused (ERR_NOT_FOUND at the
    initiator) and recorded nowhere: each was held as an unpopped status (about 12.8 KB
    with its key) before, so a peer with only the EngineDesc grew the target without
    bound. A refusal of a request that named the region under its capability (out of
    bounds) is still recorded, with the code the initiator got."""
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    buf = np.zeros(4096, np.uint8)
    mem = target.register_array(buf)
    port, secret = target._engine.port, target._engine.secret
    n = 300
    try:
        for i in range(n):
            s = _hello(port, secret, _key(i))
            try:
                no_cap = HDR.pack(K_WRITE, 0, VERSION, 1, 2 * i + 1, mem.id, 0, 16, 0)
                no_id = HDR.pack(
                    K_WRITE, 0, VERSION, 1, 2 * i + 2, mem.id + 7, 0, 16, mem.capability
                )
                s.sendall(no_cap + b"\x01" * 16 + no_id + b"\x02" * 16)
                for _ in range(2):
                    ack = _recv_header(s)
                    assert ack[0] == K_WRITE_ACK and ack[1] == UNKNOWN_MEMORY, ack
            finally:
                s.close()
        stats = target._engine.inbound_stats()
        print("after", n, "keys:", stats)
        assert stats["held"] == 0 and stats["initiators"] == 0 and stats["bytes"] == 0, stats
        assert stats["unrecorded"] == 2 * n, stats
        assert target.pop_inbound_transfer_status(_key(0).decode(), 1) is None
        assert not buf.any()
        # Out of bounds of a region named with its capability: recorded, as the invalid
        # argument MORI calls it (the detail says which), not as a failed RDMA operation.
        s = _hello(port, secret, b"oob")
        try:
            s.sendall(HDR.pack(K_WRITE, 0, VERSION, 1, 9, mem.id, 4090, 16, mem.capability))
            s.sendall(b"\x03" * 16)
            ack = _recv_header(s)
            assert ack[0] == K_WRITE_ACK and ack[1] == OUT_OF_BOUNDS, ack
            _wait(
                lambda: target._engine.inbound_stats()["held"] == 1, 5, "the refusal was not kept"
            )
            st = target.pop_inbound_transfer_status("oob", 9)
            assert st is not None and st.Failed()
            assert st.Code() == StatusCode.ERR_INVALID_ARGS, (st.Code(), st.Message())
            assert st.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS, st.Message()
            assert "out of bounds" in st.Message() and "'oob'" in st.Message(), st.Message()
        finally:
            s.close()
        assert target._engine.inbound_stats()["initiators"] == 0  # the key went with it
    finally:
        target.close()


def test_a_write_whose_region_goes_between_its_parts_ends_as_a_failure():
    """The first part of a two-part write lands and is recorded; the region is then
    deregistered, so the second part is refused as naming no region. That refusal is
    recorded (its transfer has a status already), so the status completes, as a
    failure: a refusal that starts no status would have left it unfinished for good."""
    K_EXTENT = 28  # wire::MsgType::kTransferExtent
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    buf = np.zeros(8192, np.uint8)
    mem = target.register_array(buf)
    port, secret = target._engine.port, target._engine.secret
    s = _hello(port, secret, b"racer")
    try:
        s.sendall(HDR.pack(K_EXTENT, 0, VERSION, 2, 7, mem.id, 0, 8192, mem.capability))
        s.sendall(HDR.pack(K_WRITE, 0, VERSION, 2, 7, mem.id, 0, 4096, mem.capability))
        s.sendall(b"\x05" * 4096)
        ack = _recv_header(s)
        assert ack[0] == K_WRITE_ACK and ack[1] == 0, ack
        _wait(lambda: target._engine.inbound_stats()["held"] == 1, 5, "part 1 not recorded")
        assert target.pop_inbound_transfer_status("racer", 7) is None  # 1 of 2 parts in
        target.deregister_memory(mem)
        s.sendall(HDR.pack(K_WRITE, 0, VERSION, 2, 7, mem.id, 4096, 4096, mem.capability))
        s.sendall(b"\x06" * 4096)
        ack = _recv_header(s)
        assert ack[0] == K_WRITE_ACK and ack[1] == UNKNOWN_MEMORY, ack
        st = None
        deadline = time.monotonic() + 5
        while st is None and time.monotonic() < deadline:
            st = target.pop_inbound_transfer_status("racer", 7)
            time.sleep(0.01)
        assert st is not None, "the status of a write refused half-way never completed"
        assert st.Failed() and st.Code() == StatusCode.ERR_NOT_FOUND, (st.Code(), st.Message())
        assert (buf[:4096] == 5).all() and not buf[4096:].any()
    finally:
        s.close()
        target.close()


def test_unpopped_statuses_are_bounded_in_bytes_oldest_first(rss_bytes):
    """Successful writes under 1000 distinct 4000-byte keys, never popped: within
    max_inbound_status_bytes (1 MiB here) the newest are kept, the oldest dropped and
    counted; popping the rest frees every key. Before, only the 65,536-status cap held,
    which such keys filled at about 800 MiB."""
    bound = 1 << 20
    target = IOEngine("target")
    target.create_backend(BackendType.TCP, TcpBackendConfig(max_inbound_status_bytes=bound))
    mem = target.register_array(np.zeros(4096, np.uint8))
    port, secret = target._engine.port, target._engine.secret
    n = 1000
    rss0 = rss_bytes()
    try:
        for i in range(n):
            s = _hello(port, secret, _key(i))
            try:
                s.sendall(HDR.pack(K_WRITE, 0, VERSION, 1, i + 1, mem.id, 0, 16, mem.capability))
                s.sendall(b"\x05" * 16)
                ack = _recv_header(s)
                assert ack[0] == K_WRITE_ACK and ack[1] == 0, ack
            finally:
                s.close()

        def accounted():
            stats = target._engine.inbound_stats()
            return stats["held"] + stats["evicted"] == n

        _wait(accounted, 5, "not every write was accounted")
        stats = target._engine.inbound_stats()
        grown = rss_bytes() - rss0
        print(f"{n} keys of {LONG} bytes: {stats}, +{grown / 2**20:.1f} MiB RSS")
        assert stats["bytes"] <= bound, stats
        assert stats["held"] >= bound // (2 * LONG) and stats["evicted"] > 0, stats
        assert stats["held"] == stats["initiators"], stats  # one status per key
        assert grown < 16 << 20, f"+{grown / 2**20:.0f} MiB"
        kept = stats["held"]
        assert target.pop_inbound_transfer_status(_key(0).decode(), 1) is None  # oldest went
        for i in range(n - kept, n):
            st = target.pop_inbound_transfer_status(_key(i).decode(), i + 1)
            assert st is not None and st.Succeeded(), i
        stats = target._engine.inbound_stats()
        assert stats["held"] == stats["initiators"] == stats["bytes"] == 0, stats
        with pytest.raises(Exception, match="max_inbound_status_bytes"):
            IOEngine("small").create_backend(
                BackendType.TCP, TcpBackendConfig(max_inbound_status_bytes=4096)
            )
    finally:
        target.close()


# (B) Region grants.


def _shm_target(key="target", **cfg):
    target = IOEngine(key)
    target.create_backend(BackendType.TCP, TcpBackendConfig(**cfg))
    target.create_backend(BackendType.SHM)
    return target


def test_grants_of_initiators_with_no_connection_left_are_dropped(capfd):
    """CMA grants taken under 200 distinct 4000-byte keys whose connections then closed
    are dropped (before, each was kept until its region was deregistered, which then
    logged one warning per key); a holder with a connection open keeps its grant and is
    asked to let go at deregistration; a deregistration racing the closes of 200 more
    holders completes and logs at most one line about them."""
    target = _shm_target()
    mem = target.register_array(np.zeros(1 << 20, np.uint8))
    port, secret = target._engine.port, target._engine.secret
    n = 200
    try:
        keeper = _hello(port, secret, b"keeper")
        assert _ask_cma_grant(keeper, mem) == 0
        for i in range(n):
            s = _hello(port, secret, _key(i))
            try:
                assert _ask_cma_grant(s, mem) == 0
            finally:
                s.close()
        _wait(
            lambda: target._engine.grant_stats()["holders"] == 1,
            5,
            f"grants of closed connections kept: {target._engine.grant_stats()}",
        )
        stats = target._engine.grant_stats()
        print(stats)
        assert stats["grants"] == 1 and stats["dropped"] == n, stats
        time.sleep(0.5)  # several scans: a holder with a connection keeps its grant
        assert target._engine.grant_stats()["holders"] == 1
        # Deregistration asks the keeper, which confirms.
        mem2 = target.register_array(np.zeros(4096, np.uint8))
        assert _ask_cma_grant(keeper, mem2) == 0
        keeper.settimeout(10)

        def confirm():
            h = _recv_header(keeper)
            assert h[0] == K_REVOKE and h[5] == mem2.id, h
            keeper.sendall(HDR.pack(K_REVOKE_ACK, 0, VERSION, 0, 0, mem2.id, 0, 0, 0))

        t = threading.Thread(target=confirm)
        t.start()
        target.deregister_memory(mem2)
        t.join(10)
        assert target._engine.grant_stats()["grants"] == 1
        capfd.readouterr()
        # 200 holders whose connections close while mem is deregistered.
        socks = [_hello(port, secret, _key(n + i)) for i in range(n)]
        for s in socks:
            assert _ask_cma_grant(s, mem) == 0
        for s in socks:
            s.close()
        keeper.close()
        t0 = time.monotonic()
        target.deregister_memory(mem)
        took = time.monotonic() - t0
        err = capfd.readouterr().err
        lines = [ln for ln in err.splitlines() if "no connection left" in ln]
        print(f"deregistered in {took:.2f} s; {len(lines)} line(s): {lines}")
        assert took < 3 and len(lines) <= 1, err[-2000:]
        assert len(err) < 4096, err[-2000:]
        _wait(lambda: target._engine.grant_stats()["holders"] == 0, 5, "grants kept")
    finally:
        target.close()


def test_grants_are_bounded_by_holders_and_pairs(monkeypatch):
    """At MORI_IO_MAX_GRANT_HOLDERS initiators, or MORI_IO_MAX_GRANTS (initiator, region)
    pairs, a further grant is refused (kTooManyGrants) and counted; once a holder's
    connection is gone its room is free again. A real initiator meanwhile still writes:
    refused a CMA grant for that reason, it asks for a grant per part, and asks for the
    grant again only after a while."""
    monkeypatch.setenv("MORI_IO_MAX_GRANT_HOLDERS", "3")
    monkeypatch.setenv("MORI_IO_MAX_GRANTS", "4")
    target = _shm_target()
    buf = np.zeros(1 << 20, np.uint8)
    r0, r1 = target.register_array(buf), target.register_array(np.zeros(4096, np.uint8))
    port, secret = target._engine.port, target._engine.secret
    socks = {}
    real = IOEngine("real")
    try:
        for k in (b"h0", b"h1", b"h2"):
            socks[k] = _hello(port, secret, k)
            assert _ask_cma_grant(socks[k], r0) == 0
        socks[b"h3"] = _hello(port, secret, b"h3")
        assert _ask_cma_grant(socks[b"h3"], r0) == TOO_MANY_GRANTS  # a fourth holder
        assert _ask_cma_grant(socks[b"h0"], r1) == 0  # the fourth pair
        assert _ask_cma_grant(socks[b"h1"], r1) == TOO_MANY_GRANTS  # a fifth pair
        assert _ask_cma_grant(socks[b"h0"], r0) == 0  # held already: no new pair
        stats = target._engine.grant_stats()
        assert (stats["holders"], stats["grants"], stats["refused"]) == (3, 4, 2), stats
        # A real same-host initiator writes all the same (a grant per part).
        real.create_backend(BackendType.TCP)
        real.create_backend(BackendType.SHM)
        real.register_remote_engine(target.get_engine_desc())
        src = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8)
        sess = real.create_session(real.register_array(src), r0)
        assert sess.backend()[0] == "SHM", sess.backend()
        uid = real.allocate_transfer_uid()
        st = sess.write(0, 0, src.size, uid)
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        assert np.array_equal(buf, src)
        assert target._engine.grant_stats()["refused"] == 3
        # The refusal is remembered for a while: the next writes go a grant per part
        # without asking again (each asked on a side connection before).
        for _ in range(20):
            st = sess.write(0, 0, 4096, real.allocate_transfer_uid())
            assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        assert target._engine.grant_stats()["refused"] <= 4, target._engine.grant_stats()
        # h2 leaves: its room is free again.
        socks.pop(b"h2").close()
        _wait(lambda: target._engine.grant_stats()["holders"] == 2, 5, "h2's grant kept")
        assert _ask_cma_grant(socks[b"h3"], r0) == 0
    finally:
        for s in socks.values():
            s.close()
        real.close()
        target.close()


# (C) An unregistered initiator's key held by a squatter.


def test_a_refused_initiator_connects_once_the_squatter_left():
    """A raw peer holding the target's EngineDesc connects first under the key of an
    initiator the target did not register: the real initiator is refused while it stays
    connected (the trust model's documented window). Once the squatter's connection
    closed, the real initiator's next transfers succeed without registering the target
    again (it was left 'unreachable' before). Registering the initiator at the target
    closes a squatter's connections at once."""
    target = IOEngine("target")
    target.create_backend(BackendType.TCP, TcpBackendConfig(transfer_timeout_ms=2000))
    buf = np.zeros(4096, np.uint8)
    mem = target.register_array(buf)
    port, secret = target._engine.port, target._engine.secret
    victim, late = IOEngine("victim"), IOEngine("late")
    src = np.full(64, 7, np.uint8)

    def write(engine, fill):
        src[:] = fill
        st = engine.write(engine.register_array(src), 0, mem, 0, 64, engine.allocate_transfer_uid())
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS, "write hung"
        return st

    def serves(s):
        """The squatter's hello was accepted: a write of its own is answered."""
        s.sendall(HDR.pack(K_WRITE, 0, VERSION, 1, 1, mem.id, 1024, 8, mem.capability) + bytes(8))
        ack = _recv_header(s)
        assert ack[0] == K_WRITE_ACK and ack[1] == 0, ack

    try:
        for e in (victim, late):
            e.create_backend(BackendType.TCP)
            e.register_remote_engine(target.get_engine_desc())
        squatter = _hello(port, secret, b"victim", os.urandom(16))
        serves(squatter)
        refused = target._engine.hellos_refused
        st = write(victim, 1)
        assert st.Failed() and st.Detail() == StatusDetail.ERR_PEER_LOST, st.Message()
        assert target._engine.hellos_refused > refused and not buf[:64].any()
        squatter.close()
        deadline = time.monotonic() + 5
        attempts = 0
        while not (st := write(victim, 2)).Succeeded():
            attempts += 1
            assert "register it again" not in st.Message(), st.Message()
            assert time.monotonic() < deadline, f"still refused: {st.Message()}"
            time.sleep(0.05)
        print("succeeded after", attempts, "more failed attempt(s)")
        assert (buf[:64] == 2).all()
        assert write(victim, 3).Succeeded() and (buf[:64] == 3).all()
        # Registering the initiator closes the squatter's connection and lets it in.
        squatter = _hello(port, secret, b"late", os.urandom(16))
        serves(squatter)
        target.register_remote_engine(late.get_engine_desc())
        squatter.settimeout(5)
        try:
            assert squatter.recv(1) == b"", "the squatter's connection stayed open"
        except ConnectionResetError:
            pass
        squatter.close()
        st = write(late, 4)
        assert st.Succeeded(), st.Message()
        assert (buf[:64] == 4).all()
    finally:
        victim.close()
        late.close()
        target.close()


def test_deregistration_racing_holder_closes_never_waits_for_them():
    """Holders whose connections close while a deregistration asks them to let go are
    not waited for: each of 15 rounds (200 CMA holders close their sockets, then the
    region is deregistered at once, while the target still takes the closes in)
    completes well inside the transfer timeout. Before, a close taken in between the
    deregistration's liveness check of a holder and its record of the pending request
    left a record nobody cleared: that deregistration waited the whole timeout (5 s here)
    for an acknowledgement."""
    target = _shm_target(transfer_timeout_ms=5000)
    port, secret = target._engine.port, target._engine.secret
    try:
        took = []
        for r in range(15):
            mem = target.register_array(np.zeros(4096, np.uint8))
            socks = [_hello(port, secret, _key(1000 * r + i)) for i in range(200)]
            for s in socks:
                assert _ask_cma_grant(s, mem) == 0
            for s in socks:
                s.close()
            t0 = time.monotonic()
            target.deregister_memory(mem)
            took.append(time.monotonic() - t0)
        print(f"deregistrations: slowest {max(took):.3f} s, " + " ".join(f"{t:.3f}" for t in took))
        assert max(took) < 2.5, took
    finally:
        target.close()
