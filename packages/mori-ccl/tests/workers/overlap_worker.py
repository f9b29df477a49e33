# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the all_reduce ``out=`` overlap test on a host heap. argv: seed

``out`` that partly overlaps ``x`` is refused on every rank (as on CUDA heaps, as
torch's out= and NCCL refuse it), for staged and symmetric inputs; ``out=x`` and a
disjoint ``out`` work. Prints "rank N ok" last."""

import os

import torch
import torch.distributed as dist

import mori.ccl as ccl
import mori.core as mc
from mori.core.launch import expect_raises as expect

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
comm = ccl.Communicator(max_bytes=64 << 10, timeout_s=60)
assert mc.shmem.info()["kind"] == "host" and not comm.cuda
total = world * (world + 1) // 2

for make in (
    lambda shape, dtype: torch.empty(shape, dtype=dtype),
    comm.empty,
):  # staged, then symmetric (zero-copy) inputs
    for algorithm in ("one_shot", "two_shot"):
        buf = make((200,), torch.int32)
        buf.fill_(rank + 1)
        x, out = buf[:100], buf[50:150]
        expect(
            mc.InvalidArgumentError,
            "out partially overlaps x",
            comm.all_reduce,
            x,
            out=out,
            algorithm=algorithm,
        )
        assert buf.tolist() == [rank + 1] * 200, "a refused call wrote"
        assert comm.all_reduce(x, out=x, algorithm=algorithm) is x
        assert x.tolist() == [total] * 100
        out = buf[100:]
        assert comm.all_reduce(x, out=out, algorithm=algorithm) is out
        assert out.tolist() == [world * total] * 100
        del x, out, buf
print(f"rank {rank}: partial overlaps refused, out=x and disjoint out reduced")
dist.destroy_process_group()
print(f"rank {rank} ok")
