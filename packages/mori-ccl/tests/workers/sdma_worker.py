# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the MORI *Sdma adapter tests. argv: device (cpu | shared | per_gpu) seed

MORI's call shapes (AllgatherSdma, All2allSdma, AllreduceSdma with every dtype, in
place, start_async/wait_async, a stream) on a host heap or a CUDA heap, each result
compared with one computed here from every rank's input (all drawn from the seed).
Prints "rank N ok" last.
"""

import sys

import torch
import torch.distributed as dist

import mori.core as mc
from mori.ccl import All2allSdma, AllgatherSdma, AllreduceSdma
from mori.core.launch import expect_raises as expect
from mori.core.testing import start_rank

where, seed = sys.argv[1], int(sys.argv[2])
rank, world, dev = start_rank(where, "64M" if where == "cpu" else "256M", 60)
cuda = dev.type == "cuda"
stream = torch.cuda.Stream(device=dev) if cuda else None


def sync():
    if cuda:
        torch.cuda.synchronize()


def inputs(gen, n, dtype):
    if dtype in (torch.int32, torch.uint32):
        return [
            torch.randint(0, 1 << 31, (n,), generator=gen, dtype=torch.int64).to(dtype)
            for _ in range(world)
        ]
    return [torch.randint(-30, 31, (n,), generator=gen).to(dtype) for _ in range(world)]


gen = torch.Generator().manual_seed(seed)
# All-gather: count elements per pe; odd sizes; output larger than needed.
ag = AllgatherSdma(rank, world, input_buffer_size=1 << 16, output_buffer_size=world << 16)
for count in (1, 333, 4096):
    ins = inputs(gen, count, torch.bfloat16)
    out = torch.full((world * count + 5,), 7.0, dtype=torch.bfloat16, device=dev)
    assert ag(ins[rank].to(dev), out, count, stream=stream) is True
    sync()
    want = torch.cat([*ins, torch.full((5,), 7.0, dtype=torch.bfloat16)])
    assert torch.equal(out.cpu(), want), ("all_gather", count)

# All-to-all: chunk d of each pe's input goes to pe d.
a2a = All2allSdma(rank, world, transit_buffer_size=1 << 16)
for count in (1, 1000):
    ins = inputs(gen, count * world, torch.uint32)
    out = torch.zeros(count * world, dtype=torch.uint32, device=dev)
    assert isinstance(a2a(ins[rank].to(dev), out, count), float)
    sync()
    want = torch.cat([ins[s][rank * count : (rank + 1) * count] for s in range(world)])
    assert torch.equal(out.cpu().view(torch.int32), want.view(torch.int32)), ("all_to_all", count)

# All-reduce: every MORI dtype; uint32 wraps modulo 2^32; one-shot and two-shot sizes.
for dtype in (torch.uint32, torch.int32, torch.float32, torch.float16, torch.bfloat16):
    ar = AllreduceSdma(rank, world, transit_buffer_size=4 << 20, dtype=dtype)
    for count in (17, (1 << 20) // ar._element_size + 3):
        ins = inputs(gen, count, dtype)
        x = ins[rank].to(dev, copy=True)  # allreduce_inplace overwrites it
        out = torch.empty_like(x)
        assert ar(x, out, count, stream=stream) is True
        ar.allreduce_inplace(x, count, stream=stream)
        sync()
        if dtype in (torch.int32, torch.uint32):
            total = torch.stack([t.view(torch.int32).to(torch.int64) for t in ins]).sum(0)
            want = ((total + (1 << 31)) % (1 << 32) - (1 << 31)).to(torch.int32)  # wraps
            got = [out.cpu().view(torch.int32), x.cpu().view(torch.int32)]
        else:
            want = torch.stack([t.double() for t in ins]).sum(0).to(dtype)
            got = [out.cpu(), x.cpu()]
        for g in got:
            assert torch.equal(g, want), ("all_reduce", dtype, count)
    # Async: start on one stream, wait on another (or on the CPU, in order).
    ins = inputs(gen, 100, dtype)
    x = ins[rank].to(dev)
    out = torch.empty_like(x)
    assert ar.start_async(x, out, 100, stream=stream) and ar.is_async_in_progress()
    assert ar.wait_async() >= 0 and not ar.is_async_in_progress()
    sync()
    expect(mc.InvalidArgumentError, "no async call in progress", ar.wait_async)
    if dtype == torch.bfloat16:
        assert torch.equal(out.cpu(), torch.stack([t.double() for t in ins]).sum(0).to(dtype))
expect(ValueError, "Unsupported dtype", AllreduceSdma, rank, world, dtype=torch.float64)
expect(
    mc.NotSupportedError,
    "copy_output_to_user=False",
    AllgatherSdma,
    rank,
    world,
    copy_output_to_user=False,
)
expect(mc.InvalidArgumentError, f"the heap has pe {rank} of {world}", All2allSdma, rank, world + 1)
sync()
dist.barrier()
# gloo without destroy_process_group can abort at exit (pytorch/pytorch#190489).
dist.destroy_process_group()
print(f"rank {rank} ok")
