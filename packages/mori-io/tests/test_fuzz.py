# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Seeded fuzzing, bounded in time, of what a peer controls: the descriptor decoder
(mutated EngineDesc / MemoryDesc bytes) and the target's frame parser (random wire
frames on raw connections, without and with the target's secret).

Each test prints its seed; MORI_FUZZ_SEED replays one, MORI_FUZZ_SECONDS sets the
time spent per test (default 8 s, so CI spends well under a minute here). The
frame fuzzer checks that the target never crashes or hangs, never changes a byte
it did not register, changes nothing at all for peers without its secret, and
still serves a real initiator afterwards."""

import os
import random
import select
import socket
import struct
import time

import msgpack
import numpy as np

import mori.core as mc
from mori.io import (
    _C,
    BackendType,
    EngineDesc,
    IOEngine,
    MemoryDesc,
    MemoryLocationType,
    StatusCode,
)

HDR = struct.Struct("<BBHIQQQQQ")  # wire::Header (see test_hostile_peers.py)
VERSION = _C.wire_version
K_HELLO = 1
SECONDS = float(os.environ.get("MORI_FUZZ_SECONDS", "8"))
MIB = 1 << 20


def _seed(name: str) -> random.Random:
    seed = int(os.environ.get("MORI_FUZZ_SEED", random.randrange(1 << 32)))
    print(f"{name}: seed={seed} (MORI_FUZZ_SEED={seed} replays it)")
    return random.Random(seed)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and b:  # flip bits
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # overwrite a byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 2 and b:  # truncate
            del b[rng.randrange(len(b)) :]
        elif op == 3:  # insert random bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 4 and b:  # delete a run
            i = rng.randrange(len(b))
            del b[i : i + rng.randint(1, 8)]
        else:  # msgpack-level: replace one field with a value of another type
            try:
                obj = msgpack.unpackb(bytes(b))
            except Exception:  # noqa: BLE001 (not msgpack any more: keep the bytes)
                continue
            if isinstance(obj, list) and obj:
                pick = [None, -1, 2**64 - 1, "x" * rng.randint(0, 300), b"\x00", [1], {}, 1.5]
                obj[rng.randrange(len(obj))] = rng.choice(pick)
                b = bytearray(msgpack.packb(obj))
    return bytes(b)


def test_descriptor_decoder_refuses_mutations_cleanly():
    """Every mutated descriptor either decodes to a valid descriptor that packs back to
    itself, or raises InvalidArgumentError: never another exception, never a crash."""
    rng = _seed("descriptors")
    engine = EngineDesc("prefill-0", "10.0.0.1", 40123, "node1", 4242, ("TCP", "SHM"))
    mem = MemoryDesc("prefill-0", 7, -1, 0x7F00DEADB000, 1 << 30, MemoryLocationType.CPU)
    seeds = [(EngineDesc, engine.pack()), (MemoryDesc, mem.pack())]
    counts = {"decoded": 0, "refused": 0}
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        for _ in range(200):
            cls, data = rng.choice(seeds)
            data = _mutate(rng, data)
            try:
                got = cls.unpack(data)
            except mc.InvalidArgumentError:
                counts["refused"] += 1
                continue
            assert isinstance(got, cls), (data, got)
            assert cls.unpack(got.pack()) == got, data
            counts["decoded"] += 1
    print(counts)
    assert counts["refused"] > 0 and sum(counts.values()) > 1000, counts


def _frame(rng: random.Random, regions: list[tuple[int, int]]) -> bytes:
    """One random frame: mostly well-formed headers (the current version, plausible
    ids with their capabilities, offsets near the regions) with random types and
    payloads, sometimes garbage. ``regions``: (id, capability) of the target's regions."""
    if rng.random() < 0.05:
        return rng.randbytes(rng.randint(1, 96))
    kind = rng.randint(0, 40)
    status = rng.choice([0, 0, 0, rng.randrange(256)])
    version = VERSION if rng.random() < 0.9 else rng.randrange(1 << 16)
    num_parts = rng.choice([0, 1, 1, 2, rng.randrange(1 << 32)])
    uid = rng.choice([rng.randrange(16), rng.randrange(1 << 64)])
    mem_id, cap = rng.choice(regions + [(rng.randrange(64), 0), (rng.randrange(1 << 64), 0)])
    if rng.random() < 0.2:  # a forged or missing capability
        cap = rng.choice([0, rng.randrange(1 << 64), cap ^ 1])
    offset = rng.choice([0, rng.randrange(2 * MIB), rng.randrange(1 << 64), MIB - 8])
    length = rng.choice([0, rng.randrange(64), rng.randrange(8192), rng.randrange(1 << 64)])
    payload_len = length if length <= 8192 and rng.random() < 0.7 else rng.randrange(256)
    header = HDR.pack(kind, status, version, num_parts, uid, mem_id, offset, length, cap)
    return header + rng.randbytes(payload_len)


def _burst(port: int, prefix: bytes, frames: list[bytes]) -> None:
    """Send ``prefix`` then ``frames`` on one connection, draining whatever comes back;
    the target may close it at any point (that is one of its answers)."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return
    try:
        s.settimeout(0.2)  # bounds sendall; draining only takes what is already there
        # poll, not select: select refuses descriptors past FD_SETSIZE (1024), which a
        # long test process can reach.
        readable = select.poll()
        readable.register(s, select.POLLIN)
        for data in [prefix, *frames] if prefix else frames:
            s.sendall(data)
            while readable.poll(0):
                if not s.recv(65536):
                    return  # closed by the target
    except OSError:
        pass  # closed by the target, or its buffers are full: the next burst reconnects
    finally:
        s.close()


def test_frame_parser_survives_random_frames(capfd):
    rng = _seed("frames")
    target = IOEngine("fuzz-target")
    initiator = None
    try:
        target.create_backend(BackendType.TCP)
        target.create_backend(BackendType.SHM)
        # One 3 MiB block; only its middle MiB is registered. The guards around it
        # must never change, whatever an authenticated peer sends.
        block = np.frombuffer(rng.randbytes(3 * MIB), np.uint8).copy()
        before = block.copy()
        mem = target.register_array(block[MIB : 2 * MIB])
        spare = target.register_array(np.zeros(4096, np.uint8))
        port, secret = target._engine.port, target._engine.secret
        hello = HDR.pack(K_HELLO, 0, VERSION, 0, 0, 0, 0, len(secret) + 6, 0) + secret + b"fuzzer"
        wrong = bytes(b ^ 0x5A for b in secret)
        bad_hello = HDR.pack(K_HELLO, 0, VERSION, 0, 0, 0, 0, len(wrong) + 6, 0) + wrong + b"fuzzer"
        ids = [(mem.id, mem.capability), (spare.id, spare.capability)]

        # Peers without the secret: no hello, a wrong one, or garbage first.
        frames = 0
        deadline = time.monotonic() + SECONDS / 2
        while time.monotonic() < deadline:
            batch = [_frame(rng, ids) for _ in range(rng.randint(1, 20))]
            _burst(port, rng.choice([b"", bad_hello, rng.randbytes(40)]), batch)
            frames += len(batch)
        print("unauthenticated frames:", frames)
        time.sleep(0.2)  # let the reactor finish what it read
        assert np.array_equal(block, before), "a peer without the secret changed memory"
        # Thousands of refused hellos: their warnings are rate-limited, not one each.
        refusals = capfd.readouterr().err.count("refused a connection")
        print("refusal warnings logged:", refusals)
        assert refusals <= 4 * (SECONDS + 2), f"{refusals} refusal warnings: not rate-limited"

        # Peers with the secret: anything inside the registered regions may change,
        # nothing outside them.
        frames = 0
        deadline = time.monotonic() + SECONDS / 2
        while time.monotonic() < deadline:
            batch = [_frame(rng, ids) for _ in range(rng.randint(1, 20))]
            _burst(port, hello, batch)
            frames += len(batch)
        print("authenticated frames:", frames)
        time.sleep(0.2)
        assert np.array_equal(block[:MIB], before[:MIB]), "bytes below the region changed"
        assert np.array_equal(block[2 * MIB :], before[2 * MIB :]), "bytes past the region changed"

        # The target still serves a real initiator, bit for bit.
        initiator = IOEngine("fuzz-initiator")
        initiator.create_backend(BackendType.TCP)
        initiator.register_remote_engine(target.get_engine_desc())
        src = np.frombuffer(rng.randbytes(64 << 10), np.uint8).copy()
        local = initiator.register_array(src)
        st = initiator.write(local, 0, mem, 4096, src.size, initiator.allocate_transfer_uid())
        assert st.WaitFor(20000) != StatusCode.IN_PROGRESS, "write hung after fuzzing"
        assert st.Succeeded(), st.Message()
        assert np.array_equal(block[MIB + 4096 : MIB + 4096 + src.size], src)
        back = np.zeros_like(src)
        st = initiator.read(
            initiator.register_array(back),
            0,
            mem,
            4096,
            src.size,
            initiator.allocate_transfer_uid(),
        )
        assert st.WaitFor(20000) != StatusCode.IN_PROGRESS, "read hung after fuzzing"
        assert st.Succeeded(), st.Message()
        assert np.array_equal(back, src)
    finally:
        if initiator is not None:
            initiator.close()
        target.close()
