# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the mori.shmem (ROCm/mori names) tests. argv: mode seed [uid_file]

The heap is wherever mori.shmem puts it, as in ROCm/mori: on the current CUDA
device when torch sees one (the GPU test; pe r uses GPU r % count, so 2 pes may
share one GPU), else on the host (the CPU test hides every GPU).

mode "torch-pg": gloo process group registered as "default", then
shmem_torch_process_group_init("default"), as ROCm/mori's examples start.
mode "uid": no torch.distributed; rank 0 writes shmem_get_unique_id() to
uid_file, every rank reads it and calls shmem_init_attr. Both then run the same
checks and print "pe N ok".
"""

import ctypes
import os
import random
import sys
import time

import torch

import mori
import mori.core as mc
from mori.core.launch import expect_raises as expect_error

mode, seed = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
ms = mori.shmem
CUDA = torch.cuda.is_available()
if CUDA:
    torch.cuda.set_device(rank % torch.cuda.device_count())


def words(addr: int, count: int) -> torch.Tensor:
    """``count`` int64 words at heap address ``addr``, as a tensor on the heap's device."""
    if CUDA:
        return torch.as_tensor(
            ms.MoriShmemBuffer(addr, 8 * count, torch.int64), device="cuda"
        ).view(torch.int64)
    return torch.frombuffer((ctypes.c_char * (8 * count)).from_address(addr), dtype=torch.int64)


if mode == "torch-pg":
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    expect_error(
        mc.InvalidArgumentError,
        "no process group is registered under the name 'default'",
        ms.shmem_torch_process_group_init,
        "default",
    )
    torch._C._distributed_c10d._register_process_group("default", dist.group.WORLD)
    assert ms.shmem_torch_process_group_init("default") == 0
    expect_error(
        mc.InvalidStateError, "already initialized", ms.shmem_torch_process_group_init, "default"
    )
elif mode == "uid":
    uid_file = sys.argv[3]
    if rank == 0:
        uid = ms.shmem_get_unique_id()
        with open(uid_file + ".tmp", "wb") as f:
            f.write(uid)
        os.replace(uid_file + ".tmp", uid_file)
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(uid_file):
            assert time.monotonic() < deadline, f"no unique id in {uid_file} after 60 s"
            time.sleep(0.01)
        with open(uid_file, "rb") as f:
            uid = f.read()
    assert ms.shmem_init_attr(ms.MORI_SHMEM_INIT_WITH_UNIQUEID, rank, world, uid) == 0
    assert "torch.distributed" not in sys.modules or not torch.distributed.is_initialized()
else:
    raise SystemExit(f"unknown mode {mode!r}")

me, n = ms.shmem_mype(), ms.shmem_npes()
assert (me, n) == (rank, world), (me, n, rank, world)

# shmem_malloc returns an int address, the same heap offset on every pe.
ptr = ms.shmem_malloc(8 * world)
assert isinstance(ptr, int) and ptr != 0 and ptr % 256 == 0, ptr
aligned = ms.shmem_malloc_align(4096, 100)
assert isinstance(aligned, int) and aligned % 4096 == 0, hex(aligned)

# shmem_ptr_p2p: this pe's address for itself, a load/store address for each peer.
assert ms.shmem_ptr_p2p(ptr, me, me) == ptr
expect_error(mc.InvalidArgumentError, f"my_pe {me + 1} is not", ms.shmem_ptr_p2p, ptr, me + 1, 0)
expect_error(mc.InvalidArgumentError, f"dest_pe {n} out of range", ms.shmem_ptr_p2p, ptr, me, n)
for pe in range(n):
    remote = ms.shmem_ptr_p2p(ptr, me, pe)
    assert remote != 0 and (pe == me or remote != ptr), (pe, hex(remote))
    words(remote + 8 * me, 1).fill_(1000 * me + pe + 1)
if CUDA:
    torch.cuda.synchronize()
ms.shmem_barrier_all()
got = words(ptr, n).tolist()
assert got == [1000 * src + me + 1 for src in range(n)], got
ms.shmem_barrier_all()

# Tensor helpers: one symmetric tensor, each pe's copy reachable from every pe.
cols = random.Random(seed).randrange(1, 64)  # the same on every pe: malloc is collective
t = ms.mori_shmem_create_tensor((3, cols), torch.float32)
assert t.shape == (3, cols) and t.dtype == torch.float32 and t.__symm_tensor__
assert ms.shmem_ptr_p2p(t.data_ptr(), me, me) == t.data_ptr()
assert t.device.type == ("cuda" if CUDA else "cpu"), t.device
t.fill_(float(me + 1))
if CUDA:
    torch.cuda.synchronize()
ms.shmem_barrier_all()
for pe in range(n):
    view = ms.symm_mori_shmem_tensor(t, pe)
    assert (view is t) == (pe == me)
    assert torch.equal(view.cpu(), torch.full((3, cols), float(pe + 1))), f"pe {pe}'s copy"
views = ms.mori_shmem_create_tensor_list_intra_node((5,), torch.int64, n)
assert len(views) == n and views[me].__symm_tensor__
for pe in range(n):
    views[pe][me] = 100 * me + pe  # write my slot into every pe's copy
if CUDA:
    torch.cuda.synchronize()
ms.shmem_barrier_all()
assert views[me].tolist()[:n] == [100 * src + me for src in range(n)], views[me].tolist()
buf = ms.MoriShmemBuffer(t.data_ptr(), t.nbytes, t.dtype)
interface = buf.__cuda_array_interface__ if CUDA else buf.__array_interface__
assert interface["data"][0] == t.data_ptr()
assert interface["shape"] == (t.nbytes,)
expect_error(
    mc.InvalidArgumentError,
    "was not made by mori_shmem_create_tensor",
    ms.symm_mori_shmem_tensor,
    torch.zeros(2),
    0,
)
ms.shmem_barrier_all()

# Finalize refuses while allocations live, on every pe; then succeeds.
expect_error(mc.InvalidStateError, "live symmetric allocations", ms.shmem_finalize)
ms.mori_shmem_free_tensor(t)
ms.mori_shmem_free_tensor(views[me])
ms.shmem_free(ptr)
ms.shmem_free(aligned)
expect_error(mc.InvalidArgumentError, "free of heap offset", ms.shmem_free, ptr)
assert ms.shmem_finalize() == 0
expect_error(mc.InvalidStateError, "not initialized", ms.shmem_mype)
if mode == "torch-pg":
    # gloo without destroy_process_group can abort at exit with "terminate called
    # without an active exception" (pytorch/pytorch#190489).
    torch.distributed.destroy_process_group()
print(f"pe {rank} ok")
