# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of cpu_all_reduce over a gloo TorchBootstrap and a native TcpBootstrap."""

import os
import sys

import torch
import torch.distributed as dist

from mori.ccl import cpu_all_reduce
from mori.core.bootstrap import TcpBootstrap, TorchBootstrap

seed, rank = int(sys.argv[1]), int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
for boot in (TorchBootstrap(), TcpBootstrap.from_env()):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        inputs = [
            (torch.randn(1000, generator=torch.Generator().manual_seed(seed + r)) * 100).to(dtype)
            for r in range(world)
        ]
        mine = inputs[rank].clone()
        cpu_all_reduce(mine, boot)
        acc = torch.zeros(1000, dtype=torch.float64)
        for t in inputs:
            acc += t.double()
        if dtype == torch.int64:
            assert torch.equal(mine, acc.to(torch.int64))
        else:
            # fp32 accumulation in rank order, one rounding to dtype at the end.
            ref = torch.zeros(1000, dtype=torch.float32)
            for t in inputs:
                ref += t.float()
            assert torch.equal(mine, ref.to(dtype)), (dtype, (mine.float() - ref).abs().max())
dist.destroy_process_group()
print(f"rank {rank} ok")
