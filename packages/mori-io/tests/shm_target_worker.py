# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A target for the SHM exit/stop tests (not a test module); the test process is the
initiator.

python shm_target_worker.py <dir> [mapped|cma]

Registers 1 MiB of shared host memory (mapped: the initiator maps it and writes with
memcpy) or of a numpy array (cma: the initiator writes with process_vm_writev), publishes its descriptors in <dir>, registers the initiator and writes
<dir>/ready. Then waits for <dir>/uids ("uid uid ... <sha256 of the region>"), pops
every uid's inbound status (bounded) and checks the region's bytes."""

import hashlib
import sys
import time

import numpy as np
from file_rendezvous import publish, wait_file

from mori.io import BackendType, EngineDesc, IOEngine, allocate_shared_host_memory

SIZE = 1 << 20


def main():
    d = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "mapped"
    eng = IOEngine("target")
    eng.create_backend(BackendType.TCP)
    eng.create_backend(BackendType.SHM)
    block = allocate_shared_host_memory(SIZE) if mode == "mapped" else np.zeros(SIZE, np.uint8)
    mem = eng.register_array(block)
    publish(f"{d}/engine", eng.get_engine_desc().pack())
    publish(f"{d}/mem", mem.pack())
    eng.register_remote_engine(EngineDesc.unpack(wait_file(f"{d}/initiator")))
    publish(f"{d}/ready", b"1")
    *uids, digest = wait_file(f"{d}/uids", timeout_s=120).decode().split()
    deadline = time.monotonic() + 10
    for uid in map(int, uids):
        while (st := eng.pop_inbound_transfer_status("initiator", uid)) is None:
            assert time.monotonic() < deadline, f"no inbound status for uid {uid}"
            time.sleep(0.001)
        assert st.Succeeded(), st
    assert hashlib.sha256(bytes(block)).hexdigest() == digest, "target bytes differ"
    print(f"target popped {len(uids)} statuses, bytes verified", flush=True)


if __name__ == "__main__":
    main()
