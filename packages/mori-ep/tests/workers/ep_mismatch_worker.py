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
  expert  the expert-major layout (IntraNodeLL, AsyncLL): dispatch_standard_moe of bf16
          rows on rank 0 beside fp16, fp32 or fp8 rows on rank 1, and DeepEP's fp8 cast
          with round_scale on one rank only, each fail that call on every rank naming
          both sides (no rank reads the other's rows as its own dtype); the op then
          dispatches and combines correctly
  stale   low_latency_combine with the handle of an earlier dispatch (rank 0 alone,
          then both ranks), or of another op: the call fails on every rank, the stale
          rank naming the handle's dispatch and the latest one; the latest handle then
          combines correctly (DeepEP's receive hook and zero-copy variants alike)
  weights KIND (IntraNode, IntraNodeLL or AsyncLL; world 2 or 4): the last rank combines
          with weights and the others with None, then the reverse: every rank fails that
          call naming a rank that passes the other and what each passes (a rank sends
          weights only when it combines them, so a receiver asking for them would read
          an earlier call's); then every rank with weights, and every rank with None,
          combine to the reference bit for bit
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

scenario, seed = sys.argv[1], int(sys.argv[-1])
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


def ll_config(kind) -> EpDispatchCombineConfig:
    """A low-latency op's config (4-byte token rows: every dtype fits)."""
    return EpDispatchCombineConfig(
        torch.bfloat16, rank, world, 128, 0, 4, 4, M, EPR, K, kernel_type=kind
    )


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
        op = EpDispatchCombineOp(ll_config(kind))
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


def run_expert() -> None:
    other = 1 - rank
    names = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
             torch.float8_e4m3fn: "float8_e4m3fn"}  # fmt: skip
    for kind in (EpDispatchCombineKernelType.IntraNodeLL, EpDispatchCombineKernelType.AsyncLL):
        op = EpDispatchCombineOp(ll_config(kind))
        dispatch, combine = ll_calls(op, kind)
        n = 3
        idx = to_all(n)
        w = torch.rand(n, K, generator=gen)
        x = torch.full((n, 128), 1.5)
        for theirs_t in (torch.float16, torch.float32, torch.float8_e4m3fn):
            mine_t = theirs_t if rank == 1 else torch.bfloat16
            peer_t = torch.bfloat16 if rank == 1 else theirs_t
            msg = (
                f"dispatch: rank {other} sends expert-major {names[peer_t]} tokens, this rank "
                f"expert-major {names[mine_t]} "
            )
            expect(mc.InvalidArgumentError, msg, op.dispatch_standard_moe, x.to(mine_t), w,
                   None, idx)  # fmt: skip
            ll_round_trip(dispatch, combine)
        # The same dtype on both ranks still works, and combines.
        for dt in (torch.float16, torch.bfloat16):
            px, count, _, _ = op.dispatch_standard_moe(x.to(dt), w, None, idx)
            assert px.dtype == dt
            assert bool((px[0, : int(count[0])].float() == 1.5).all()), "rows read as sent"
        out, _ = op.combine_standard_moe(px.to(torch.bfloat16), None, idx)
        assert out.shape == (n, 128)
        # DeepEP's fp8 cast with power-of-two scales (round_scale) on rank 1 only.
        xb = torch.randn(n, 128, generator=gen).to(torch.bfloat16)
        cast = "expert-major bfloat16 cast to float8_e4m3fn"
        rounded = cast + " with power-of-two scales (round_scale)"
        mine, theirs = (rounded, cast) if rank == 1 else (cast, rounded)
        msg = f"dispatch: rank {other} sends {theirs} tokens, this rank {mine} "
        expect(mc.InvalidArgumentError, msg, op.low_latency_dispatch, xb, idx, M, EPR * world,
               use_fp8=True, round_scale=rank == 1)  # fmt: skip
        ll_round_trip(dispatch, combine)
        op.close()


def run_stale_kind(kind) -> None:
    E = EPR * world
    cfg = ll_config(kind)
    op = EpDispatchCombineOp(cfg)
    n = 4
    idx = to_all(n)
    ones = torch.ones(n, K)

    def fresh(hook=False):
        x = torch.randint(-8, 8, (n, 128), generator=gen).to(torch.bfloat16)
        recv, _, handle, _, recv_hook = op.low_latency_dispatch(
            x, idx, M, E, use_fp8=False, return_recv_hook=hook
        )
        if hook:
            recv_hook()
        return x, recv, handle

    def check(x, recv, handle, hook=False, zero_copy=False):
        if zero_copy:
            op.get_next_low_latency_combine_buffer(handle).copy_(recv)
        y, _, combine_hook = op.low_latency_combine(
            recv, idx, ones, handle, zero_copy=zero_copy, return_recv_hook=hook
        )
        if hook:
            combine_hook()
        assert torch.equal(y, (x.float() * K).to(torch.bfloat16)), "combine of the handle"

    check(*fresh())
    _, _, first = fresh()  # dispatch 2
    x, recv, latest = fresh()  # dispatch 3: the latest
    stale = "stale handle: it is of this op's dispatch 2, the latest dispatch is 3"
    # Rank 0 alone passes the earlier handle: every rank fails the call.
    if rank == 0:
        expect(mc.InvalidArgumentError, stale, op.low_latency_combine, recv, idx, ones, first)
    else:
        expect(mc.InvalidArgumentError, "combine rejected by rank 0", op.low_latency_combine,
               recv, idx, ones, latest)  # fmt: skip
    # Both ranks pass it, after a fresh dispatch (the failed combine consumed 3).
    x, recv, latest = fresh()
    expect(mc.InvalidArgumentError, "stale handle", op.low_latency_combine, recv, idx, ones,
           first)  # fmt: skip
    # The latest handle combines, with the receive hooks and zero-copy too.
    for hook, zero_copy in ((False, False), (True, False), (False, True), (True, True)):
        x, recv, latest = fresh(hook)
        check(x, recv, latest, hook, zero_copy)
    # A handle of another op.
    other = EpDispatchCombineOp(cfg)
    theirs = other.low_latency_dispatch(torch.zeros(n, 128).to(torch.bfloat16), idx, M, E,
                                        use_fp8=False)[2]  # fmt: skip
    x, recv, latest = fresh()
    expect(mc.InvalidArgumentError, "another EpDispatchCombineOp's", op.low_latency_combine,
           recv, idx, ones, theirs)  # fmt: skip
    other.close()
    x, recv, latest = fresh()
    check(x, recv, latest)
    op.close()


def run_stale() -> None:
    for kind in (EpDispatchCombineKernelType.IntraNodeLL, EpDispatchCombineKernelType.AsyncLL):
        run_stale_kind(kind)


def run_weights(kind_name: str) -> None:
    kind = EpDispatchCombineKernelType[kind_name]
    split = kind == EpDispatchCombineKernelType.AsyncLL
    op = EpDispatchCombineOp(
        EpDispatchCombineConfig(torch.bfloat16, rank, world, 128, 0, 4, 2, M, EPR, K,
                                kernel_type=kind)
    )  # fmt: skip
    n = int(torch.randint(1, M + 1, (1,), generator=gen))
    x = torch.randn(n, 128, generator=gen).to(torch.bfloat16)
    w = torch.rand(n, K, generator=gen)
    idx = torch.stack([torch.randperm(EPR * world, generator=gen)[:K] for _ in range(n)])
    idx = idx.to(torch.int32)
    # Each rank a token went to returns its row and its weights unchanged: with K = 2,
    # one or two parts, whose fp32 sums (from -0.0) are exact.
    parts = torch.tensor([len(set((r // EPR).tolist())) for r in idx]).view(n, 1)
    want = (x.float() * parts).to(torch.bfloat16)
    want_w = w * parts

    def dispatched(with_w: bool):
        out, out_w, _, _, total = op.dispatch(x, w, None, idx)
        if split:
            op.dispatch_recv()
        total = int(total.item())
        return out[:total].clone(), (out_w[:total].clone() if with_w else None), idx

    def combine(y, y_w, indices):
        out, out_w = op.combine(y, y_w, indices)
        if split:
            op.combine_recv()
        return out.clone(), (out_w.clone() if out_w is not None else None)

    def check(with_w: bool) -> None:
        got, got_w = combine(*dispatched(with_w))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{kind_name} rows"
        if with_w:
            assert torch.equal(got_w, want_w), f"{kind_name} combined weights"
        else:
            assert got_w is None

    check(True)
    check(False)
    bad = world - 1
    said = {True: "weights", False: "None"}
    for bad_has_weights in (False, True):
        mine = bad_has_weights if rank == bad else not bad_has_weights
        other = 0 if rank == bad else bad
        msg = (f"combine weights differ between ranks: rank {other} passes {said[not mine]}, "
               f"this rank passes {said[mine]}")  # fmt: skip
        expect(mc.InvalidArgumentError, msg, combine, *dispatched(mine))
        check(True)
        check(False)
    print(f"rank {rank}: {kind_name} combines with and without weights failed every rank")
    op.close()


{"config": run_config, "dtype": run_dtype, "combine": run_combine, "ll": run_ll,
 "expert": run_expert, "stale": run_stale,
 "weights": lambda: run_weights(sys.argv[2])}[scenario]()  # fmt: skip
dist.barrier()
print(f"rank {rank} ok", flush=True)
dist.destroy_process_group()
