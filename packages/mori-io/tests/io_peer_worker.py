# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A worker for the two-process tests (not a test module).

target <dir> <seed> [shm]: registers 32 MiB filled from <seed>, publishes its descriptors in
                      <dir>, serves until <dir>/done appears (at most 60 s).
initiator <dir> <seed>: reads the target's region and checks it, writes random bytes
                      and publishes their checksum for the target to verify.
"""

import hashlib
import os
import sys

import numpy as np
from file_rendezvous import publish, wait_file

from mori.io import BackendType, EngineDesc, IOEngine, MemoryDesc, StatusCode

SIZE = 32 << 20


def main():
    role, d, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "rank":  # under launch_local: rank 0 is the target
        role = "target" if os.environ["RANK"] == "0" else "initiator"
    eng = IOEngine(role)
    eng.create_backend(BackendType.TCP)
    if sys.argv[4:] == ["shm"]:
        eng.create_backend(BackendType.SHM)
    buf = np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8)
    mem = eng.register_array(buf)
    if role == "target":
        publish(f"{d}/engine", eng.get_engine_desc().pack())
        publish(f"{d}/mem", mem.pack())
        peer = EngineDesc.unpack(wait_file(f"{d}/initiator"))
        eng.register_remote_engine(peer)
        digest = wait_file(f"{d}/done").decode()
        assert hashlib.sha256(buf.tobytes()).hexdigest() == digest, "target bytes differ"
        uid = int(wait_file(f"{d}/uid"))
        st = eng.pop_inbound_transfer_status("initiator", uid)
        assert st is not None and st.Succeeded(), st
        print("target verified", SIZE, "bytes")
        return
    peer = EngineDesc.unpack(wait_file(f"{d}/engine"))
    remote = MemoryDesc.unpack(wait_file(f"{d}/mem"))
    eng.register_remote_engine(peer)
    publish(f"{d}/initiator", eng.get_engine_desc().pack())
    out = np.zeros(SIZE, np.uint8)
    mo = eng.register_array(out)
    st = eng.read(mo, 0, remote, 0, SIZE, eng.allocate_transfer_uid())
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    expect = np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8)
    assert np.array_equal(out, expect), "read bytes differ"
    new = np.random.default_rng(seed + 1).integers(0, 256, SIZE, dtype=np.uint8)
    out[:] = new
    uid = eng.allocate_transfer_uid()
    sizes = [SIZE // 256] * 256
    offs = [i * (SIZE // 256) for i in range(256)]
    st = eng.batch_write(mo, offs, remote, offs, sizes, uid)
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    publish(f"{d}/uid", str(uid).encode())
    publish(f"{d}/done", hashlib.sha256(new.tobytes()).hexdigest().encode())
    print("initiator verified", SIZE, "bytes")


if __name__ == "__main__":
    main()
