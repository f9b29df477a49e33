# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The thread that waits for a single TCP write reads its answer from the socket itself
(tcp/answer_reader.hpp), and the reactor reads everything else. Against a target in
another process: many threads submitting single writes, batches and reads on the same
connections, waited for, polled or never looked at, lose no answer and complete none
twice; a peer that dies or stops while a waiter reads fails the transfer in time."""

import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mori.io import (
    BackendType,
    IOEngine,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
)

WORKER = str(Path(__file__).with_name("io_peer_worker.py"))
BLK = 4096


@pytest.fixture
def target(peer_target):
    """A target engine in another process: (its EngineDesc, its 32 MiB region, process)."""
    desc, mem, _, proc = peer_target
    return desc, mem, proc


def _initiator(desc, remote, **cfg):
    eng = IOEngine(f"waiter-reads-{random.randrange(1 << 30)}")
    eng.create_backend(BackendType.TCP, TcpBackendConfig(**cfg))
    eng.register_remote_engine(desc)
    buf = np.zeros(remote.size, np.uint8)
    return eng, buf, eng.register_array(buf)


def _stop(proc):
    """SIGSTOP, returning once every thread of the process is stopped (kill(2) returns
    before a thread running on another CPU has taken the signal)."""
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    tasks = Path(f"/proc/{proc.pid}/task")
    while True:
        states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        if all(st in "tT" for st in states):
            return
        assert time.monotonic() < deadline, f"target not stopped: {states}"
        time.sleep(0.001)


def _done(st, what):
    assert st.WaitFor(20000) != StatusCode.IN_PROGRESS, f"{what} hung"
    assert st.Succeeded(), (what, st.Code(), st.Message())


@pytest.mark.parametrize("busy_poll_us", ["0", "30"])
def test_concurrent_writes_batches_and_reads_lose_no_answer(target, monkeypatch, busy_poll_us):
    monkeypatch.setenv("MORI_IO_TCP_BUSY_POLL_US", busy_poll_us)
    desc, remote, _ = target
    eng, buf, mem = _initiator(desc, remote, qp_per_transfer=2)
    assert eng._engine.hot_path_options["tcp_waiter_reads"]
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    slots_per_thread = 256
    nthreads = 5
    buf[: nthreads * slots_per_thread * BLK] = rng.integers(
        0, 256, nthreads * slots_per_thread * BLK, dtype=np.uint8
    )
    sess = eng.create_session(mem, remote)
    errors = []
    kept = []  # statuses never waited for or polled

    def run(t):
        try:
            base = t * slots_per_thread
            trng = random.Random(seed + t)
            for i in range(slots_per_thread):
                off = (base + i) * BLK
                mode = (t + i) % 5
                if mode == 0:  # waited for: the waiter reads the answers
                    _done(sess.write(off, off, BLK, eng.allocate_transfer_uid()), "write")
                elif mode == 1:  # polled, never waited for
                    st = eng.write(mem, off, remote, off, BLK, eng.allocate_transfer_uid())
                    deadline = time.monotonic() + 20
                    while st.InProgress():
                        assert time.monotonic() < deadline, "a polled write hung"
                    assert st.Succeeded(), st.Message()
                elif mode == 2:  # never looked at until the end
                    kept.append(sess.write(off, off, BLK, eng.allocate_transfer_uid()))
                elif mode == 3:  # a batch of one block split in two parts
                    h = BLK // 2
                    st = sess.batch_write(
                        [off, off + h], [off, off + h], [h, h], eng.allocate_transfer_uid()
                    )
                    _done(st, "batch")
                else:  # a write then a read of an earlier slot on the same connections
                    _done(sess.write(off, off, BLK, eng.allocate_transfer_uid()), "write")
                    back = np.zeros(BLK, np.uint8)
                    bm = eng.register_array(back)
                    j = base + trng.randrange(i + 1)
                    st = eng.read(bm, 0, remote, j * BLK, BLK, eng.allocate_transfer_uid())
                    _done(st, "read")
                    eng.deregister_memory(bm)
                    if (t + (j - base)) % 5 != 2:  # a never-waited write may still be in flight
                        assert np.array_equal(back, buf[j * BLK : (j + 1) * BLK]), (
                            f"slot {j} read back wrong"
                        )
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
        assert not th.is_alive(), "a submitting thread hung"
    if errors:
        raise errors[0]
    for st in kept:
        _done(st, "a write never waited for")
    n = nthreads * slots_per_thread * BLK
    back = np.zeros(n, np.uint8)
    bm = eng.register_array(back)
    _done(eng.read(bm, 0, remote, 0, n, eng.allocate_transfer_uid()), "the final read")
    assert np.array_equal(back, buf[:n]), "bytes differ at the target"
    assert eng._engine.ledger_stats()["live"] == 0
    assert eng._engine.answers_read_by_waiters > 0, "no waiter read its answer"
    eng.close()


def test_a_write_nobody_waits_for_is_read_by_the_reactor(target):
    """Its receive side was lent to a waiter that never comes: the reactor's scan takes
    it back and reads the answer (the ledger record is released without any poll)."""
    desc, remote, _ = target
    eng, buf, mem = _initiator(desc, remote, transfer_timeout_ms=400)
    buf[:BLK] = 0x3C
    _done(eng.write(mem, 0, remote, 0, BLK, eng.allocate_transfer_uid()), "warm-up")
    before = eng._engine.answers_read_by_waiters
    st = eng.write(mem, 0, remote, 0, BLK, eng.allocate_transfer_uid())
    deadline = time.monotonic() + 5
    while eng._engine.ledger_stats()["live"] != 0:
        assert time.monotonic() < deadline, "an answer nobody waited for was never read"
        time.sleep(0.005)
    assert eng._engine.answers_read_by_waiters == before
    assert st.Succeeded(), st.Message()
    eng.close()


def test_polled_writes_finish_without_waiting_for_the_scan(target):
    """A status polled (InProgress) instead of waited for reads its answer itself: 20
    such writes take far less than the reactor's scan period (200 ms) each."""
    desc, remote, _ = target
    eng, buf, mem = _initiator(desc, remote, qp_per_transfer=1)
    t0 = time.monotonic()
    for i in range(20):
        st = eng.write(mem, i * BLK, remote, i * BLK, BLK, eng.allocate_transfer_uid())
        while st.InProgress():
            assert time.monotonic() - t0 < 20, "a polled write hung"
        assert st.Succeeded(), st.Message()
    assert time.monotonic() - t0 < 1.0, "polled writes waited for the scan period"
    eng.close()


def test_lent_answers_are_read_when_the_connection_carries_more(target):
    """A write left unwaited, then a read on the same (only) connection: the read's
    submission ends the lend, so the read completes at once and the write with it."""
    desc, remote, _ = target
    eng, buf, mem = _initiator(desc, remote, qp_per_transfer=1)
    buf[: 2 * BLK] = 0x77
    w = eng.write(mem, 0, remote, 0, BLK, eng.allocate_transfer_uid())
    back = np.zeros(BLK, np.uint8)
    bm = eng.register_array(back)
    t0 = time.monotonic()
    r = eng.read(bm, 0, remote, 0, BLK, eng.allocate_transfer_uid())
    _done(r, "read")
    assert time.monotonic() - t0 < 0.1, "the read waited for the scan period"
    assert np.all(back == 0x77)
    _done(w, "write")
    eng.close()


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_peer_lost_while_the_waiter_reads_fails_the_write(target, how, monkeypatch):
    """The waiter sleeps in poll(2) on the socket (no busy phase): a peer killed fails the
    write with ERR_PEER_LOST, a stopped one with ERR_TIMEOUT after transfer_timeout_ms;
    neither hangs the waiter."""
    desc, remote, proc = target
    eng, buf, mem = _initiator(desc, remote, transfer_timeout_ms=500, qp_per_transfer=1)
    _done(eng.write(mem, 0, remote, 0, BLK, eng.allocate_transfer_uid()), "warm-up")
    _stop(proc)
    st = eng.write(mem, 0, remote, 0, BLK, eng.allocate_transfer_uid())
    killer = threading.Timer(0.3, proc.kill)
    if how == "kill":
        killer.start()
    t0 = time.monotonic()
    try:
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS, "the waiter hung"
    finally:
        killer.cancel()
    elapsed = time.monotonic() - t0
    assert st.Failed()
    want = StatusDetail.ERR_PEER_LOST if how == "kill" else StatusDetail.ERR_TIMEOUT
    assert st.Detail() == want, (st.Detail(), st.Message())
    assert elapsed < 3.0
    assert eng._engine.ledger_stats()["live"] == 0
    eng.close()


def test_closing_the_engine_under_a_reading_waiter_fails_its_write(target):
    """The waiter sleeps in poll(2) on a stopped target's socket when its own engine is
    closed: the close shuts the socket down, waits for the waiter to let go before the
    descriptor is closed, and the write fails; nothing hangs or crashes."""
    desc, remote, proc = target
    eng, buf, mem = _initiator(desc, remote, qp_per_transfer=1)
    _done(eng.write(mem, 0, remote, 0, BLK, eng.allocate_transfer_uid()), "warm-up")
    _stop(proc)
    st = eng.write(mem, 0, remote, 0, BLK, eng.allocate_transfer_uid())
    result = []
    waiter = threading.Thread(target=lambda: result.append(st.WaitFor(10000)))
    waiter.start()
    time.sleep(0.2)  # past its busy phase: asleep in poll(2)
    t0 = time.monotonic()
    eng.close()
    waiter.join(10)
    assert not waiter.is_alive(), "the waiter hung after its engine closed"
    assert time.monotonic() - t0 < 3.0
    assert result and result[0] != StatusCode.IN_PROGRESS
    assert st.Failed(), st.Message()
