# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the trap probe (tests/test_trap_gpu.py): 2 processes on GPU 0 whose
kernels fail their launch as mori's kernels do (print, then trap). argv: case

case: alone            rank 0's kernel traps; rank 1 launches nothing
      together         both ranks' kernels trap at one moment of the GPU's global timer
      together_copies  the same while each rank's second thread copies device -> pinned
                       host memory on its own stream and waits for it in a loop, as a
                       mori proxy's lane does
Prints "rank N outcome: <what happened>" then "rank N ok" (mori.core.testing.trap_case).
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import mori.core as mc
from mori.core.testing import trap_case

case = sys.argv[1]
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("gloo")
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
# One moment for both, on the GPU's clock: 1.5 s after rank 0 reads it.
at = torch.tensor([mc._C._gpu_globaltimer_ns(0) + 1_500_000_000 if rank == 0 else 0])
dist.broadcast(at, 0)
at_ns = int(at.item())
traps = case != "alone" or rank == 0


def lane() -> None:
    stream = torch.cuda.Stream()
    src = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    while True:  # until the trap fails the stream's wait
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        try:
            stream.synchronize()
        except RuntimeError:
            return


if case == "together_copies":
    threading.Thread(target=lane, daemon=True).start()
dist.barrier()


def call() -> None:
    if traps:
        mc._C._trap_probe(0, at_ns, max_wait_s=10.0, tag=rank, blocks=4)
    else:
        time.sleep(3.0)


trap_case(rank, case, call, completed="no trap")
