# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A worker for the two-process P2P tests (not a test module).

target <dir> <seed>:    registers a GPU region (a sub-range of a larger allocation)
                        filled from <seed> on GPU 0, publishes its descriptors, checks
                        what the initiator wrote and the inbound statuses.
initiator <dir> <seed>: on GPU 1 when there is one (else GPU 0), reads the region
                        whole and as a batch of pages, writes a batch and an
                        unaligned range, and publishes the digest the target must see.
"""

import hashlib
import random
import sys

import torch
from file_rendezvous import publish, wait_file

from mori.io import BackendType, EngineDesc, IOEngine, MemoryDesc, StatusCode, StatusDetail

SIZE = 48 << 20  # spans several 20 MiB pieces of an expandable segment
PAGE = 64 << 10


def _fill(seed, n, dev):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).to(dev)


def main():
    role, d, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dev = torch.device("cuda", 0 if role == "target" else torch.cuda.device_count() - 1)
    torch.cuda.set_device(dev)
    eng = IOEngine(role)
    eng.create_backend(BackendType.TCP)
    eng.create_backend(BackendType.P2P)
    big = torch.zeros(SIZE + 2 * PAGE, dtype=torch.uint8, device=dev)
    region = big[PAGE + 512 : PAGE + 512 + SIZE]
    if role == "target":
        region.copy_(_fill(seed, SIZE, dev))
        torch.cuda.synchronize()
        mem = eng.register_torch_tensor(region)
        publish(f"{d}/engine", eng.get_engine_desc().pack())
        publish(f"{d}/mem", mem.pack())
        eng.register_remote_engine(EngineDesc.unpack(wait_file(f"{d}/initiator", 120)))
        digest = wait_file(f"{d}/done", 120).decode()
        torch.cuda.synchronize()
        got = hashlib.sha256(region.cpu().numpy().tobytes()).hexdigest()
        assert got == digest, "target bytes differ"
        assert torch.count_nonzero(big[: PAGE + 512]) == 0, "bytes before the region changed"
        assert torch.count_nonzero(big[PAGE + 512 + SIZE :]) == 0, "bytes after it changed"
        for uid in map(int, wait_file(f"{d}/uids").split()):
            st = None
            for _ in range(500):
                st = eng.pop_inbound_transfer_status("initiator", uid)
                if st is not None:
                    break
                torch.cuda._sleep(1000)
            assert st is not None and st.Succeeded(), (uid, st)
        # The initiator still holds its mapping: deregistering asks it to unmap and
        # waits for its confirmation.
        eng.deregister_memory(mem)
        publish(f"{d}/deregistered", b"1")
        wait_file(f"{d}/after", 120)
        print("target verified", SIZE, "bytes")
        eng.close()
        return
    rng = random.Random(seed)
    peer = EngineDesc.unpack(wait_file(f"{d}/engine", 120))
    remote = MemoryDesc.unpack(wait_file(f"{d}/mem", 120))
    eng.register_remote_engine(peer)
    publish(f"{d}/initiator", eng.get_engine_desc().pack())
    mem = eng.register_torch_tensor(region)
    name, why = eng.backend_for(mem, remote)
    assert name == "P2P", why
    expect = _fill(seed, SIZE, dev)
    st = eng.read(mem, 0, remote, 0, SIZE, eng.allocate_transfer_uid())
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    torch.cuda.synchronize()
    assert torch.equal(region, expect), "read bytes differ"
    # How the target exported it: a legacy IPC handle or the POSIX fds of cuMem pieces.
    print("export kind", eng._engine.p2p_mapping_kind("target", remote.id))
    # A page table: read a random set of pages into random slots (one kernel launch).
    npages = SIZE // PAGE
    src_pages = rng.sample(range(npages), 256)
    dst_pages = rng.sample(range(npages), 256)
    region.zero_()
    torch.cuda.synchronize()
    st = eng.batch_read(mem, [p * PAGE for p in dst_pages], remote, [p * PAGE for p in src_pages],
                        [PAGE] * 256, eng.allocate_transfer_uid())  # fmt: skip
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    torch.cuda.synchronize()
    for s, t in zip(src_pages, dst_pages, strict=True):
        assert torch.equal(region[t * PAGE : (t + 1) * PAGE], expect[s * PAGE : (s + 1) * PAGE])
    # Writes: a batch of pages, then an unaligned range across piece boundaries.
    new = _fill(seed + 1, SIZE, dev)
    region.copy_(new)
    torch.cuda.synchronize()
    uids = []
    wpages = rng.sample(range(npages), 300)
    uid = eng.allocate_transfer_uid()
    st = eng.batch_write(mem, [p * PAGE for p in wpages], remote, [p * PAGE for p in wpages],
                         [PAGE] * 300, uid)  # fmt: skip
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    uids.append(uid)
    for p in wpages:
        expect[p * PAGE : (p + 1) * PAGE] = new[p * PAGE : (p + 1) * PAGE]
    lo, n = 3, SIZE - 1000
    uid = eng.allocate_transfer_uid()
    st = eng.write(mem, lo, remote, lo + 1, n - 1, uid)
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    uids.append(uid)
    expect[lo + 1 : lo + n] = new[lo : lo + n - 1]
    # Past the target's registered size: refused, nothing moves.
    st = eng.write(mem, 0, remote, SIZE - 8, 16, eng.allocate_transfer_uid())
    assert st.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS, st.Message()
    torch.cuda.synchronize()
    publish(f"{d}/uids", " ".join(map(str, uids)).encode())
    publish(f"{d}/done", hashlib.sha256(expect.cpu().numpy().tobytes()).hexdigest().encode())
    wait_file(f"{d}/deregistered", 120)
    assert eng._engine.p2p_mapping_kind("target", remote.id) == -1, "still mapped after revoke"
    st = eng.read(mem, 0, remote, 0, 16, eng.allocate_transfer_uid())
    assert st.Failed() and st.Code() == StatusCode.ERR_NOT_FOUND, st.Message()
    publish(f"{d}/after", b"1")
    print("initiator verified", SIZE, "bytes")
    eng.close()


if __name__ == "__main__":
    main()
