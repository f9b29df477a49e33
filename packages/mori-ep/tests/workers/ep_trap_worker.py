# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the device-side failure tests (2 ranks). argv: case placement

case: bad_expert   rank 0 passes expert id E (out of range) at token 3 slot 2: its
                   dispatch kernel prints the id and traps, rank 1's traps naming rank 0
      host_reject  rank 0 passes more tokens than max_num_inp_token_per_rank: it raises
                   InvalidArgumentError on the host, rank 1's kernel traps naming rank 0
      absent_peer  rank 1 never calls dispatch: rank 0's kernel traps after timeout_s
                   naming rank 1 and the stage (count words); ll_absent_peer,
                   ll_async_absent_peer: the same with IntraNodeLL / AsyncLL (dispatch flag)
      combine_absent, ll_combine_absent  both dispatch, rank 1 then stays away: rank 0's
                   combine traps naming rank 1 (combine rows / combine flag)
      ll_expert_dtype  dispatch_standard_moe (IntraNodeLL) of bf16 rows on rank 0 and
                   fp16 rows on rank 1: both receive halves print both wire tags and trap
      over_cap     max_total_recv_tokens 10: ranks 0 and 1 send 6 and 5 tokens to rank 0;
                   both kernels print the counts and trap (rank 0 at once, rank 1 after
                   the pause)
      dtype        rank 1 dispatches fp32 tokens, rank 0 bf16: both kernels print both
                   dtypes (the count words' row tags) and trap, rank 0 at once
      combine_dtype  both dispatch bf16, then rank 1 combines fp32 rows: both combine
                   kernels print both dtypes (the group words' tags) and trap
      ll_dtype, ll_combine_dtype  the same with kernel type IntraNodeLL (the flags'
                   wire tags): both receive halves print both and trap
      combine_weights, ll_combine_weights, ll_async_combine_weights  both dispatch,
                   rank 0 combines with weights, rank 1 with None (IntraNode: the group
                   words' weights bit; IntraNodeLL / AsyncLL: the combine flags' weights
                   count): both kernels print the other rank and what each passes, and trap
      ll_over_cap, ll_async_over_cap  kernel type IntraNodeLL / AsyncLL with
                   max_total_recv_tokens 8 (4 receive slots per source rank): rank 1
                   routes 5 tokens to rank 0 (rank 0 sends 3 there): both kernels print
                   rank 1, rank 0 and both counts and trap (rank 1 at once)
Prints "rank N outcome: <what happened>" then "rank N ok" (mori.core.testing.trap_case:
rank 1 of absent_peer stays away); a hang is the launcher's timeout.
"""

import sys
import time

import torch
import torch.distributed as dist

from mori.core.testing import start_rank, trap_case, trap_report
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

case, placement = sys.argv[1], sys.argv[2]
rank, world, _ = start_rank(placement, "256M", 60)

HIDDEN, M, EPR, K = 1024, 32, 4, 4
E = EPR * world
cfg = EpDispatchCombineConfig(
    rank=rank,
    world_size=world,
    hidden_dim=HIDDEN,
    scale_dim=0,
    scale_type_size=4,
    max_token_type_size=4 if "dtype" in case else 2,
    max_num_inp_token_per_rank=M,
    num_experts_per_rank=EPR,
    num_experts_per_token=K,
    warp_num_per_block=8,
    block_num=16,
    data_type=torch.bfloat16,
    max_total_recv_tokens={"over_cap": 10, "ll_over_cap": 8, "ll_async_over_cap": 8}.get(case, 0),
    kernel_type=EpDispatchCombineKernelType.AsyncLL
    if case.startswith("ll_async_")
    else EpDispatchCombineKernelType.IntraNodeLL
    if case.startswith("ll_")
    else EpDispatchCombineKernelType.IntraNode,
)
op = EpDispatchCombineOp(cfg, timeout_s=3.0)
n = M + 1 if (case == "host_reject" and rank == 0) else 16
if case == "over_cap":
    n = 6 if rank == 0 else 5
if case in ("ll_over_cap", "ll_async_over_cap"):
    n = 3 if rank == 0 else 5
x = torch.randn(n, HIDDEN, device="cuda")
x = x if case in ("dtype", "ll_dtype") and rank == 1 else x.to(torch.bfloat16)
if case == "ll_expert_dtype" and rank == 1:
    x = x.to(torch.float16)
w = torch.rand(n, K, device="cuda")
idx = torch.stack([torch.randperm(E)[:K] for _ in range(n)]).to(torch.int32).cuda()
if case == "bad_expert" and rank == 0:
    idx[3, 2] = E
if case in ("over_cap", "ll_over_cap", "ll_async_over_cap"):  # every token to expert 0 alone
    idx[:, 0] = 0
    idx[:, 1:] = -1
dist.barrier()


def call() -> None:
    if case == "ll_expert_dtype":
        op.dispatch_standard_moe(x, w, None, idx)
        torch.cuda.synchronize()
        return
    if case == "ll_combine_absent":
        recv, _, handle, _, _ = op.low_latency_dispatch(x, idx, M, E, use_fp8=False)
        torch.cuda.synchronize()
        if rank == 1:
            time.sleep(8.0)
            trap_report(rank, "stayed away")
        op.low_latency_combine(recv, idx, w, handle)
        torch.cuda.synchronize()
        return
    out, out_w, _, _, total = op.dispatch(x, w, None, idx)
    if cfg.kernel_type == EpDispatchCombineKernelType.AsyncLL:
        op.dispatch_recv()
    torch.cuda.synchronize()
    if case.endswith("combine_weights"):
        y = out[: int(total.item())]
        op.combine(y, out_w[: y.size(0)] if rank == 0 else None, idx)
        if cfg.kernel_type == EpDispatchCombineKernelType.AsyncLL:
            op.combine_recv()
    if case in ("combine_dtype", "ll_combine_dtype"):
        y = out[: int(total.item())]
        op.combine(y.float() if rank == 1 else y, None, idx)
    if case == "combine_absent":
        if rank == 1:
            time.sleep(8.0)
            trap_report(rank, "stayed away")
        op.combine(out[: int(total.item())], None, idx)


trap_case(rank, case, call, completed="dispatch completed")
