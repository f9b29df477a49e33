# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A worker for the two-process SHM tests (not a test module). Under launch_local,
rank 0 is the target, rank 1 the initiator.

python shm_peer_worker.py <dir> <seed> <expect>   expect: SHM or TCP (the backend the
initiator must see for host memory; TCP when CMA is refused or TCP forced).

The target registers 8 MiB + 5 bytes from <seed>, publishes its descriptors in <dir>
and, when the initiator is done, checks its whole buffer against the image the
initiator predicted (sha256). The initiator runs reads, writes, batches and session
transfers of odd sizes at unaligned offsets, checks every read bit for bit, and checks
that an out-of-bounds request is refused by the target.
"""

import dataclasses
import hashlib
import os
import sys
import time

import numpy as np
from file_rendezvous import publish, wait_file

from mori.io import (
    BackendType,
    EngineDesc,
    IOEngine,
    MemoryDesc,
    StatusCode,
    StatusDetail,
    allocate_shared_host_memory,
)

SIZE = (8 << 20) + 5


def check(st):
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS, "transfer did not finish"
    assert st.Succeeded(), st.Message()


def main():
    d, seed, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    role = "target" if os.environ["RANK"] == "0" else "initiator"
    eng = IOEngine(role)
    eng.create_backend(BackendType.TCP)
    eng.create_backend(BackendType.SHM)
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 256, SIZE, dtype=np.uint8)
    if role == "target" and os.environ.get("MORI_TEST_SHARED_HOST") == "1":
        # The target's region lies inside shared host memory (at an odd offset): the
        # initiator maps it and copies with memcpy instead of CMA.
        block = np.asarray(allocate_shared_host_memory(SIZE + 4099))  # a zero-copy view
        block[3 : 3 + SIZE] = buf
        buf = block[3 : 3 + SIZE]
    mem = eng.register_array(buf)
    if role == "target":
        publish(f"{d}/engine", eng.get_engine_desc().pack())
        publish(f"{d}/mem", mem.pack())
        eng.register_remote_engine(EngineDesc.unpack(wait_file(f"{d}/initiator")))
        digest = wait_file(f"{d}/done").decode()
        assert hashlib.sha256(buf.tobytes()).hexdigest() == digest, "target bytes differ"
        uid = int(wait_file(f"{d}/uid"))
        deadline = time.monotonic() + 10  # a mapped write is announced after it completed
        while (st := eng.pop_inbound_transfer_status("initiator", uid)) is None:
            assert time.monotonic() < deadline, "no inbound status"
            time.sleep(0.005)
        assert st.Succeeded(), st
        print("target verified", SIZE, "bytes")
        return
    peer = EngineDesc.unpack(wait_file(f"{d}/engine"))
    remote = MemoryDesc.unpack(wait_file(f"{d}/mem"))
    eng.register_remote_engine(peer)
    publish(f"{d}/initiator", eng.get_engine_desc().pack())
    name, reason = eng.backend_for(mem, remote)
    print("backend", name, reason)
    assert name == expect, (name, reason)
    image = np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8)  # target's
    sess = eng.create_session(mem, remote)
    assert sess.backend() == (name, reason)
    uid = 0
    for size in (1, 3, 4095, 4097, 65537, (1 << 20) + 13, (3 << 20) + 1):
        for use_sess in (False, True):
            lo, ro = int(rng.integers(0, SIZE - size)), int(rng.integers(0, SIZE - size))
            # write: local -> remote; the model image follows
            buf[lo : lo + size] = rng.integers(0, 256, size, dtype=np.uint8)
            uid = eng.allocate_transfer_uid()
            st = (sess.write(lo, ro, size, uid) if use_sess
                  else eng.write(mem, lo, remote, ro, size, uid))  # fmt: skip
            check(st)
            image[ro : ro + size] = buf[lo : lo + size]
            # read back somewhere else and compare bit for bit
            lo2 = int(rng.integers(0, SIZE - size))
            st = (sess.read(lo2, ro, size, eng.allocate_transfer_uid()) if use_sess
                  else eng.read(mem, lo2, remote, ro, size, eng.allocate_transfer_uid()))  # fmt: skip
            check(st)
            assert np.array_equal(buf[lo2 : lo2 + size], image[ro : ro + size]), (size, use_sess)
    # batches: 257 blocks of 4099 bytes at unaligned, non-overlapping offsets
    n, blk = 257, 4099
    roffs = [7 + i * (blk + 3) for i in range(n)]
    loffs = [11 + i * (blk + 1) for i in range(n)]
    buf[: loffs[-1] + blk] = rng.integers(0, 256, loffs[-1] + blk, dtype=np.uint8)
    uid = eng.allocate_transfer_uid()
    check(sess.batch_write(loffs, roffs, [blk] * n, uid))
    for lo, ro in zip(loffs, roffs, strict=True):
        image[ro : ro + blk] = buf[lo : lo + blk]
    back = [SIZE // 2 + i * blk for i in range(n)]
    check(eng.batch_read(mem, back, remote, roffs, [blk] * n, eng.allocate_transfer_uid()))
    for b, ro in zip(back, roffs, strict=True):
        assert np.array_equal(buf[b : b + blk], image[ro : ro + blk])
    # a forged descriptor that claims more than the target registered: the local check
    # passes, the target refuses (or, for a mapped region, the size the target granted)
    forged = dataclasses.replace(remote, size=remote.size * 2)
    st = eng.read(mem, 0, forged, remote.size, 16, eng.allocate_transfer_uid())
    assert (
        st.WaitFor(10000) != StatusCode.IN_PROGRESS
        and st.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS
    ), st
    refused = ("refused by the target", f"as registered with 'target' ({remote.size} bytes)")
    assert any(r in st.Message() for r in refused), st.Message()
    st = eng.write(mem, 0, forged, remote.size - 8, 16, eng.allocate_transfer_uid())
    assert (
        st.WaitFor(10000) != StatusCode.IN_PROGRESS
        and st.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS
    ), st
    # the last successful batch write's uid is checked at the target
    last = eng.allocate_transfer_uid()
    check(eng.batch_write(mem, loffs[:3], remote, roffs[:3], [blk] * 3, last))
    publish(f"{d}/uid", str(last).encode())
    publish(f"{d}/done", hashlib.sha256(image.tobytes()).hexdigest().encode())
    print("initiator verified", SIZE, "bytes over", name)
    print("shm mapping state", eng._engine.shm_mapping_state("target", remote.id))


if __name__ == "__main__":
    main()
