# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the inter-node kernels' device-failure tests (2 ranks on GPU 0 as 2 nodes
x 1: every byte to the other rank goes through the proxy). argv: case kind placement

case: bad_expert      rank 0 passes expert id E (out of range) at token 3 slot 2: its
                      dispatch kernel posts a rejection, prints the id and traps; rank
                      1's kernel traps naming rank 0
      absent_peer     rank 1 never calls dispatch: rank 0's kernel traps after the op's
                      timeout naming rank 1, its node and the stage
      combine_absent  both dispatch, rank 1 then stays away: rank 0's combine traps
                      naming rank 1, its node and the stage (combine entry)
      weights_differ  both dispatch, rank 0 combines with weights, rank 1 with None: both
                      kernels trap at the combine's entry vote naming the other rank
                      and what each passes
Prints "rank N outcome: <what happened>" then "rank N ok" (mori.core.testing.trap_case).
"""

import sys
import time

import torch
import torch.distributed as dist

from mori.core.testing import start_rank, trap_case, trap_report
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

case, kind, placement = sys.argv[1], sys.argv[2], sys.argv[3]
rank, world, _ = start_rank(placement, "256M", 60)

HIDDEN, M, EPR, K = 256, 16, 4, 4
E = EPR * world
cfg = EpDispatchCombineConfig(
    rank=rank,
    world_size=world,
    hidden_dim=HIDDEN,
    scale_dim=0,
    scale_type_size=4,
    max_token_type_size=2,
    max_num_inp_token_per_rank=M,
    num_experts_per_rank=EPR,
    num_experts_per_token=K,
    warp_num_per_block=8,
    data_type=torch.bfloat16,
    kernel_type=EpDispatchCombineKernelType[kind],
    gpu_per_node=1,
)
op = EpDispatchCombineOp(cfg, timeout_s=3.0)
n = 8
x = torch.randn(n, HIDDEN, device="cuda").to(torch.bfloat16)
w = torch.rand(n, K, device="cuda")
idx = torch.stack([torch.randperm(E)[:K] for _ in range(n)]).to(torch.int32).cuda()
if case == "bad_expert" and rank == 0:
    idx[3, 2] = E
dist.barrier()


def call() -> None:
    out, out_w, _, _, total = op.dispatch(x, w, None, idx)
    torch.cuda.synchronize()
    if case == "combine_absent":
        if rank == 1:
            time.sleep(8.0)
            trap_report(rank, "stayed away")
        op.combine(out[: int(total.item())], None, idx)
    if case == "weights_differ":
        rows = out[: int(total.item())]
        op.combine(rows, out_w[: rows.size(0)] if rank == 0 else None, idx)


trap_case(rank, case, call, completed="dispatch completed")
