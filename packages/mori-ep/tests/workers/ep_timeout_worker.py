# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the timeout-rule tests. argv: timeout_s seed

Every kernel type's op is made with ``timeout_s`` (inf, 1e300, 1e10: "practically
forever", saturated to a year); rank 1 comes 0.3 s late to every dispatch and combine,
and every call still completes on both ranks with the exact result. Prints "rank N ok".
"""

import sys
import time

import torch
import torch.distributed as dist

from mori.core import shmem
from mori.core.testing import start_rank
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

timeout_s = float(sys.argv[1])
rank, world, _ = start_rank("cpu", "64M", 60)
HIDDEN, M, EPR, K = 128, 4, 2, 2
E = EPR * world
LATE_S = 0.3
YEAR_S = 365 * 24 * 3600  # mori.core.timeouts.MAX_TIMEOUT_S


def late() -> None:
    if rank == 1:
        time.sleep(LATE_S)


for kind in (
    EpDispatchCombineKernelType.IntraNode,
    EpDispatchCombineKernelType.IntraNodeLL,
    EpDispatchCombineKernelType.AsyncLL,
):
    cfg = EpDispatchCombineConfig(
        torch.bfloat16, rank=rank, world_size=world, hidden_dim=HIDDEN, scale_dim=0,
        scale_type_size=4, max_token_type_size=2, max_num_inp_token_per_rank=M,
        num_experts_per_rank=EPR, num_experts_per_token=K, kernel_type=kind,
    )  # fmt: skip
    op = EpDispatchCombineOp(cfg, timeout_s=timeout_s)
    async_ll = kind == EpDispatchCombineKernelType.AsyncLL
    x = (torch.arange(M, dtype=torch.float32)[:, None] + 10 * rank + 1).expand(-1, HIDDEN)
    x = x.to(torch.bfloat16).contiguous()
    idx = torch.tensor([[(t + j) % E for j in range(K)] for t in range(M)], dtype=torch.int32)
    # The combine sums one copy of the token per destination rank (rows unchanged here).
    ranks = torch.tensor([len({int(e) // EPR for e in row}) for row in idx], dtype=torch.float32)
    for _ in range(2):
        late()
        start = time.monotonic()
        args = (x, torch.ones(M, K), None, idx)
        if async_ll:
            out, out_w, _, _, total = op.dispatch_send(*args)
            op.dispatch_recv()
        else:
            out, out_w, _, _, total = op.dispatch(*args)
        waited = time.monotonic() - start
        if rank == 0:
            assert waited >= LATE_S / 2, f"{kind.name}: dispatch returned after {waited:.3f} s"
        n = int(total.item())
        late()
        if async_ll:
            cout, _ = op.combine_send(out[:n].clone(), out_w[:n].clone(), idx)
            op.combine_recv()
        else:
            cout, _ = op.combine(out[:n].clone(), out_w[:n].clone(), idx)
        want = ranks[:, None] * x.float()
        assert torch.equal(cout[:M].float(), want), (kind.name, cout[:M, 0], want[:, 0])
    assert op.timeout_s == min(timeout_s, YEAR_S), op.timeout_s
    op.close()
    print(f"rank {rank}: {kind.name} completed with a rank {LATE_S} s late", flush=True)

shmem.barrier_all()
import gc  # noqa: E402

gc.collect()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
