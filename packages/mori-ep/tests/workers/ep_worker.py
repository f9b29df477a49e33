# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the CPU dispatch/combine tests. argv: mode seed [iters]

Creates a host heap over gloo, runs the scenario and prints "rank N ok" last.
  random   bf16 and fp8 ops, every routing kind in turn, fresh inputs per call;
           dispatch compared bit for bit with a reference built from an
           all-gather of every rank's inputs, combine compared exactly (the
           reduction order is defined) and against an fp64 sum within bf16 rounding.
  errors   each validation error raised by one rank, its message checked there
           and the rejection seen by the others; the op still works afterwards.
  timeout  rank 1 never dispatches: rank 0 times out naming rank 1 and the stage, then
           the op refuses calls; on a second op rank 1 dispatches and leaves: rank 0's
           combine times out naming rank 1 and the combine stage.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from ep_reference import FP8, ROUTINGS, Routing, expert, factor, op_config, sum_start

import mori.core as mc
from mori.core import shmem
from mori.core.dist_compat import all_gather_single
from mori.core.launch import expect_raises as expect
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp

mode, seed = sys.argv[1], int(sys.argv[2])
iters = int(sys.argv[3]) if len(sys.argv) > 3 else 12
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
shmem.init(device="cpu", heap_size="64M", timeout_s=60)

HIDDEN, M, EPR, K = 256, 48, 4, 4
E = EPR * world
REF = Routing(world, rank, M, EPR, K)
routing, gather, padded = REF.routing, REF.gather, REF.padded


def make_op(fp8: bool) -> EpDispatchCombineOp:
    cfg = op_config(rank, world, HIDDEN, M, EPR, K, FP8 if fp8 else torch.bfloat16)
    return EpDispatchCombineOp(cfg, timeout_s=30)


def run_random(fp8: bool, base_seed: int) -> float:
    op = make_op(fp8)
    spent = 0.0
    for it in range(iters):
        kind = ROUTINGS[it % len(ROUTINGS)]
        gen = torch.Generator().manual_seed(base_seed * 1009 + it * 31 + rank)
        n = REF.num_tokens(kind, gen, it)
        x = torch.randn(n, HIDDEN, generator=gen)
        x = x.to(FP8) if fp8 else x.to(torch.bfloat16)
        w = torch.rand(n, K, generator=gen)
        sc = torch.rand(n, HIDDEN // 128, generator=gen) + 0.5 if fp8 else None
        idx = routing(kind, n, gen, it)

        t0 = time.perf_counter()
        out, out_w, out_s, out_idx, total = op.dispatch(x, w, sc, idx)
        spent += time.perf_counter() - t0
        total = int(total.item())

        # Reference from every rank's inputs (padded to M rows, then the counts).
        counts = torch.zeros(world, dtype=torch.int64)
        all_gather_single(counts, torch.tensor([n], dtype=torch.int64))
        ax, aw, ai = gather(padded(x, n)), gather(padded(w, n)), gather(padded(idx, n, -1))
        asc = gather(padded(sc, n)) if fp8 else None
        rows = []
        for s in range(world):
            for t in range(int(counts[s])):
                dests = {int(e) // EPR for e in ai[s][t] if e >= 0}
                if rank in dests:
                    rows.append((s, t))
        assert total == len(rows), f"it {it} ({kind}): total_recv {total}, expected {len(rows)}"
        want_pos = torch.tensor([s * world * M + t for s, t in rows], dtype=torch.int32)
        assert torch.equal(op.get_dispatch_src_token_pos(), want_pos), f"it {it}: src pos"
        if rows:

            def sel(a, rows=rows):
                return torch.stack([a[s][t] for s, t in rows])

            assert torch.equal(out[:total].view(torch.uint8), sel(ax).view(torch.uint8)), (
                f"it {it} ({kind}): tokens differ"
            )
            assert torch.equal(out_w[:total].view(torch.int32), sel(aw).view(torch.int32))
            assert torch.equal(out_idx[:total], sel(ai))
            if fp8:
                assert torch.equal(out_s[:total].view(torch.int32), sel(asc).view(torch.int32))

        # Combine: rank d's "experts" scale the rows; weights go back times factor(d).
        y = expert(out[:total], out_s[:total] if fp8 else None, rank)
        yw = out_w[:total] * factor(rank)
        if it % 2:  # MORI style: buffers of capacity rows, rows past total_recv are junk
            cap = world * M
            yy = torch.randn(cap, HIDDEN).to(torch.bfloat16)
            yy[:total] = y
            yyw = torch.rand(cap, K)
            yyw[:total] = yw
            y, yw = yy, yyw
        t0 = time.perf_counter()
        cout, cw = op.combine(y, yw, None)
        spent += time.perf_counter() - t0
        assert cout.shape == (n, HIDDEN) and cw.shape == (n, K)
        has = (idx >= 0).any(1) if n else torch.zeros(0, dtype=torch.bool)
        want, want_w = sum_start(has, HIDDEN), sum_start(has, K)
        want64 = torch.zeros(n, HIDDEN, dtype=torch.float64)
        for t in range(n):
            for d in sorted({int(e) // EPR for e in idx[t] if e >= 0}):
                part = expert(x[t : t + 1], sc[t : t + 1] if fp8 else None, d)[0]
                want[t] += part.float()
                want64[t] += part.double()
                want_w[t] += w[t] * factor(d)
        assert torch.equal(cout.view(torch.int16), want.to(torch.bfloat16).view(torch.int16)), (
            f"it {it} ({kind}): combine differs from the ordered fp32 sum"
        )
        assert torch.equal(cw.view(torch.int32), want_w.view(torch.int32)), f"it {it}: weights"
        # Independently of the order: fp32 accumulation of <= world terms plus one
        # bf16 rounding stays within 2^-8 relative (half an ulp is 2^-9).
        err = (cout.double() - want64).abs()
        assert bool((err <= want64.abs() * 2.0**-8 + 1e-30).all()), f"it {it}: tolerance"
    op.close()
    return spent


def run_errors() -> None:
    op = make_op(fp8=False)
    bad = world - 1
    n = 4
    x = torch.randn(n, HIDDEN).to(torch.bfloat16)
    w = torch.rand(n, K)
    idx = torch.tensor([[0, 1, -1, E - 1]] * n, dtype=torch.int32)
    over = idx.clone()
    over[2, 1] = 300
    neg = idx.clone()
    neg[1, 3] = -2
    cases = [
        ("input dtype torch.int64 is not one of", (x.long(), w, None, idx)),
        (f"input must be [num_tokens, {HIDDEN}], got shape (4, 128)", (x[:, :128], w, None, idx)),
        ("input is on meta, the op runs on cpu", (x.to("meta"), w, None, idx)),
        (
            "input dtype torch.float32 has 4-byte elements, more than max_token_type_size 2",
            (x.float(), w, None, idx),
        ),
        (f"expert id 300 out of range [-1, {E}) at token 2 slot 1", (x, w, None, over)),
        (f"expert id -2 out of range [-1, {E}) at token 1 slot 3", (x, w, None, neg)),
        (
            f"num_tokens {M + 1} exceeds max_num_inp_token_per_rank {M}",
            (
                torch.zeros(M + 1, HIDDEN, dtype=torch.bfloat16),
                torch.zeros(M + 1, K),
                None,
                torch.zeros(M + 1, K, dtype=torch.int32),
            ),
        ),
        (
            f"indices has {K + 1} experts per token, more than num_experts_per_token {K}",
            (x, w, None, torch.zeros(n, K + 1, dtype=torch.int32)),
        ),
        ("indices must be an int32 or int64 tensor, got torch.int16", (x, w, None, idx.short())),
        # int64 ids are checked before they are narrowed to int32 (2**32 + 1 would wrap to 1).
        (
            f"expert id {2**32 + 1} out of range [-1, {E}) at token 3 slot 0",
            (x, w, None, torch.cat([idx[:3], torch.tensor([[2**32 + 1, 0, -1, 1]])]).long()),
        ),
        ("weights must be a float32 tensor or None, got torch.float16", (x, w.half(), None, idx)),
        (f"weights must be [4, {K}], got shape (4, 2)", (x, w[:, :2], None, idx)),
        ("scales given", (x, w, torch.ones(n, 2), idx)),
        # Passes the checks, then torch refuses it locally: the call still fails on
        # every rank (a peer left waiting for this rank's counts would time out).
        ("dispatch inputs could not be prepared", (x.to_sparse(), w, None, idx)),
    ]
    for pattern, args in cases:
        if rank == bad:
            expect(mc.InvalidArgumentError, pattern, op.dispatch, *args)
        else:
            expect(
                mc.InvalidArgumentError,
                f"dispatch rejected by rank {bad}",
                op.dispatch,
                x,
                w,
                None,
                idx,
            )
        # Every rank failed the same call: nothing to combine anywhere.
        expect(
            mc.InvalidStateError, "combine needs a successful dispatch", op.combine, x, None, None
        )
    if rank == bad:
        expect(
            mc.InvalidArgumentError,
            "block_num 1.5 must be an int",
            op.dispatch,
            x,
            w,
            None,
            idx,
            block_num=1.5,
        )
    else:
        expect(
            mc.InvalidArgumentError,
            f"dispatch rejected by rank {bad}",
            op.dispatch,
            x,
            w,
            None,
            idx,
        )

    # The op still works, and a bad combine input is rejected on every rank.
    def combine_rejected(pattern: str, bad_args) -> None:
        """Rank `bad` combines `bad_args` and gets `pattern`; the others combine good
        inputs and see its rejection."""
        if rank == bad:
            expect(mc.InvalidArgumentError, pattern, op.combine, *bad_args)
        else:
            expect(
                mc.InvalidArgumentError, f"combine rejected by rank {bad}", op.combine,
                out[:total], None, idx,
            )  # fmt: skip

    out, out_w, _, _, total = op.dispatch(x, w, None, idx)
    total = int(total.item())
    combine_rejected(
        "combine input dtype torch.float16 must be bf16, fp32, fp8 e4m3 or float4_e2m1fn_x2",
        (out[:total].half(), None, None),
    )
    # Passes the type checks, then torch cannot inspect it (a CSR tensor has no
    # strides): still a rejection on every rank, not an error on one rank alone.
    out, out_w, _, _, total = op.dispatch(x, w, None, idx)
    total = int(total.item())
    combine_rejected(
        "combine inputs could not be checked", (out[:total].to_sparse_csr(), None, None)
    )
    out, out_w, _, _, total = op.dispatch(x, w, None, idx)
    total = int(total.item())
    if rank == bad:
        assert total > 0  # every rank routes to expert E-1, which lives on rank `bad`
    combine_rejected(
        f"combine input has {total - 1} rows; it needs total_recv {total}",
        (out[: total - 1], None, None),
    )
    # combine's indices are this rank's own [num_tokens, k] routing (MORI's meaning);
    # the received rows' indices are refused on the rank that passes them.
    out, out_w, _, out_idx, total = op.dispatch(x, w, None, idx)
    total = int(total.item())
    if rank == bad:
        assert total != n
    combine_rejected(
        f"combine indices has {total} rows but this rank dispatched {n} tokens",
        (out[:total], None, out_idx[:total]),
    )
    dests = [len({int(e) // EPR for e in row if e >= 0}) for row in idx]
    # MORI's calls: combine(out, None, topk_ids) with int32 and with int64 routing.
    for routing in (idx, idx.long()):
        out, out_w, _, _, total = op.dispatch(x, None, None, routing)
        cout, cw = op.combine(out, None, routing)
        assert cw is None
        for t in range(n):
            want = x[t].float() * dests[t]  # exact: small integer multiples of bf16 values
            assert torch.equal(cout[t], want.to(torch.bfloat16)), f"after errors: token {t}"
    op.close()


def run_readme_example() -> None:
    """The README's worked example (world 2, M 3, 4 experts, top-2), value for value."""
    cfg = EpDispatchCombineConfig(
        torch.bfloat16,
        rank=rank,
        world_size=2,
        hidden_dim=128,
        scale_dim=0,
        scale_type_size=4,
        max_token_type_size=2,
        max_num_inp_token_per_rank=3,
        num_experts_per_rank=2,
        num_experts_per_token=2,
    )
    op = EpDispatchCombineOp(cfg, timeout_s=30)
    idx = [[[0, 1], [1, 3], [-1, -1]], [[2, 0], [3, -1]]][rank]
    x = (torch.arange(len(idx), dtype=torch.float32)[:, None] + 10 * rank + 1).expand(-1, 128)
    x = x.to(torch.bfloat16)
    idx = torch.tensor(idx, dtype=torch.int32)
    out, out_w, _, _, total = op.dispatch(x, torch.ones(len(idx), 2), None, idx)
    assert int(total.item()) == 3
    assert op.get_dispatch_src_token_pos().tolist() == [[0, 1, 6], [1, 6, 7]][rank]
    assert out[:3, 0].tolist() == [[1, 2, 11], [2, 11, 12]][rank]  # a, b, d / b, d, e
    cout, cw = op.combine(out * (rank + 1), out_w, None)  # y_r = (r + 1) * token
    # rank 0: a = 1, b = 2 + 2*2, c = 0; rank 1: d = 11 + 2*11, e = 2*12
    assert cout[:, 0].tolist() == [[1, 6, 0], [33, 24]][rank], cout[:, 0]
    assert cw.tolist() == [[[1, 1], [2, 2], [0, 0]], [[2, 2], [1, 1]]][rank]
    op.close()


def run_timeout() -> None:
    """Rank 1 never dispatches: rank 0 times out naming rank 1 and the stage, and the
    op then refuses calls (they would pair with stale epochs) instead of hanging or
    mismatching. Then rank 1 dispatches on a second op and leaves before combining:
    rank 0's combine names it."""
    cfg = EpDispatchCombineConfig(
        torch.bfloat16, rank, world, HIDDEN, 0, 4, 2, M, EPR, K
    )  # fmt: skip
    op = EpDispatchCombineOp(cfg, timeout_s=1.5)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    idx = torch.zeros(2, K, dtype=torch.int32)
    idx[:, 0] = EPR  # to rank 1's first expert: rank 0's rows cross
    if rank == 0:
        lost = "dispatch (call 1) on rank 0: rank 1 did not arrive (count words) within 1500 ms"
        expect(mc.MoriTimeoutError, lost, op.dispatch, x, None, None, idx)
        expect(mc.InvalidStateError, "timed out earlier", op.dispatch, x, None, None, idx)
        expect(mc.InvalidStateError, "timed out earlier", op.combine, x, None, None)
    op2 = EpDispatchCombineOp(cfg, timeout_s=1.5)  # collective: rank 1 waits for rank 0 here
    out, _, _, _, total = op2.dispatch(x, None, None, idx)
    if rank == 0:
        lost = "combine (call 1) on rank 0: rank 1 did not arrive (combine rows) within 1500 ms"
        expect(mc.MoriTimeoutError, lost, op2.combine, out[: int(total.item())], None, None)
    print(f"rank {rank} ok", flush=True)
    os._exit(0)  # the heap's pes no longer agree either: no collective teardown


if mode == "random":
    if world == 2:
        run_readme_example()
    spent = run_random(False, seed) + run_random(True, seed + 1)
    print(f"rank {rank}: {2 * iters} dispatch+combine in {spent * 1e3:.0f} ms")
elif mode == "errors":
    run_errors()
elif mode == "timeout":
    run_timeout()
else:
    raise SystemExit(f"unknown mode {mode}")
shmem.barrier_all()
import gc  # noqa: E402

gc.collect()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
