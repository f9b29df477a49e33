# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Two engines in one process over the TCP backend: bytes compared bit for bit, and
every refusal (bounds, unknown memory, unknown engine) fails only that transfer."""

import dataclasses
import random

import numpy as np
import pytest

import mori.core as mc
from mori.io import (
    BackendType,
    EngineDesc,
    IOEngine,
    IOEngineConfig,
    MemoryDesc,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
    wait_all,
)

MIB = 1 << 20


def _rng():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def pair():
    a = IOEngine("a", IOEngineConfig("127.0.0.1", 0))
    b = IOEngine("b", IOEngineConfig("127.0.0.1", 0))
    a.create_backend(BackendType.TCP, TcpBackendConfig(qp_per_transfer=3, chunk_size=256 << 10))
    b.create_backend(BackendType.TCP, TcpBackendConfig(num_worker_threads=2))
    # Descriptors cross as bytes, as between processes.
    a.register_remote_engine(EngineDesc.unpack(b.get_engine_desc().pack()))
    b.register_remote_engine(EngineDesc.unpack(a.get_engine_desc().pack()))
    x = np.zeros(64 * MIB + 3, dtype=np.uint8)
    y = np.zeros(64 * MIB + 3, dtype=np.uint8)
    mx, my = a.register_array(x), b.register_array(y)
    yield a, b, x, y, mx, MemoryDesc.unpack(my.pack())
    a.close()
    b.close()


def _check(status, timeout_ms=20000):
    assert status.WaitFor(timeout_ms) != StatusCode.IN_PROGRESS, "transfer did not finish"
    assert status.Succeeded(), status.Message()


SIZES = [1, 7, 4096, 65537, 1 * MIB + 13, 64 * MIB]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("use_session", [False, True])
def test_single_read_write_bit_exact(pair, size, use_session):
    a, b, x, y, mx, my = pair
    rng = _rng()
    lo, ro = (3, 1) if size < 64 * MIB else (0, 0)  # unaligned offsets where room
    x[lo : lo + size] = rng.integers(0, 256, size, dtype=np.uint8)
    sess = a.create_session(mx, my) if use_session else None
    uid = a.allocate_transfer_uid()
    s = sess.write(lo, ro, size, uid) if sess else a.write(mx, lo, my, ro, size, uid)
    _check(s)
    assert np.array_equal(y[ro : ro + size], x[lo : lo + size])
    inbound = b.pop_inbound_transfer_status("a", uid)
    assert inbound is not None and inbound.Succeeded()
    assert b.pop_inbound_transfer_status("a", uid) is None  # popped once

    y[ro : ro + size] = rng.integers(0, 256, size, dtype=np.uint8)
    uid = a.allocate_transfer_uid()
    s = sess.read(lo, ro, size, uid) if sess else a.read(mx, lo, my, ro, size, uid)
    _check(s)
    assert np.array_equal(x[lo : lo + size], y[ro : ro + size])


@pytest.mark.parametrize("use_session", [False, True])
@pytest.mark.parametrize("write", [False, True])
def test_batch_bit_exact(pair, use_session, write):
    a, b, x, y, mx, my = pair
    rng = _rng()
    n = 300
    sizes = [int(s) for s in rng.integers(1, 70000, n)]
    lo = [i * 70001 + 5 for i in range(n)]
    ro = [(n - 1 - i) * 70003 + 1 for i in range(n)]  # scattered, reversed order
    src, dst = (x, y) if write else (y, x)
    so, do = (lo, ro) if write else (ro, lo)
    for o, s in zip(so, sizes, strict=True):
        src[o : o + s] = rng.integers(0, 256, s, dtype=np.uint8)
    uid = a.allocate_transfer_uid()
    if use_session:
        sess = a.create_session(mx, my)
        st = (sess.batch_write if write else sess.batch_read)(lo, ro, sizes, uid)
    else:
        st = (a.batch_write if write else a.batch_read)(mx, lo, my, ro, sizes, uid)
    _check(st)
    for s_off, d_off, s in zip(so, do, sizes, strict=True):
        assert np.array_equal(dst[d_off : d_off + s], src[s_off : s_off + s])
    assert b.pop_inbound_transfer_status("a", uid).Succeeded()


def test_many_concurrent_transfers_and_wait_all(pair):
    a, b, x, y, mx, my = pair
    rng = _rng()
    x[: 4 * MIB] = rng.integers(0, 256, 4 * MIB, dtype=np.uint8)
    sts = [
        a.write(mx, i * 4096, my, i * 4096, 4096, a.allocate_transfer_uid()) for i in range(1024)
    ]
    assert wait_all(sts, timeout_ms=20000)
    assert all(s.Succeeded() for s in sts)
    assert np.array_equal(y[: 4 * MIB], x[: 4 * MIB])
    assert a._engine.ledger_stats()["live"] == 0


def test_out_of_bounds_is_refused_locally_and_by_the_target(pair):
    a, b, x, y, mx, my = pair
    s = a.write(mx, 0, my, my.size - 10, 11, 1)
    assert s.Failed() and s.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS
    assert "exceeds remote memory" in s.Message()
    s = a.read(mx, mx.size, my, 0, 1, 1)
    assert s.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS and "local range" in s.Message()
    # A forged descriptor claiming a larger region: the target checks its own registry.
    forged = dataclasses.replace(my, size=1 << 40)
    before = y[-100:].copy()
    uid = a.allocate_transfer_uid()
    for op in (a.write, a.read):
        s = op(mx, 0, forged, my.size - 50, 100, uid)
        assert s.WaitFor(10000) != StatusCode.IN_PROGRESS and s.Failed()
        assert s.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS
        assert "refused by the target: out of bounds" in s.Message()
    assert np.array_equal(y[-100:], before)
    inbound = b.pop_inbound_transfer_status("a", uid)
    assert inbound is not None and inbound.Failed() and "out of bounds" in inbound.Message()
    # The connection still serves other transfers.
    _check(a.write(mx, 0, my, 0, 4096, 2))


def test_unregistered_memory_and_engines(pair):
    a, b, x, y, mx, my = pair
    z = np.arange(4096, dtype=np.uint8)
    mz = b.register_array(z)
    b.deregister_memory(mz)
    s = a.write(mx, 0, mz, 0, 16, 3)
    assert s.WaitFor(10000) != StatusCode.IN_PROGRESS and s.Code() == StatusCode.ERR_NOT_FOUND
    assert "not registered with the target" in s.Message()
    stale_id = dataclasses.replace(my, id=my.id + 1000)
    s = a.read(mx, 0, stale_id, 0, 16, 3)
    assert s.WaitFor(10000) != StatusCode.IN_PROGRESS and s.Code() == StatusCode.ERR_NOT_FOUND
    nobody = dataclasses.replace(my, engine_key="nobody")
    s = a.write(mx, 0, nobody, 0, 16, 3)
    assert s.Code() == StatusCode.ERR_NOT_FOUND and "'nobody' is not registered" in s.Message()
    with pytest.raises(mc.InvalidArgumentError, match="belongs to engine 'b'"):
        a.write(my, 0, my, 0, 1, 3)
    with pytest.raises(mc.NotFoundError):
        b.deregister_memory(mz)
    assert a.create_session(mx, nobody) is None  # MORI: no backend serves the pair
    _check(a.write(mx, 0, my, 0, 16, 4))


def test_engine_without_backend_and_uids():
    e = IOEngine("solo")
    f = IOEngine("other")
    f.create_backend(BackendType.TCP)
    e.register_remote_engine(f.get_engine_desc())
    buf = np.zeros(16, np.uint8)
    m = e.register_array(buf)
    s = e.write(m, 0, dataclasses.replace(m, engine_key="other"), 0, 4, 1)
    assert s.Code() == StatusCode.ERR_BAD_STATE and "create_backend" in s.Message()
    uids = {e.allocate_transfer_uid() for _ in range(1000)}
    assert len(uids) == 1000
    with pytest.raises(mc.NotSupportedError):
        e.create_backend(BackendType.RDMA)
    desc = e.get_engine_desc()
    assert desc.port > 0 and desc.key == "solo"


def test_deregistered_peer_fails_at_once_until_registered_again(pair):
    a, b, x, y, mx, my = pair
    bd = b.get_engine_desc()
    a.deregister_remote_engine(bd)
    s = a.write(mx, 0, my, 0, 16, 5)
    assert s.Code() == StatusCode.ERR_NOT_FOUND
    a.register_remote_engine(bd)
    _check(a.write(mx, 0, my, 0, 16, 6))


def test_dlpack_and_raw_pointer_registration(pair):
    a, b, x, y, mx, my = pair

    class OnlyDlpack:
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    arr = np.arange(1000, dtype=np.int32)
    md = a.register_array(OnlyDlpack(arr))
    assert md.data == arr.ctypes.data and md.size == arr.nbytes
    raw = a.register_memory(arr.ctypes.data, arr.nbytes, -1)
    _check(a.write(raw, 0, my, 0, arr.nbytes, 7))
    assert np.array_equal(y[: arr.nbytes].view(np.int32), arr)
    with pytest.raises(mc.InvalidArgumentError, match="contiguous"):
        a.register_array(np.zeros((4, 4))[:, ::2])


def test_session_follows_its_peer_and_serves_several_threads():
    """A session looks its remote engine up per operation: threads sharing one session
    move exact bytes, a transfer after the engine was deregistered fails as for an
    unknown engine, and one after it was registered again succeeds."""
    import threading

    a, b = IOEngine("sess-a"), IOEngine("sess-b")
    for e in (a, b):
        e.create_backend(BackendType.TCP, TcpBackendConfig(num_worker_threads=2))
    a.register_remote_engine(b.get_engine_desc())
    rng = _rng()
    x = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    y = np.zeros_like(x)
    mx, my = a.register_array(x), b.register_array(y)
    sess = a.create_session(mx, my)
    quarter = len(x) // 4
    errors: list[str] = []

    def write_quarter(q: int) -> None:
        offs = list(range(q * quarter, (q + 1) * quarter, 4096))
        for _ in range(5):
            s = sess.batch_write(offs, offs, [4096] * len(offs), a.allocate_transfer_uid())
            if s.WaitFor(20000) == StatusCode.IN_PROGRESS or not s.Succeeded():
                errors.append(f"quarter {q}: {s.Message()}")

    threads = [threading.Thread(target=write_quarter, args=(q,)) for q in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert np.array_equal(x, y)
    a.deregister_remote_engine(b.get_engine_desc())
    s = sess.write(0, 0, 4096, a.allocate_transfer_uid())
    assert s.Failed() and s.Detail() == StatusDetail.ERR_NOT_FOUND, s.Message()
    a.register_remote_engine(b.get_engine_desc())
    y[:] = 0
    _check(sess.write(0, 0, 4096, a.allocate_transfer_uid()))
    assert np.array_equal(x[:4096], y[:4096])
    a.close()
    b.close()
