# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the tests of ranks that disagree (CPU, host heap). argv: scenario seed.
  config  rank 1 builds the op with another hidden_dim (the blocks' sizes differ), then
          with another num_experts_per_rank (they do not): every rank raises
          InvalidArgumentError naming the field and both values; then an op with the
          same config works
  dtype   rank 1 dispatches fp32 tokens while rank 0 dispatches bf16: every rank fails
          that call naming both dtypes, no data moved; the op then dispatches and
          combines correctly
  combine rank 1 combines fp32 rows while rank 0 combines bf16 (the combine words carry
          the dtype): every rank fails that call naming both, outputs not written; the
          op then dispatches and combines correctly
  ll      the low-latency kernel types (IntraNodeLL, AsyncLL), whose flags carry each
          call's wire tag: token-major dispatches of other dtypes, DeepEP's dispatch
          with and without the fp8 cast, a token-major dispatch beside an expert-major
          one, and token-major combines of other dtypes each fail that call on every
          rank naming both sides; the op then dispatches and combines correctly
Prints "rank N ok" last.
"""

import os
import sys

import torch
import torch.distributed as dist

import mori.core as mc
from mori.core import shmem
from mori.core.launch import expect_raises as expect
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

scenario, seed = sys.argv[1], int(sys.argv[2])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
shmem.init(device="cpu", heap_size="64M", timeout_s=60)
gen = torch.Generator().manual_seed(seed * 13 + rank)
print(f"rank {rank}: seed {seed}", flush=True)
M, EPR, K = 8, 2, 2


def config(hidden=128, epr=EPR, tsize=4) -> EpDispatchCombineConfig:
    return EpDispatchCombineConfig(torch.bfloat16, rank, world, hidden, 0, 4, tsize, M, epr, K)


def to_all(n: int) -> torch.Tensor:
    """Every token to every rank (slot j: rank j's first expert)."""
    return (torch.arange(K, dtype=torch.int32) * EPR).repeat(n, 1) % (EPR * world)


def round_trip(op, dtype) -> None:
    n = int(torch.randint(1, M + 1, (1,), generator=gen))
    x = torch.randn(n, 128, generator=gen).to(dtype)
    out, _, _, _, total = op.dispatch(x, None, None, to_all(n))
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([n]))
    assert int(total.item()) == sum(int(c) for c in counts)
    y, _ = op.combine(out[: int(total.item())], None, None)
    want = (x.float() * min(world, K)).to(dtype) if world <= K else None
    if want is not None:
        assert torch.equal(y, want), "combine of every rank's copies"


def run_config() -> None:
    for kw, field, a, b in ((dict(hidden=256), "hidden_dim", 128, 256),
                            (dict(epr=4), "num_experts_per_rank", EPR, 4)):  # fmt: skip
        cfg = config(**kw) if rank == 1 else config()
        msg = f"{field} is {a} on rank 0 and {b} on rank 1"
        expect(mc.InvalidArgumentError, msg, EpDispatchCombineOp, cfg)
    op = EpDispatchCombineOp(config())
    round_trip(op, torch.bfloat16)
    op.close()


def run_dtype() -> None:
    op = EpDispatchCombineOp(config())
    n = 3
    dtype = torch.float32 if rank == 1 else torch.bfloat16
    x = torch.randn(n, 128, generator=gen).to(dtype)
    msg = "rank 0 passes bfloat16 and rank 1 passes float32"
    expect(mc.InvalidArgumentError, msg, op.dispatch, x, None, None, to_all(n))
    for dtype in (torch.bfloat16, torch.float32):
        round_trip(op, dtype)
    op.close()


def run_combine() -> None:
    op = EpDispatchCombineOp(config())
    n = 4
    x = torch.randn(n, 128, generator=gen).to(torch.bfloat16)
    out, _, _, _, total = op.dispatch(x, None, None, to_all(n))
    y = out[: int(total.item())]
    y = y.float() if rank == 1 else y
    theirs, mine = ("float32", "bfloat16") if rank == 0 else ("bfloat16", "float32")
    msg = f"combine input dtype differs between ranks: rank {1 - rank} passes {theirs}, this "
    expect(mc.InvalidArgumentError, msg + f"rank {mine}", op.combine, y, None, None)
    round_trip(op, torch.bfloat16)
    op.close()


def ll_calls(op, kind):
    """dispatch(x, idx) and combine(y, idx), each with its receive half (AsyncLL)."""
    split = kind == EpDispatchCombineKernelType.AsyncLL

    def dispatch(x, idx):
        out = op.dispatch(x, None, None, idx)
        if split:
            op.dispatch_recv()
        return out

    def combine(y, idx):
        out = op.combine(y, None, idx)
        if split:
            op.combine_recv()
        return out

    return dispatch, combine


def ll_round_trip(dispatch, combine) -> None:
    n = int(torch.randint(1, M + 1, (1,), generator=gen))
    x = torch.randn(n, 128, generator=gen).to(torch.bfloat16)
    idx = to_all(n)
    out, _, _, _, total = dispatch(x, idx)
    y, _ = combine(out[: int(total.item())], idx)
    assert torch.equal(y, (x.float() * min(world, K)).to(torch.bfloat16)), "LL round trip"


def run_ll() -> None:
    other = 1 - rank
    for kind in (EpDispatchCombineKernelType.IntraNodeLL, EpDispatchCombineKernelType.AsyncLL):
        op = EpDispatchCombineOp(
            EpDispatchCombineConfig(
                torch.bfloat16, rank, world, 128, 0, 4, 4, M, EPR, K, kernel_type=kind
            )
        )
        dispatch, combine = ll_calls(op, kind)

        n = 3
        idx = to_all(n)
        names = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
        mine_t = torch.float32 if rank == 1 else torch.bfloat16
        theirs_t = torch.bfloat16 if rank == 1 else torch.float32
        x = torch.randn(n, 128, generator=gen).to(mine_t)
        msg = f"rank {other} sends {names[theirs_t]} tokens, this rank {names[mine_t]}"
        expect(mc.InvalidArgumentError, msg, dispatch, x, idx)
        ll_round_trip(dispatch, combine)
        # DeepEP's expert-major dispatch, cast to fp8 on rank 1 only.
        xb = torch.randn(n, 128, generator=gen).to(torch.bfloat16)
        cast = "expert-major bfloat16 cast to float8_e4m3fn"
        plain = "expert-major bfloat16"
        mine, theirs = (cast, plain) if rank == 1 else (plain, cast)
        msg = f"rank {other} sends {theirs} tokens, this rank {mine} "
        expect(mc.InvalidArgumentError, msg, op.low_latency_dispatch, xb, idx, M, EPR * world,
               use_fp8=rank == 1)  # fmt: skip
        ll_round_trip(dispatch, combine)
        # Token-major on rank 0, expert-major on rank 1.
        mine, theirs = (plain, "bfloat16") if rank == 1 else ("bfloat16", plain)
        msg = f"rank {other} sends {theirs} tokens, this rank {mine} "
        if rank == 1:
            expect(mc.InvalidArgumentError, msg, op.low_latency_dispatch, xb, idx, M,
                   EPR * world, use_fp8=False)  # fmt: skip
        else:
            expect(mc.InvalidArgumentError, msg, dispatch, xb, idx)
        ll_round_trip(dispatch, combine)
        # Token-major combines of other dtypes.
        out, _, _, _, total = dispatch(xb, idx)
        y = out[: int(total.item())]
        y = y.float() if rank == 1 else y
        msg = f"combine: rank {other} returns {names[theirs_t]} rows, this rank {names[mine_t]}"
        expect(mc.InvalidArgumentError, msg, combine, y, idx)
        ll_round_trip(dispatch, combine)
        op.close()


{"config": run_config, "dtype": run_dtype, "combine": run_combine, "ll": run_ll}[scenario]()
dist.barrier()
print(f"rank {rank} ok", flush=True)
dist.destroy_process_group()
