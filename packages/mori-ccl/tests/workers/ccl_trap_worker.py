# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the CUDA collectives' failure tests (2 ranks). argv: case placement

case: absent_peer  rank 1 never calls: rank 0's kernel traps after timeout_s naming it
      mismatch     rank 0 all-reduces 100 floats, rank 1 96: both kernels trap printing
                   both calls
      host_reject  rank 0's input exceeds max_bytes: InvalidArgumentError there, rank 1's
                   kernel traps naming rank 0
      splits       all-to-all-v whose device splits do not pair up: both kernels trap
                   naming the pair
      zero_copy_mismatch  rank 0 passes a symmetric input (read in place), rank 1 an
                   ordinary one (staged): both kernels trap printing both calls
Prints "rank N outcome: <what happened>" then "rank N ok" (mori.core.testing.trap_case:
rank 1 of absent_peer stays away); a hang is the launcher's timeout.
"""

import sys

import torch
import torch.distributed as dist

import mori.ccl as ccl
from mori.core.testing import start_rank, trap_case

case, placement = sys.argv[1], sys.argv[2]
rank, world, _ = start_rank(placement, "64M", 60)
MAX_BYTES = 4096
comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=3.0)
comm.all_reduce(torch.ones(10, device="cuda"))  # one good call first
torch.cuda.synchronize()
sym = comm.empty((100,), torch.float32)  # collective: before the case splits the ranks
dist.barrier()


def call() -> None:
    if case == "absent_peer":
        comm.all_reduce(torch.ones(10, device="cuda"))
    elif case == "mismatch":
        comm.all_reduce(torch.ones(100 if rank == 0 else 96, device="cuda"))
    elif case == "host_reject":
        n = MAX_BYTES // 4 + (1 if rank == 0 else 0)
        comm.all_reduce(torch.ones(n, device="cuda"))
    elif case == "zero_copy_mismatch":
        sym.fill_(1.0)
        comm.all_reduce(sym if rank == 0 else torch.ones(100, device="cuda"))
    elif case == "splits":
        ins = torch.ones(world, dtype=torch.int64, device="cuda")
        outs = ins.clone()
        if rank == 0:
            outs[world - 1] = 2
        comm.all_to_all(
            torch.zeros(world, 4, device="cuda"),
            out=torch.zeros(world + 1, 4, device="cuda"),
            in_splits=ins,
            out_splits=outs,
        )


trap_case(rank, case, call)
