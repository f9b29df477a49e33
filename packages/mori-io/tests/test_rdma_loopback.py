# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The loopback RDMA backend (a test double: memmove between backends of one
process, compiled only into test builds and chosen by the engine there only with
MORI_IO_RDMA_LOOPBACK=1), driven directly through ``_C._testing.rdma.Backend.loopback``:
the same interface and contract as the real backend, so that the engine's RDMA wiring
can be tested without a NIC.

Every wait has a timeout; random inputs print their seed."""

from __future__ import annotations

import collections
import gc
import random
import threading
import time

import numpy as np
import pytest

import mori.core
from mori.io import _C

T = getattr(_C, "_testing", None)  # test builds only; conftest skips io_testing tests without
R = T.rdma if T else None  # the RDMA backend's internals
pytestmark = pytest.mark.io_testing
SC = _C.StatusDetail  # the native callbacks report the detail
WAIT_S = 20.0
WRITE_IMM = 1


def _seed(name: str) -> random.Random:
    seed = random.randrange(1 << 32)
    print(f"{name}: seed {seed}")
    return random.Random(seed)


def _config(qps: int = 1, notify: bool = True, max_message: int = 0, max_sge: int = 0):
    c = _C.rdma.BackendConfig()
    c.qp_per_transfer = qps
    c.enable_notification = notify
    c.max_message_bytes = max_message
    c.max_sge = max_sge
    return c


def _buffer(rng: random.Random, n: int) -> np.ndarray:
    return np.frombuffer(rng.randbytes(n), dtype=np.uint8).copy()


class Completions:
    """done(code, message) callbacks, by uid, with the thread each ran on."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.by_uid: dict[int, list[tuple[object, str, int]]] = collections.defaultdict(list)

    def callback(self, uid: int):
        def done(code, message):
            with self._cv:
                self.by_uid[uid].append((code, message, threading.get_ident()))
                self._cv.notify_all()

        return done

    def wait(self, uids, timeout: float = WAIT_S) -> dict[int, tuple[object, str]]:
        uids = list(uids)
        with self._cv:
            ok = self._cv.wait_for(lambda: all(self.by_uid[u] for u in uids), timeout)
            missing = [u for u in uids if not self.by_uid[u]]
        assert ok, f"transfers {missing[:10]} did not complete within {timeout} s"
        return {u: self.by_uid[u][0][:2] for u in uids}


class Notifications:
    """The inbound handler: (peer_key, uid24, parts, read) tuples, counted."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.seen: collections.Counter = collections.Counter()

    def __call__(self, peer_key, uid24, parts, read) -> None:
        with self._cv:
            self.seen[(peer_key, uid24, parts, read)] += 1
            self._cv.notify_all()

    def wait_for(self, expected: collections.Counter, timeout: float = WAIT_S) -> None:
        with self._cv:
            self._cv.wait_for(lambda: all(self.seen[k] >= n for k, n in expected.items()), timeout)
            assert +self.seen == +expected, (
                f"notifications {dict(self.seen)} != expected {dict(expected)}"
            )


def _connect(a, a_key: str, b, b_key: str) -> None:
    """a opens a connection to b; a calls b `b_key`, b calls a `a_key`."""
    request = a.open_initiator(b_key)
    reply = b.accept_initiator(a_key, request)
    a.complete_initiator(b_key, reply)
    assert a.peer_ready(b_key)


class Blocker:
    """Parks a backend's worker thread inside a done callback (the worker then runs
    nothing else), so that later transfers of that backend stay queued."""

    def __init__(self, backend, mem_id: int, peer_key: str, remote_key: bytes) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

        def done(code, message):
            self.entered.set()
            self.release.wait(WAIT_S)

        backend.submit("write", mem_id, peer_key, remote_key, [(0, 0, 1)], 1 << 40, done)
        assert self.entered.wait(WAIT_S), "the blocker transfer never completed"


@pytest.fixture
def pair():
    """Two loopback backends, A and B, A connected to B; 64 KiB regions 1 (A), 2 (B)."""
    rng = _seed("pair")
    # No local names for the backends: a test destroys one by popping it.
    p = {"a": R.Backend.loopback(_config(qps=2)), "b": R.Backend.loopback(_config(qps=2))}
    p["src"], p["dst"] = _buffer(rng, 1 << 16), _buffer(rng, 1 << 16)
    p["ka"] = p["a"].register_region(1, p["src"].ctypes.data, p["src"].nbytes)
    p["kb"] = p["b"].register_region(2, p["dst"].ctypes.data, p["dst"].nbytes)
    p["notes"] = Notifications()
    p["b"].set_inbound_handler(p["notes"])
    _connect(p["a"], "A", p["b"], "B")
    return p


# -- identity, registration, connection ------------------------------------------------


def test_it_says_it_is_the_loopback_and_only_the_env_var_requests_it(monkeypatch):
    b = R.Backend.loopback(_config())
    assert "loopback" in b.describe() and "MORI_IO_RDMA_LOOPBACK" in b.describe()
    assert R.LOOPBACK_ENV_VAR == "MORI_IO_RDMA_LOOPBACK"
    monkeypatch.delenv("MORI_IO_RDMA_LOOPBACK", raising=False)
    assert not R.loopback_requested()
    # mori's boolean syntax (docs/configuration.md); anything else is refused, named.
    for value, want in (("0", False), ("", False), ("off", False), ("yes", True), ("1", True)):
        monkeypatch.setenv("MORI_IO_RDMA_LOOPBACK", value)
        assert R.loopback_requested() is want, value
    monkeypatch.setenv("MORI_IO_RDMA_LOOPBACK", "maybe")
    with pytest.raises(mori.core.InvalidArgumentError, match="MORI_IO_RDMA_LOOPBACK='maybe'"):
        R.loopback_requested()


def test_a_bad_config_is_refused_as_the_real_backend_refuses_it():
    with pytest.raises(mori.core.InvalidArgumentError, match="qp_per_transfer 0"):
        R.Backend.loopback(_config(qps=0))
    with pytest.raises(mori.core.InvalidArgumentError, match="qp_per_transfer 128"):
        R.Backend.loopback(_config(qps=128))


def test_region_keys_are_real_blobs_with_an_rkey_unique_per_registration():
    a, b = R.Backend.loopback(_config()), R.Backend.loopback(_config())
    buf = np.zeros(4096, dtype=np.uint8)
    addr = buf.ctypes.data
    keys = [a.register_region(1, addr, 4096), b.register_region(1, addr, 4096)]
    a.deregister_region(1)
    keys.append(a.register_region(1, addr, 4096))  # same id, same memory: a new rkey
    keys.append(a.register_region(2, addr + 100, 50))
    decoded = [R.decode_region_key(k) for k in keys]
    assert decoded[0][:2] == decoded[1][:2] == decoded[2][:2] == (addr, 4096)
    assert decoded[3][:2] == (addr + 100, 50)
    assert len({d[2] for d in decoded}) == 4, decoded
    with pytest.raises(mori.core.InvalidArgumentError, match="memory id 1 is already registered"):
        a.register_region(1, addr, 10)
    with pytest.raises(mori.core.InvalidArgumentError, match="memory id 3 of 0 bytes"):
        a.register_region(3, addr, 0)
    with pytest.raises(mori.core.NotFoundError, match="memory id 9 not registered"):
        a.deregister_region(9)
    assert a.in_flight(1) == 0 and a.in_flight(9) == 0


def test_connect_payloads_are_endpoint_blobs_of_qp_per_transfer_entries():
    a, b = R.Backend.loopback(_config(qps=5)), R.Backend.loopback(_config(qps=2))
    request = a.open_initiator("B")
    assert not a.peer_ready("B")
    eps = R.decode_endpoints(request)
    assert len(eps) == 5 and len({(e.qpn, e.psn) for e in eps}) == 1
    reply = b.accept_initiator("A", request)
    assert len(R.decode_endpoints(reply)) == 5  # one per initiator QP, as the real one
    a.complete_initiator("B", reply)
    assert a.peer_ready("B") and not b.peer_ready("A")  # readiness is the initiator's
    # Re-opening replaces the connection: not ready until completed again.
    request2 = a.open_initiator("B")
    assert not a.peer_ready("B") and R.decode_endpoints(request2)[0].psn != eps[0].psn
    with pytest.raises(mori.core.InvalidStateError, match="no connection to 'C' is being opened"):
        a.complete_initiator("C", reply)
    with pytest.raises(mori.core.InvalidArgumentError, match="3 endpoints for 5 QPs"):
        c = R.Backend.loopback(_config(qps=3))
        a.complete_initiator("B", c.accept_initiator("A", c.open_initiator("X")))


def test_a_real_backends_endpoints_are_refused_naming_the_env_var():
    b = R.Backend.loopback(_config())
    real = R.EndpointInfo()
    real.qpn, real.psn, real.link_layer, real.gid = 0x1234, 77, 2, bytes(range(16))
    with pytest.raises(mori.core.InvalidArgumentError, match="MORI_IO_RDMA_LOOPBACK=1"):
        b.accept_initiator("A", R.encode_endpoints([real]))
    with pytest.raises(mori.core.InvalidArgumentError, match="magic"):
        b.accept_initiator("A", b"not an endpoint blob")
    a = R.Backend.loopback(_config())
    a.open_initiator("B")
    with pytest.raises(mori.core.InvalidArgumentError, match="MORI_IO_RDMA_LOOPBACK=1"):
        a.complete_initiator("B", R.encode_endpoints([real]))
    assert not a.peer_ready("B")


# -- transfers ----------------------------------------------------------------------


def _disjoint_spans(rng: random.Random, n: int, local_size: int, remote_size: int):
    """n spans (local_offset, remote_offset, size), disjoint on both sides, some empty,
    some adjacent on both sides (so the planner merges them)."""
    cap = min(local_size, remote_size) // 2 // n
    sizes = [0 if cap == 0 or rng.random() < 0.1 else rng.randint(1, cap) for _ in range(n)]

    def layout(total: int) -> list[int]:
        order = list(range(n))
        if rng.random() < 0.7:
            rng.shuffle(order)
        slack = total - sum(sizes)
        gaps = sorted(rng.randint(0, slack) for _ in range(n))
        gaps = [g if rng.random() < 0.6 else 0 for g in gaps]  # zero gaps: contiguous runs
        offsets, pos = [0] * n, 0
        for i, idx in enumerate(order):
            pos = max(pos, gaps[i])
            offsets[idx] = pos
            pos += sizes[idx]
        return offsets

    lo, ro = layout(local_size), layout(remote_size)
    return [(lo[i], ro[i], sizes[i]) for i in range(n)]


def _expected_notifications(op, spans, local_size, remote_size, config, uid, key):
    """What the target hears: one notification per WRITE_WITH_IMM of the real plan."""
    plan = R.plan_transfer(
        op,
        spans,
        local_size,
        remote_size,
        max_message_bytes=config.max_message_bytes or 1 << 30,
        max_sge=config.max_sge or 16,
        signal_interval=config.signal_interval,
        post_batch_size=min(32, config.max_send_wr),
        num_qps=config.qp_per_transfer,
        notify=config.enable_notification,
        uid=uid,
    )
    out = collections.Counter()
    for q in plan["qps"]:
        for w in q["wrs"]:
            if w["opcode"] == WRITE_IMM:
                out[(key, *R.decode_imm(w["imm"]))] += 1
    return out, len(plan["qps"])


@pytest.mark.parametrize("round_", range(6))
def test_random_reads_and_writes_move_exactly_the_span_bytes(round_):
    rng = _seed(f"round {round_}")
    config = _config(
        qps=rng.choice([1, 2, 3, 8]),
        notify=rng.random() < 0.8,
        max_message=rng.choice([0, 64, 1000, 4096]),
        max_sge=rng.choice([0, 1, 2, 4]),
    )
    print(
        f"qps={config.qp_per_transfer} notify={config.enable_notification} "
        f"max_message={config.max_message_bytes} max_sge={config.max_sge}"
    )
    a, b = R.Backend.loopback(config), R.Backend.loopback(config)
    local_size, remote_size = rng.randint(1, 1 << 17), rng.randint(1, 1 << 17)
    local, remote = _buffer(rng, local_size), _buffer(rng, remote_size)
    a.register_region(10, local.ctypes.data, local_size)
    kb = b.register_region(20, remote.ctypes.data, remote_size)
    notes = Notifications()
    b.set_inbound_handler(notes)
    _connect(a, "engine-a", b, "engine-b")
    done = Completions()
    expected_notes: collections.Counter = collections.Counter()
    for i in range(25):
        op = rng.choice(["read", "write"])
        spans = _disjoint_spans(rng, rng.randint(1, 40), local_size, remote_size)
        uid = rng.randrange(1 << 40)
        want_local, want_remote = local.copy(), remote.copy()
        for lo, ro, size in spans:
            if op == "write":
                want_remote[ro : ro + size] = local[lo : lo + size]
            else:
                want_local[lo : lo + size] = remote[ro : ro + size]
        note, parts = _expected_notifications(
            op, spans, local_size, remote_size, config, uid, "engine-a"
        )
        expected_notes += note
        a.submit(op, 10, "engine-b", kb, spans, uid, done.callback(uid))
        code, message = done.wait([uid])[uid]
        assert code == SC.SUCCESS and message == "", (i, message)
        assert np.array_equal(local, want_local), f"transfer {i} ({op}): local bytes differ"
        assert np.array_equal(remote, want_remote), f"transfer {i} ({op}): remote bytes differ"
        if note:
            # Every part names the same count, and that many arrive.
            assert sum(note.values()) == parts and {k[2] for k in note} == {parts}
            assert {k[1] for k in note} == {uid & R.IMM_UID_MASK}
            assert {k[3] for k in note} == {op == "read"}
    notes.wait_for(expected_notes)
    assert all(len(v) == 1 for v in done.by_uid.values()), "a done ran more than once"
    assert a.in_flight(10) == 0 and b.in_flight(20) == 0


def test_many_transfers_in_flight_from_many_threads_both_ways():
    rng = _seed("concurrent")
    a, b = R.Backend.loopback(_config(qps=4, max_message=512)), R.Backend.loopback(_config(qps=3))
    n_threads, slot = 4, 1 << 14
    bufs = {"A": _buffer(rng, n_threads * slot), "B": _buffer(rng, n_threads * slot)}
    keys = {
        "A": a.register_region(1, bufs["A"].ctypes.data, bufs["A"].nbytes),
        "B": b.register_region(1, bufs["B"].ctypes.data, bufs["B"].nbytes),
    }
    notes = {"A": Notifications(), "B": Notifications()}
    a.set_inbound_handler(notes["A"])
    b.set_inbound_handler(notes["B"])
    _connect(a, "A", b, "B")
    _connect(b, "B", a, "A")
    done = Completions()
    initial = {k: v.copy() for k, v in bufs.items()}
    errors: list[BaseException] = []

    moved = [[] for _ in range(n_threads)]
    seeds = [rng.randrange(1 << 32) for _ in range(n_threads)]

    # Each thread owns slot t of both buffers and copies A's slot into B's: the even
    # ones as A writing to B, the odd ones as B reading from A (the other direction).
    def worker(t: int) -> None:
        try:
            r = random.Random(seeds[t])
            base = t * slot
            for j in range(60):
                size = r.randint(1, slot)
                off = r.randrange(0, slot - size + 1)
                moved[t].append((base + off, size))
                uid = (t << 20) | j
                if t % 2 == 0:
                    a.submit(
                        "write",
                        1,
                        "B",
                        keys["B"],
                        [(base + off, base + off, size)],
                        uid,
                        done.callback(uid),
                    )
                else:
                    b.submit(
                        "read",
                        1,
                        "A",
                        keys["A"],
                        [(base + off, base + off, size)],
                        uid,
                        done.callback(uid),
                    )
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT_S)
        assert not th.is_alive(), "a submitting thread hung"
    assert not errors, errors
    uids = [(t << 20) | j for t in range(n_threads) for j in range(60)]
    results = done.wait(uids)
    assert all(code == SC.SUCCESS for code, _ in results.values())
    # Every copy of a slot moves the same source bytes, so B is its initial bytes with
    # A's bytes over the union of the copied ranges; A never changes.
    want = initial["B"].copy()
    for ranges in moved:
        for off, size in ranges:
            want[off : off + size] = initial["A"][off : off + size]
    assert np.array_equal(bufs["B"], want)
    assert np.array_equal(bufs["A"], initial["A"])
    assert a.in_flight(1) == 0 and b.in_flight(1) == 0


def test_a_backend_can_connect_to_itself():
    rng = _seed("self")
    a = R.Backend.loopback(_config(qps=2))
    buf = _buffer(rng, 8192)
    before = buf.copy()
    a.register_region(1, buf.ctypes.data, 4096)
    k2 = a.register_region(2, buf.ctypes.data + 4096, 4096)
    notes = Notifications()
    a.set_inbound_handler(notes)
    _connect(a, "me", a, "me")
    done = Completions()
    a.submit("write", 1, "me", k2, [(0, 100, 1000)], 7, done.callback(7))
    assert done.wait([7])[7] == (SC.SUCCESS, "")
    want = before.copy()
    want[4096 + 100 : 4096 + 1100] = before[:1000]
    assert np.array_equal(buf, want)
    notes.wait_for(collections.Counter({("me", 7, 1, False): 1}))


def test_done_runs_once_on_a_backend_thread_and_inline_only_for_an_empty_plan(pair):
    a, kb, notes = pair["a"], pair["kb"], pair["notes"]
    done = Completions()
    main = threading.get_ident()
    a.submit("write", 1, "B", kb, [(0, 0, 64)], 1, done.callback(1))
    assert done.wait([1])[1] == (SC.SUCCESS, "")
    assert done.by_uid[1][0][2] != main
    # Zero bytes with notifications: one zero-length WRITE_WITH_IMM, not inline.
    a.submit("read", 1, "B", kb, [(0, 0, 0)], 2, done.callback(2))
    assert done.wait([2])[2] == (SC.SUCCESS, "")
    assert done.by_uid[2][0][2] != main
    notes.wait_for(collections.Counter({("A", 1, 1, False): 1, ("A", 2, 1, True): 1}))
    # Zero bytes without notifications: an empty plan, completed inside submit.
    quiet = R.Backend.loopback(_config(notify=False))
    quiet.register_region(1, pair["src"].ctypes.data, 16)
    _connect(quiet, "Q", pair["b"], "B")
    quiet.submit("write", 1, "B", kb, [(0, 0, 0), (3, 3, 0)], 3, done.callback(3))
    assert done.by_uid[3] and done.by_uid[3][0][:2] == (SC.SUCCESS, "")
    assert done.by_uid[3][0][2] == main
    time.sleep(0.05)
    assert all(len(v) == 1 for v in done.by_uid.values())


def test_submit_refuses_before_anything_moves(pair):
    a, b, kb = pair["a"], pair["b"], pair["kb"]
    src_before, dst_before = pair["src"].copy(), pair["dst"].copy()
    done = Completions()
    with pytest.raises(mori.core.NotFoundError, match="local memory id 5 is not registered"):
        a.submit("write", 5, "B", kb, [(0, 0, 8)], 1, done.callback(1))
    with pytest.raises(mori.core.InvalidStateError, match="not connected to 'C'"):
        a.submit("write", 1, "C", kb, [(0, 0, 8)], 2, done.callback(2))
    with pytest.raises(mori.core.InvalidStateError, match="not connected to 'A'"):
        b.submit("write", 2, "A", pair["ka"], [(0, 0, 8)], 3, done.callback(3))
    with pytest.raises(mori.core.InvalidArgumentError, match="span 1: local .* outside the local"):
        a.submit("write", 1, "B", kb, [(0, 0, 8), ((1 << 16) - 4, 0, 8)], 4, done.callback(4))
    addr, _, rkey = R.decode_region_key(kb)
    short_key = R.encode_region_key(addr, 100, rkey)
    with pytest.raises(mori.core.InvalidArgumentError, match="span 0: remote .* region of 100"):
        a.submit("read", 1, "B", short_key, [(0, 96, 8)], 5, done.callback(5))
    with pytest.raises(mori.core.InvalidArgumentError, match="not read or write"):
        a.submit("copy", 1, "B", kb, [(0, 0, 8)], 6, done.callback(6))
    time.sleep(0.05)
    assert not done.by_uid
    assert np.array_equal(pair["src"], src_before) and np.array_equal(pair["dst"], dst_before)
    assert a.in_flight(1) == 0


# -- failures -------------------------------------------------------------------------


def test_a_stale_rkey_fails_out_of_bounds_and_kills_the_qp_until_reconnect():
    rng = _seed("stale")
    a, b = R.Backend.loopback(_config(qps=1)), R.Backend.loopback(_config(qps=1))
    src, dst = _buffer(rng, 4096), _buffer(rng, 4096)
    a.register_region(1, src.ctypes.data, 4096)
    stale = b.register_region(2, dst.ctypes.data, 4096)
    b.deregister_region(2)
    fresh = b.register_region(2, dst.ctypes.data, 4096)
    _connect(a, "A", b, "B")
    before = dst.copy()
    done = Completions()
    a.submit("write", 1, "B", stale, [(0, 0, 100)], 1, done.callback(1))
    code, message = done.wait([1])[1]
    assert code == SC.ERR_OUT_OF_BOUNDS, message
    assert "transfer uid 1:" in message and "rkey 0x" in message
    assert "IBV_WC_REM_ACCESS_ERR" in message
    assert np.array_equal(dst, before)
    # As an RC QP after a remote access error, the (only) QP is dead...
    a.submit("write", 1, "B", fresh, [(0, 0, 100)], 2, done.callback(2))
    code, message = done.wait([2])[2]
    assert code == SC.ERR_PEER_LOST and "has failed" in message, message
    assert a.peer_ready("B") and np.array_equal(dst, before)
    # ...until the peer is connected again.
    _connect(a, "A", b, "B")
    a.submit("write", 1, "B", fresh, [(0, 0, 100)], 3, done.callback(3))
    assert done.wait([3])[3] == (SC.SUCCESS, "")
    assert np.array_equal(dst[:100], src[:100])
    # A key with a live rkey but another range is refused too.
    addr, length, rkey = R.decode_region_key(fresh)
    a.submit(
        "write", 1, "B", R.encode_region_key(addr + 8, 64, rkey), [(0, 0, 8)], 4, done.callback(4)
    )
    code, message = done.wait([4])[4]
    assert code == SC.ERR_OUT_OF_BOUNDS and "but the key names" in message, message
    # Another backend's key is not a key of B.
    other = R.Backend.loopback(_config())
    other_key = other.register_region(1, dst.ctypes.data, 4096)
    _connect(a, "A", b, "B")
    a.submit("write", 1, "B", other_key, [(0, 0, 8)], 5, done.callback(5))
    assert done.wait([5])[5][0] == SC.ERR_OUT_OF_BOUNDS


def test_deregister_is_refused_while_transfers_are_in_flight(pair):
    a, kb = pair["a"], pair["kb"]
    done = Completions()
    blocker = Blocker(a, 1, "B", kb)
    try:
        for uid in range(10, 15):
            a.submit("write", 1, "B", kb, [(uid, uid, 100)], uid, done.callback(uid))
        assert a.in_flight(1) == 5
        with pytest.raises(mori.core.InvalidStateError, match="memory id 1 has 5 transfer"):
            a.deregister_region(1)
    finally:
        blocker.release.set()
    assert all(c == SC.SUCCESS for c, _ in done.wait(range(10, 15)).values())
    assert a.in_flight(1) == 0
    a.deregister_region(1)
    with pytest.raises(mori.core.NotFoundError):
        a.deregister_region(1)


def test_disconnect_fails_outstanding_transfers_with_the_reason(pair):
    a, kb = pair["a"], pair["kb"]
    dst_before = pair["dst"].copy()
    done = Completions()
    blocker = Blocker(a, 1, "B", kb)
    try:
        uids = list(range(100, 120))
        for uid in uids:
            a.submit("write", 1, "B", kb, [(0, 1000 + uid, 500)], uid, done.callback(uid))
        a.disconnect_peer("B", "the test hung up")
        # Failed by the disconnect itself, before it returned.
        assert all(done.by_uid[u] for u in uids)
    finally:
        blocker.release.set()
    for uid, (code, message) in done.wait(uids).items():
        assert code == SC.ERR_PEER_LOST, message
        assert f"transfer uid {uid}:" in message and "the test hung up" in message
        assert "disconnected from 'B'" in message
    assert np.array_equal(pair["dst"][1000:], dst_before[1000:])
    assert not a.peer_ready("B") and a.in_flight(1) == 0
    with pytest.raises(mori.core.InvalidStateError, match="not connected to 'B'"):
        a.submit("write", 1, "B", kb, [(0, 0, 8)], 1, done.callback(1))
    a.disconnect_peer("B", "again")  # nothing left: a no-op
    a.disconnect_peer("never-seen", "no such peer")


def test_a_target_that_drops_the_connection_fails_later_transfers_as_peer_lost(pair):
    a, b, kb = pair["a"], pair["b"], pair["kb"]
    done = Completions()
    b.disconnect_peer("A", "target side closes")
    a.submit("write", 1, "B", kb, [(0, 0, 8)], 1, done.callback(1))
    code, message = done.wait([1])[1]
    assert code == SC.ERR_PEER_LOST and "no longer has this connection" in message, message
    _connect(a, "A", b, "B")
    a.submit("write", 1, "B", kb, [(0, 0, 8)], 2, done.callback(2))
    assert done.wait([2])[2] == (SC.SUCCESS, "")
    # Re-opening from the initiator drops the target's old connection: a notification
    # of the new one arrives under the same key.
    pair["notes"].wait_for(collections.Counter({("A", 2, 1, False): 1}))


def test_a_destroyed_target_fails_queued_transfers_and_never_touches_its_memory(pair):
    a, kb = pair["a"], pair["kb"]
    dst_before = pair["dst"].copy()
    done = Completions()
    blocker = Blocker(a, 1, "B", kb)
    try:
        uids = list(range(200, 210))
        for uid in uids:
            a.submit("write", 1, "B", kb, [(0, 0, 4096)], uid, done.callback(uid))
        b = pair.pop("b")
        del b
        gc.collect()
    finally:
        blocker.release.set()
    for code, message in done.wait(uids).values():
        assert code == SC.ERR_PEER_LOST and "destroyed" in message, message
    assert np.array_equal(pair["dst"][1:], dst_before[1:])
    assert a.in_flight(1) == 0 and a.peer_ready("B")  # as over dead QPs
    a.submit("read", 1, "B", kb, [(0, 0, 16)], 300, done.callback(300))
    assert done.wait([300])[300][0] == SC.ERR_PEER_LOST


def test_a_destroyed_initiator_fails_its_queued_transfers(pair):
    a, kb = pair["a"], pair["kb"]
    done = Completions()
    blocker = Blocker(a, 1, "B", kb)
    uids = list(range(400, 408))
    for uid in uids:
        a.submit("write", 1, "B", kb, [(0, 0, 64)], uid, done.callback(uid))
    # The destructor joins the worker, which sits in the blocker's callback: let it go
    # a moment after the destruction started.
    threading.Timer(0.2, blocker.release.set).start()
    a = pair.pop("a")
    del a
    gc.collect()
    for code, message in done.wait(uids).values():
        assert code == SC.ERR_PEER_LOST and "shut down" in message, message


def test_the_inbound_handler_can_be_replaced_and_removed(pair):
    a, b, kb = pair["a"], pair["b"], pair["kb"]
    done = Completions()
    second = Notifications()
    b.set_inbound_handler(second)
    a.submit("write", 1, "B", kb, [(0, 0, 8)], 1, done.callback(1))
    done.wait([1])
    second.wait_for(collections.Counter({("A", 1, 1, False): 1}))
    b.set_inbound_handler(None)
    a.submit("write", 1, "B", kb, [(0, 0, 8)], 2, done.callback(2))
    done.wait([2])
    time.sleep(0.05)
    assert second.seen == collections.Counter({("A", 1, 1, False): 1})
    assert not pair["notes"].seen
