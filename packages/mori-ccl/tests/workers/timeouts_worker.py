# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the timeout-rule tests on a host heap. argv: mode seed [timeout_s]

  huge   a Communicator with ``timeout_s`` (inf, 1e300, 1e10: "practically forever",
         saturated to a year); rank 1 comes 0.3 s late to every call, and every call
         completes on both ranks with the exact result.
  late   rank 1 comes to an all-reduce (one-shot, then two-shot, each on a new
         communicator; staged inputs) only after rank 0 timed out in it: the call fails
         on both ranks, rank 1's naming rank 0, and both communicators refuse later calls.
Prints "rank N ok" last.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import mori.ccl as ccl
import mori.core as mc
from mori.core.launch import expect_raises as expect

mode = sys.argv[1]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
MAX_BYTES = 64 << 10
LATE_S = 0.3
YEAR_S = 365 * 24 * 3600  # mori.core.timeouts.MAX_TIMEOUT_S


def late() -> None:
    if rank == 1:
        time.sleep(LATE_S)


def timed(call):
    start = time.monotonic()
    out = call()
    waited = time.monotonic() - start
    if rank == 0:
        assert waited >= LATE_S / 2, f"returned after {waited:.3f} s"
    return out


def run_huge(timeout_s: float) -> None:
    comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=timeout_s)
    assert mc.shmem.info()["kind"] == "host" and not comm.cuda
    total = world * (world + 1) // 2
    for algorithm in ("one_shot", "two_shot"):
        x = torch.full((1000,), rank + 1, dtype=torch.int32)
        late()
        timed(lambda x=x, a=algorithm: comm.all_reduce(x, algorithm=a))
        assert x.tolist() == [total] * 1000, (algorithm, x[:4])
    late()
    g = timed(lambda: comm.all_gather(torch.tensor([rank], dtype=torch.int32)))
    assert g.tolist() == list(range(world))
    late()
    timed(comm.barrier)
    assert comm.timeout_s == min(timeout_s, YEAR_S) == mc.timeouts.MAX_TIMEOUT_S, comm.timeout_s
    print(f"rank {rank}: timeout_s={timeout_s} -> {comm.timeout_s} s, a rank {LATE_S} s late")


def run_late(algorithm: str) -> None:
    comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=1.0)
    comm.barrier()  # call 1: both arrive
    x = torch.full((100,), rank + 1, dtype=torch.float32)
    if rank == 0:
        msg = expect(
            mc.MoriTimeoutError, "rank 1 did not arrive", comm.all_reduce, x, algorithm=algorithm
        )
        assert "all_reduce (call 2) on rank 0" in msg, msg
        dist.barrier()  # rank 1 comes only now
    else:
        dist.barrier()
        msg = expect(
            mc.MoriTimeoutError,
            "rank 0 timed out waiting for this rank to arrive before it did",
            comm.all_reduce,
            x,
            algorithm=algorithm,
        )
        assert "all_reduce (call 2) on rank 1" in msg, msg
        assert x.tolist() == [2.0] * 100, "the failed call wrote the output"
    expect(mc.InvalidStateError, "timed out earlier", comm.barrier)
    dist.barrier()
    print(f"rank {rank}: {algorithm}: a rank that came after the timeout failed too")


if mode == "huge":
    run_huge(float(sys.argv[3]))
elif mode == "late":
    run_late("one_shot")
    run_late("two_shot")
else:
    raise SystemExit(f"unknown mode {mode!r}")
dist.destroy_process_group()
print(f"rank {rank} ok")
