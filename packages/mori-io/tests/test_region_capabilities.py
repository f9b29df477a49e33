# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Per-region capabilities (README "Trust model"): a peer that holds the target's
EngineDesc but not a region's MemoryDesc cannot touch that region by guessing its id,
over TCP, SHM over CMA or SHM over shared host memory; a forged capability is answered
as an unknown region and moves no byte; descriptors of a deregistered region stay
refused after a new registration."""

import dataclasses
import random
import socket
import struct

import numpy as np
import pytest

from mori.io import (
    _C,
    BackendType,
    IOEngine,
    MemoryDesc,
    StatusCode,
    allocate_shared_host_memory,
)

HDR = struct.Struct("<BBHIQQQQQ")  # wire::Header (test_hostile_peers.py), capability last
VERSION = _C.wire_version
K_HELLO, K_WRITE, K_READ, K_WRITE_ACK, K_READ_DATA = 1, 2, 3, 4, 5
K_SHM_MAP_REQ, K_SHM_MAP_GRANT, K_SHM_CMA_REQ, K_SHM_CMA_GRANT = 24, 25, 29, 30
UNKNOWN_MEMORY = 1  # wire::WireStatus::kUnknownMemory


@pytest.fixture
def rng():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return np.random.default_rng(seed)


def _forgeries(desc: MemoryDesc, rng) -> list[MemoryDesc]:
    """The descriptor with no capability, a random one and one differing in one bit."""
    caps = [0, int(rng.integers(1, 1 << 63)), desc.capability ^ (1 << int(rng.integers(64)))]
    return [dataclasses.replace(desc, capability=c) for c in caps]


def _done(st):
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS, "transfer hung"
    return st


def test_memory_desc_carries_its_capability():
    e = IOEngine("cap-desc")
    try:
        e.create_backend(BackendType.TCP)
        a, b = (e.register_array(np.zeros(64, np.uint8)) for _ in range(2))
        assert a.capability != 0 and b.capability != 0 and a.capability != b.capability
        assert 0 < a.capability < 1 << 64
        assert MemoryDesc.unpack(a.pack()) == a and MemoryDesc.unpack(a.pack()).capability
        assert str(a.capability) not in repr(a)  # kept out of logs, like EngineDesc.secret
    finally:
        e.close()


@pytest.mark.parametrize("path", ["tcp", "shm-cma", "shm-mapped"])
def test_a_wrong_capability_is_refused_and_the_right_one_works(monkeypatch, engine_pair, rng, path):
    """Writes and reads naming a region by id with a forged capability fail as
    ERR_NOT_FOUND and leave the target's bytes as they were; the real descriptor then
    works. SHM asks for its grant with the capability: a refused grant is not cached."""
    if path == "shm-cma":
        monkeypatch.setenv("MORI_IO_SHM_MAP", "0")
    backends = (BackendType.TCP,) if path == "tcp" else (BackendType.TCP, BackendType.SHM)
    a, b = engine_pair(*backends)
    size = 64 << 10
    if path == "shm-mapped":
        target = np.asarray(allocate_shared_host_memory(size))
        target[:] = rng.integers(0, 256, size, dtype=np.uint8)
        md = b.register_array(target)
    else:
        target = rng.integers(0, 256, size, dtype=np.uint8)
        md = b.register_array(target)
    before = target.copy()
    src = rng.integers(0, 256, size, dtype=np.uint8)
    ms = a.register_array(src)
    sink = np.zeros(size, np.uint8)
    msink = a.register_array(sink)
    for forged in _forgeries(md, rng):
        st = _done(a.write(ms, 0, forged, 0, size, a.allocate_transfer_uid()))
        assert st.Code() == StatusCode.ERR_NOT_FOUND, (forged.capability, st.Message())
        st = _done(a.read(msink, 0, forged, 0, size, a.allocate_transfer_uid()))
        assert st.Code() == StatusCode.ERR_NOT_FOUND, (forged.capability, st.Message())
        assert np.array_equal(target, before), "a forged capability changed target bytes"
        assert not sink.any(), "a forged capability read target bytes"
    name, why = a.backend_for(ms, md)
    assert name == ("TCP" if path == "tcp" else "SHM"), why
    if path != "tcp":
        assert ("mapped" in why) == (path == "shm-mapped"), why
    st = _done(a.write(ms, 0, md, 0, size, a.allocate_transfer_uid()))
    assert st.Succeeded(), st.Message()
    assert np.array_equal(target, src)
    st = _done(a.read(msink, 0, md, 0, size, a.allocate_transfer_uid()))
    assert st.Succeeded() and np.array_equal(sink, src), st.Message()


def test_old_descriptors_stay_refused_after_reregistration(engine_pair, rng):
    """A region deregistered and registered again (the same memory) gets a new id and a
    new capability: the old descriptor, and the old capability under the new id, are
    refused; the new descriptor works."""
    a, b = engine_pair(BackendType.TCP)
    target = np.zeros(4096, np.uint8)
    old = b.register_array(target)
    b.deregister_memory(old)
    new = b.register_array(target)
    assert new.capability != old.capability
    src = rng.integers(0, 256, 4096, dtype=np.uint8)
    ms = a.register_array(src)
    for stale in (old, dataclasses.replace(new, capability=old.capability),
                  dataclasses.replace(old, id=new.id)):  # fmt: skip
        st = _done(a.write(ms, 0, stale, 0, 4096, a.allocate_transfer_uid()))
        assert st.Code() == StatusCode.ERR_NOT_FOUND, st.Message()
    assert not target.any()
    st = _done(a.write(ms, 0, new, 0, 4096, a.allocate_transfer_uid()))
    assert st.Succeeded() and np.array_equal(target, src), st.Message()


def _hello(port, key, secret):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(HDR.pack(K_HELLO, 0, VERSION, 0, 0, 0, 0, len(secret) + len(key), 0) + secret + key)
    return s


def _answer(s):
    h = HDR.unpack(s.recv(HDR.size, socket.MSG_WAITALL))
    payload = (
        s.recv(h[7], socket.MSG_WAITALL) if h[0] in (K_SHM_MAP_GRANT, K_SHM_CMA_GRANT) else b""
    )
    return h, payload


def test_raw_peer_guessing_ids_gets_nothing(rng):
    """A peer speaking the wire with the target's secret, naming the registered region's
    id with capability 0 or a guess: writes are refused (kUnknownMemory, no byte lands),
    reads answer no data, and CMA and map grant requests are refused without a range."""
    target = IOEngine("cap-target")
    try:
        target.create_backend(BackendType.TCP)
        target.create_backend(BackendType.SHM)
        plain = rng.integers(0, 256, 4096, dtype=np.uint8)
        shared = np.asarray(allocate_shared_host_memory(4096))
        shared[:] = rng.integers(0, 256, 4096, dtype=np.uint8)
        before = [plain.copy(), shared.copy()]
        mems = [target.register_array(plain), target.register_array(shared)]
        port, secret = target._engine.port, target._engine.secret
        for mem in mems:
            for cap in (0, int(rng.integers(1, 1 << 63)), mem.capability ^ 1):
                s = _hello(port, b"guesser", secret)
                try:
                    s.sendall(
                        HDR.pack(K_WRITE, 0, VERSION, 1, 7, mem.id, 0, 16, cap) + b"\x55" * 16
                    )
                    h, _ = _answer(s)
                    assert h[0] == K_WRITE_ACK and h[1] == UNKNOWN_MEMORY, h
                    s.sendall(HDR.pack(K_READ, 0, VERSION, 1, 8, mem.id, 0, 16, cap))
                    h, _ = _answer(s)
                    assert h[0] == K_READ_DATA and h[1] == UNKNOWN_MEMORY and h[7] in (0, 16), h
                finally:
                    s.close()
                for req, grant in (
                    (K_SHM_CMA_REQ, K_SHM_CMA_GRANT),
                    (K_SHM_MAP_REQ, K_SHM_MAP_GRANT),
                ):
                    s = _hello(port, b"guesser", secret)
                    try:
                        s.sendall(HDR.pack(req, 0, VERSION, 0, 0, mem.id, 0, 0, cap))
                        h, payload = _answer(s)
                        assert h[0] == grant and h[1] == UNKNOWN_MEMORY, (req, h)
                        assert str(mem.data).encode() not in payload
                    finally:
                        s.close()
        assert np.array_equal(plain, before[0]) and np.array_equal(shared, before[1])
        # The right capability is served on the same wire.
        s = _hello(port, b"holder", secret)
        try:
            mem = mems[0]
            s.sendall(
                HDR.pack(K_WRITE, 0, VERSION, 1, 9, mem.id, 0, 16, mem.capability) + b"\x55" * 16
            )
            h, _ = _answer(s)
            assert h[0] == K_WRITE_ACK and h[1] == 0, h
            assert (plain[:16] == 0x55).all()
        finally:
            s.close()
    finally:
        target.close()
