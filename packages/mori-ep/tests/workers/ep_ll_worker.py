# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the low-latency tests (IntraNodeLL / AsyncLL, the expert-major layout,
DeepEP's entry points). argv: mode seed iters [device]

  token    MORI's token-major calls on IntraNodeLL and AsyncLL ops (bf16 and fp8 with
           scales), every routing kind, fresh inputs per call: dispatch compared bit
           for bit with a reference built from every rank's inputs, combine with the
           ordered fp32 sum (the intra-node kernels' numbers).
  expert   low_latency_dispatch/combine (bf16; fp8; fp8 with round_scale; ue8m0) with
           and without receive hooks, dispatch_standard_moe/combine_standard_moe,
           convert_dispatch_output/convert_combine_input: DeepEP's oracle (counts per
           expert equal the global counts, rows bit for bit or their exact fp8 cast and
           scales, src_info and layout ranges consistent, combine exactly the fp32 sum
           over k in order).
  errors   bad inputs on one rank fail the call on every rank; the op works after.
  cap      max_total_recv_tokens (MORI's receive cap; run_cap): at and under capacity,
           token- and expert-major, and (CPU) a rank past its slots failing every rank.
  timeout  rank 1 never dispatches: rank 0's receive times out naming rank 1 and the
           stage, then the op refuses calls; on an IntraNodeLL op rank 1 dispatches and
           leaves: rank 0's combine times out naming rank 1 and the combine stage.
  graph    (CUDA) an IntraNodeLL dispatch + combine, token-major and expert-major, each
           captured in a CUDA graph and replayed with fresh inputs, checked per replay.
Prints "rank N ok" last. placement: "cpu" (default, a host heap), "shared" (every rank
on GPU 0) or "per_gpu".
"""

import os
import sys

import torch
import torch.distributed as dist
from ep_reference import FP8, ROUTINGS, Routing, expert, factor, sum_start

import mori.core as mc
from mori.core import shmem
from mori.core.launch import expect_raises as expect
from mori.core.testing import start_rank
from mori.ep import (
    _C,
    EpDispatchCombineConfig,
    EpDispatchCombineKernelType,
    EpDispatchCombineOp,
)

mode, seed, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
placement = sys.argv[4] if len(sys.argv) > 4 else "cpu"
rank, world, DEV = start_rank(placement, "64M" if placement == "cpu" else "512M", 60)

HIDDEN, M, EPR, K = 512, 16, 4, 4
E = EPR * world
REF = Routing(world, rank, M, EPR, K)
LL = (EpDispatchCombineKernelType.IntraNodeLL, EpDispatchCombineKernelType.AsyncLL)


def make_op(kind, fp8=False, cap=0) -> EpDispatchCombineOp:
    cfg = EpDispatchCombineConfig(
        FP8 if fp8 else torch.bfloat16, rank=rank, world_size=world, hidden_dim=HIDDEN,
        scale_dim=HIDDEN // 128 if fp8 else 0, scale_type_size=4, max_token_type_size=2,
        max_num_inp_token_per_rank=M, num_experts_per_rank=EPR, num_experts_per_token=K,
        kernel_type=kind, max_total_recv_tokens=cap,
    )  # fmt: skip
    return EpDispatchCombineOp(cfg, timeout_s=30)


def cpu(t):
    return t.cpu() if t is not None else None


def gathered(x, n, fill=0):
    return REF.gather(REF.padded(x, n, fill))


def all_counts(n):
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(out, torch.tensor([n], dtype=torch.int64))
    return [int(c) for c in out]


# ---------------------------------------------------------------- token-major
def run_token(kind, fp8, base_seed, cap=0):
    """With a receive cap every rank passes at most P (the receive slots per source
    rank) tokens, so every routing is within it."""
    op = make_op(kind, fp8, cap)
    slots = op.max_num_tokens_to_recv_per_rank()
    for it in range(iters):
        rk = ROUTINGS[it % len(ROUTINGS)]
        gen = torch.Generator().manual_seed(base_seed * 1009 + it * 31 + rank)
        n = min(REF.num_tokens(rk, gen, it), slots)
        x = torch.randn(n, HIDDEN, generator=gen)
        x = x.to(FP8) if fp8 else x.to(torch.bfloat16)
        w = torch.rand(n, K, generator=gen)
        sc = torch.rand(n, HIDDEN // 128, generator=gen) + 0.5 if fp8 else None
        idx = REF.routing(rk, n, gen, it)
        token_round(op, kind, fp8, x, w, sc, idx, f"{kind} it {it} ({rk})")
    op.close()


def token_round(op, kind, fp8, x, w, sc, idx, what):
    """One token-major dispatch + combine of this rank's inputs, checked bit for bit
    against a reference built from every rank's; returns total_recv."""
    async_ll = kind == EpDispatchCombineKernelType.AsyncLL
    n = x.size(0)
    args = (x.to(DEV), w.to(DEV), sc.to(DEV) if fp8 else None, idx.to(DEV))
    if async_ll:
        out, out_w, out_s, out_idx, total = op.dispatch_send(*args)
        op.dispatch_recv(call_local_expert_count=True)
    else:
        out, out_w, out_s, out_idx, total = op.dispatch(*args, call_local_expert_count=True)
    assert out.size(0) == out_w.size(0) == out_idx.size(0) == op.max_num_tokens_to_recv(), what
    total = int(total.item())
    counts = all_counts(n)
    ax, aw, ai = gathered(x, n), gathered(w, n), gathered(idx, n, -1)
    asc = gathered(sc, n) if fp8 else None
    rows = [(s, t) for s in range(world) for t in range(counts[s])
            if rank in {int(e) // EPR for e in ai[s][t] if e >= 0}]  # fmt: skip
    assert total == len(rows), f"{what}: total_recv {total} != {len(rows)}"
    # MORI's local_expert_count: (received token, slot) pairs per local expert.
    want_cnt = [sum(int((ai[s][: counts[s]] == rank * EPR + e).sum()) for s in range(world))
                for e in range(EPR)]  # fmt: skip
    assert cpu(op.local_expert_count).tolist() == want_cnt, f"{what}: local_expert_count"
    want_pos = torch.tensor([s * world * M + t for s, t in rows], dtype=torch.int32)
    assert torch.equal(cpu(op.get_dispatch_src_token_pos()), want_pos), f"{what}: src pos"
    if rows:

        def sel(a, rows=rows):
            return torch.stack([a[s][t] for s, t in rows])

        assert torch.equal(cpu(out[:total]).view(torch.uint8), sel(ax).view(torch.uint8)), (
            f"{what}: tokens differ"
        )
        assert torch.equal(cpu(out_w[:total]).view(torch.int32), sel(aw).view(torch.int32))
        assert torch.equal(cpu(out_idx[:total]), sel(ai))
        if fp8:
            assert torch.equal(cpu(out_s[:total]).view(torch.int32), sel(asc).view(torch.int32))
    y = expert(cpu(out[:total]), cpu(out_s[:total]) if fp8 else None, rank).to(DEV)
    yw = out_w[:total] * factor(rank)
    if async_ll:
        cout, cw = op.combine_send(y, yw, idx.to(DEV))
        op.combine_recv()
    else:
        cout, cw = op.combine(y, yw, idx.to(DEV))
    has = (idx >= 0).any(1) if n else torch.zeros(0, dtype=torch.bool)
    want, want_w = sum_start(has, HIDDEN), sum_start(has, K)
    for t in range(n):
        for d in sorted({int(e) // EPR for e in idx[t] if e >= 0}):
            want[t] += expert(x[t : t + 1], sc[t : t + 1] if fp8 else None, d)[0].float()
            want_w[t] += w[t] * factor(d)
    assert torch.equal(cpu(cout).view(torch.int16), want.to(torch.bfloat16).view(torch.int16)), (
        f"{what}: combine differs from the ordered fp32 sum"
    )
    assert torch.equal(cpu(cw).view(torch.int32), want_w.view(torch.int32)), f"{what}: weights"
    return total


# --------------------------------------------------------------- expert-major
INV448 = torch.tensor(1.0 / 448.0, dtype=torch.float32)


def cast_ref(x, round_scale):
    """DeepEP's per-128-column e4m3 cast of bf16 rows: (e4m3 [n, H], scale_inv [n, H/128])."""
    n = x.size(0)
    xf = x.float().view(n, HIDDEN // 128, 128)
    amax = xf.abs().amax(-1).clamp(min=1e-4)
    if round_scale:
        mant, ex = torch.frexp(amax * INV448)
        e = torch.where(mant == 0.5, ex - 1, ex)
        scale_inv = torch.ldexp(torch.ones_like(amax), e)
        scale = torch.ldexp(torch.ones_like(amax), -e)
    else:
        scale_inv = amax * INV448
        scale = torch.tensor(448.0, dtype=torch.float32) / amax
    q = (xf * scale[..., None]).to(FP8).view(n, HIDDEN)
    return q, scale_inv


def expert_out(rows, g):
    """Expert g's output for received rows (bf16 values, or e4m3 dequantised)."""
    return (rows.float() * (1.0 + 0.125 * (g % 16))).to(torch.bfloat16)


def dequant(q, scale_inv):
    return (q.float().view(q.size(0), -1, 128) * scale_inv[..., None]).view(q.size(0), -1)


def check_expert_layout(what, counts, ai, recv_count, src_info, layout_range, src_stride):
    """The per-expert rows this rank must hold: [(s, t, k)] per local expert."""
    want_rows = []
    for e in range(EPR):
        g = rank * EPR + e
        rows = [(s, t, k) for s in range(world) for t in range(counts[s]) for k in range(K)
                if int(ai[s][t][k]) == g]  # fmt: skip
        glob = sum(int((ai[s][: counts[s]] == g).sum()) for s in range(world))
        assert int(recv_count[e]) == len(rows) == glob, f"{what}: expert {g} count"
        begin = 0
        for s in range(world):
            cnt = sum(1 for r in rows if r[0] == s)
            assert int(layout_range[e][s]) == (begin << 32) | cnt, f"{what}: expert {g} range {s}"
            begin += cnt
        got_src = src_info[e][: len(rows)].tolist()
        assert got_src == [s * src_stride + t for s, t, _ in rows], f"{what}: src_info of {g}"
        want_rows.append(rows)
    return want_rows


def run_expert(kind, base_seed, cap=0):
    """With a receive cap every rank passes at most P tokens (as run_token); the
    outputs keep DeepEP's [E, W*M, hidden] shape."""
    op = make_op(kind, cap=cap)
    slots = op.max_num_tokens_to_recv_per_rank()
    variants = [  # (use_fp8, round_scale, use_ue8m0, hook)
        (False, False, False, False), (True, False, False, False),
        (True, True, False, True), (True, True, True, False), (False, False, False, True),
    ]  # fmt: skip
    # The expert-major layout refuses duplicate experts in a token ("dup", and
    # "round_robin" at world 2 repeat one).
    kinds = ["random", "zero", "one_expert", "one_rank", "one_token", "max"]
    for it in range(iters):
        rk = kinds[it % len(kinds)]
        use_fp8, round_scale, ue8m0, hook = variants[it % len(variants)]
        gen = torch.Generator().manual_seed(base_seed * 7919 + it * 17 + rank)
        n = min(REF.num_tokens(rk, gen, it), slots)
        x = torch.randn(n, HIDDEN, generator=gen) * (1 + 3 * torch.rand(n, 1, generator=gen))
        x = x.to(torch.bfloat16)
        if n and it % 3 == 0:
            x[0, :128] = 0  # an all-zero group: the amax floor decides its scale
        w = torch.rand(n, K, generator=gen)
        idx = REF.routing(rk, n, gen, it).long()
        stats = torch.zeros(EPR, dtype=torch.int32, device=DEV)
        recv_x, recv_count, handle, event, recv_hook = op.low_latency_dispatch(
            x.to(DEV), idx.to(DEV), M, E, cumulative_local_expert_recv_stats=stats,
            use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=ue8m0,
            async_finish=not hook, return_recv_hook=hook,
        )  # fmt: skip
        if hook:
            recv_hook()
        else:
            event.current_stream_wait()
        what = f"{kind} it {it} ({rk}, fp8={use_fp8} round={round_scale} ue8m0={ue8m0})"
        counts = all_counts(n)
        ax, ai = gathered(x, n), gathered(idx, n, -1)
        src_info, layout_range = cpu(handle[0]), cpu(handle[1])
        assert handle[2:] == (M, HIDDEN, E)
        assert tuple((recv_x[0] if use_fp8 else recv_x).shape) == (EPR, world * M, HIDDEN)
        rows = check_expert_layout(what, counts, ai, cpu(recv_count), src_info, layout_range, 0)
        assert torch.equal(cpu(stats), cpu(recv_count)), f"{what}: stats"
        ys = torch.zeros(EPR, world * M, HIDDEN, dtype=torch.bfloat16)
        for e in range(EPR):
            if not rows[e]:
                continue
            src = torch.stack([ax[s][t] for s, t, _ in rows[e]])
            cnt = len(rows[e])
            if use_fp8:
                q, sinv = cast_ref(src, round_scale)
                got_q = cpu(recv_x[0][e][:cnt])
                assert torch.equal(got_q.view(torch.uint8), q.view(torch.uint8)), (
                    f"{what}: fp8 rows"
                )
                sc = recv_x[1]
                assert sc.stride(1) == 1 and sc.stride(2) == world * M, "scales not column-major"
                got_s = cpu(sc[e][:cnt])
                if ue8m0:
                    want_s = (sinv.view(torch.int32) >> 23).to(torch.uint8).view(cnt, -1, 4)
                    want_s = want_s.contiguous().view(torch.int32).view(cnt, -1)
                    assert torch.equal(got_s, want_s), f"{what}: ue8m0 scales"
                else:
                    assert torch.equal(got_s.view(torch.int32), sinv.view(torch.int32)), (
                        f"{what}: scales"
                    )
                got = dequant(got_q, sinv)
            else:
                got = cpu(recv_x[e][:cnt])
                assert torch.equal(got.view(torch.int16), src.view(torch.int16)), f"{what}: rows"
            ys[e, :cnt] = expert_out(got, rank * EPR + e)
        # Combine: weighted sum over k in order, fp32, one rounding.
        zero_copy = it % 2 == 1
        xin = ys.to(DEV)
        if zero_copy:
            op.get_next_low_latency_combine_buffer(handle).copy_(xin)
        out = torch.empty(n, HIDDEN, dtype=torch.bfloat16, device=DEV) if it % 4 == 3 else None
        cout, event, chook = op.low_latency_combine(
            xin, idx.to(DEV), w.to(DEV), handle, zero_copy=zero_copy, async_finish=not hook,
            return_recv_hook=hook, out=out,
        )  # fmt: skip
        if hook:
            chook()
        if out is not None:
            assert cout.data_ptr() == out.data_ptr()
        want = sum_start((idx >= 0).any(1), HIDDEN)
        if n:
            if use_fp8:
                q, sinv = cast_ref(x, round_scale)
                seen = dequant(q, sinv)
            else:
                seen = x.float()
            for k in range(K):
                g = idx[:, k]
                part = torch.stack([expert_out(seen[t : t + 1], int(g[t]))[0] for t in range(n)])
                prod = w[:, k : k + 1] * part.float()
                want = torch.where((g >= 0)[:, None], want + prod, want)
        assert torch.equal(
            cpu(cout).view(torch.int16), want.to(torch.bfloat16).view(torch.int16)
        ), f"{what}: combine differs from the ordered fp32 sum"
    run_standard_moe(op, base_seed)
    op.close()
    if cap == 0:
        # The other combine_standard_moe order: one row per (token, expert) where the
        # op pre-reduces by default (top_k >= 2 * world_size), else per-rank partials
        # cannot be forced (they would not fit), so the default path again.
        os.environ["MORI_EP_LL_PRE_REDUCE"] = "0"
        try:
            op = make_op(kind)
        finally:
            del os.environ["MORI_EP_LL_PRE_REDUCE"]
        run_standard_moe(op, base_seed + 1, expect_pre=False)
        op.close()


def standard_moe_want(x, w, idx, pre_reduce, out_fn=None):
    """combine_standard_moe's result: fp32 sums from -0.0 in the op's order (per rank
    ascending, each rank's slots ascending, with pre_reduce; else slots ascending),
    one rounding to bf16."""
    n = x.size(0)
    want = sum_start((idx >= 0).any(1), HIDDEN)
    if not n:
        return want.to(torch.bfloat16)
    out_fn = out_fn or expert_out
    prods = []
    for k in range(K):
        g = idx[:, k]
        part = torch.stack([out_fn(x[t : t + 1], int(g[t]))[0] for t in range(n)])
        prods.append(w[:, k : k + 1] * part.float())
    if not pre_reduce:
        for k in range(K):
            want = torch.where((idx[:, k] >= 0)[:, None], want + prods[k], want)
        return want.to(torch.bfloat16)
    for d in range(world):
        partial = torch.full((n, HIDDEN), -0.0)
        hit = torch.zeros(n, dtype=torch.bool)
        for k in range(K):
            on_d = (idx[:, k] >= 0) & (idx[:, k] // EPR == d)
            partial = torch.where(on_d[:, None], partial + prods[k], partial)
            hit |= on_d
        want = torch.where(hit[:, None], want + partial, want)
    return want.to(torch.bfloat16)


def run_standard_moe(op, base_seed, expect_pre=None):
    slots = op.max_num_tokens_to_recv_per_rank()
    pre = op.standard_moe_pre_reduce
    if expect_pre is None:
        expect_pre = K >= 2 * world  # the default rule
    assert pre == expect_pre, f"standard_moe_pre_reduce {pre} at top-{K}, world {world}"
    for it in range(max(3, iters // 4)):
        rk = ["random", "one_expert", "zero", "max"][it % 4]
        gen = torch.Generator().manual_seed(base_seed * 31 + it + 100 * rank)
        n = min(REF.num_tokens(rk, gen, it), slots)
        x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16)
        w = torch.rand(n, K, generator=gen)
        idx = REF.routing(rk, n, gen, it)
        # Every third call without weights (1 each); ranks differ, so a rank that
        # weights another's tokens by its own choice fails.
        unweighted = (it + rank) % 3 == 2
        if unweighted:
            w = torch.ones(n, K)
        elif it == 0 and n:
            # A token whose sum tells the orders apart: products 1.25 * 2^30, 1.5,
            # -1.25 * 2^30, 1.625 (experts 0 and 2 on rank 0, 4 and 5 on rank 1): over k
            # ascending 1.625 (1.5 is lost beside 2^30), per rank 0 + 3.125.
            idx[0] = torch.tensor([0, 4, 2, 5] + [-1] * (K - 4), dtype=idx.dtype)
            w[0] = torch.tensor([1.25 * 2**30, 1.0, -(2.0**30), 1.0] + [0.0] * (K - 4))
            x[0] = 1.0
        px, pc, psrc, prange = op.dispatch_standard_moe(
            x.to(DEV), None if unweighted else w.to(DEV), None, idx.to(DEV)
        )
        counts = all_counts(n)
        ax, ai = gathered(x, n), gathered(idx, n, -1)
        what = f"standard moe it {it} ({rk})"
        rows = check_expert_layout(what, counts, ai, cpu(pc), cpu(psrc), cpu(prange), world * M)
        ys = torch.zeros(EPR, world * M, HIDDEN, dtype=torch.bfloat16)
        for e in range(EPR):
            if rows[e]:
                src = torch.stack([ax[s][t] for s, t, _ in rows[e]])
                assert torch.equal(
                    cpu(px[e][: len(rows[e])]).view(torch.int16), src.view(torch.int16)
                )
                ys[e, : len(rows[e])] = expert_out(src, rank * EPR + e)
        cout, cw = op.combine_standard_moe(ys.to(DEV), None, idx.to(DEV))
        assert cw is None
        want = standard_moe_want(x, w, idx, pre)
        assert torch.equal(cpu(cout).view(torch.int16), want.view(torch.int16)), (
            f"{what}: combine (pre_reduce={pre})"
        )


def run_convert(base_seed):
    """convert_dispatch_output / convert_combine_input after a token-major dispatch."""
    op = make_op(EpDispatchCombineKernelType.IntraNodeLL)
    gen = torch.Generator().manual_seed(base_seed + rank)
    n = M
    x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16)
    w = torch.rand(n, K, generator=gen)
    idx = REF.routing("random", n, gen, 0)
    out, out_w, _, out_idx, total = op.dispatch(x.to(DEV), w.to(DEV), None, idx.to(DEV))
    total = int(total.item())
    px, pc, psrc, prange = op.convert_dispatch_output(out, out_idx)
    flat = cpu(op.get_dispatch_src_token_pos())
    oi = cpu(out_idx[:total])
    for e in range(EPR):
        g = rank * EPR + e
        rows = [i for i in range(total) for k in range(K) if int(oi[i][k]) == g]
        assert int(pc[e]) == len(rows)
        assert cpu(psrc[e][: len(rows)]).tolist() == [int(flat[i]) for i in rows]
        if rows:
            assert torch.equal(cpu(px[e][: len(rows)]), cpu(out[rows]))
    ys = torch.stack([expert_out(cpu(px[e]), rank * EPR + e) for e in range(EPR)]).to(DEV)
    cin = op.convert_combine_input(ys, psrc, prange)
    want = torch.zeros(world * M, HIDDEN, dtype=torch.float32)
    ow = cpu(out_w)
    for i in range(total):
        for k in range(K):
            g = int(oi[i][k])
            if rank * EPR <= g < (rank + 1) * EPR:
                want[i] = want[i] + ow[i][k] * expert_out(cpu(out[i : i + 1]), g)[0].float()
    assert torch.equal(cpu(cin).view(torch.int16), want.to(torch.bfloat16).view(torch.int16))
    op.combine(cin, None, idx.to(DEV))
    op.close()


# ------------------------------------------------------------------ receive cap
SLOTS = 5  # receive slots per source rank of the ops capped below the worst case (< M)


def spread(n):
    """MORI's "spread" routing: each token to one expert on every rank (slots past the
    world -1), so every rank receives every token."""
    assert world <= K
    idx = torch.full((n, K), -1, dtype=torch.int32)
    for t in range(n):
        for d in range(world):
            idx[t, d] = d * EPR + (t + d) % EPR
    return idx


def over_cap(op, kind, slots, gen, what):
    """Rank `bad` routes slots + 1 tokens to rank 0 and the others send none: rank 0
    would receive fewer rows than its capacity W * slots, but the slots are per source
    rank, so every rank fails the call naming `bad`, rank 0 and both counts (token-major
    and expert-major); no received dispatch is left to combine; the op works after."""
    bad = world - 1
    n = slots + 1 if rank == bad else 0
    x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16)
    w = torch.rand(n, K, generator=gen)
    idx = torch.full((n, K), -1, dtype=torch.int32)
    idx[:, 0] = torch.arange(n, dtype=torch.int32) % EPR  # experts of rank 0
    args = (x.to(DEV), w.to(DEV), None, idx.to(DEV))
    msg = (
        f"dispatch rejected by rank {bad}: it routes {slots + 1} tokens to rank 0, more than "
        f"the {slots} receive slots per source rank"
    )

    def token_major():
        if kind == EpDispatchCombineKernelType.AsyncLL:
            op.dispatch_send(*args)
            op.dispatch_recv()
        else:
            op.dispatch(*args)

    expect(mc.InvalidArgumentError, msg, token_major)
    expect(mc.InvalidStateError, "combine needs a received dispatch", op.combine,
           torch.zeros(0, HIDDEN, dtype=torch.bfloat16, device=DEV), None, idx.to(DEV))  # fmt: skip
    expect(mc.InvalidArgumentError, msg, op.low_latency_dispatch, x.to(DEV), idx.to(DEV), M, E,
           use_fp8=False)  # fmt: skip
    x = torch.randn(slots, HIDDEN, generator=gen).to(torch.bfloat16)
    token_round(op, kind, False, x, torch.rand(slots, K, generator=gen), None, spread(slots),
                f"{what}: after the rejected calls")  # fmt: skip


def run_cap(base_seed, over):
    """MORI's max_total_recv_tokens on the low-latency kernel types: P =
    min(ceil(cap / W), M) receive slots per source rank. The worst case exactly and
    above it (P = M, the uncapped layout) and a cap below it (P = SLOTS: a smaller
    receive area and token-major outputs of W * P rows); at capacity (MORI's spread
    routing, every rank sends P tokens to every rank) and under it (every routing kind,
    token- and expert-major, within P tokens per rank); with `over` (CPU) a rank past
    its slots fails the call on every rank."""
    gen = torch.Generator().manual_seed(base_seed * 3 + rank)
    full = _C.ll_buffer_layout(world, rank, M, K, HIDDEN, 2, 0, EPR)
    for i, kind in enumerate(LL):
        for cap, slots in ((world * M, M), (world * M * 3 + 1, M), (world * SLOTS - 1, SLOTS)):
            op = make_op(kind, cap=cap)
            what = f"{kind} max_total_recv_tokens {cap}"
            got = (op.max_num_tokens_to_recv_per_rank(), op.max_num_tokens_to_recv())
            assert got == (slots, world * slots), f"{what}: {got}"
            lay = op._ll_layout
            if slots == M:
                assert lay == full, what
            else:  # the dispatch areas (6 regions, 2 halves each) shrink with the slots
                span = lay["comb_tokens"] - lay["disp_tokens"]
                assert span <= (full["comb_tokens"] - full["disp_tokens"]) * slots // M + 12 * 256
                assert lay["total_bytes"] < full["total_bytes"], what
            x = torch.randn(slots, HIDDEN, generator=gen).to(torch.bfloat16)
            w = torch.rand(slots, K, generator=gen)
            total = token_round(op, kind, False, x, w, None, spread(slots), f"{what}: at capacity")
            assert total == world * slots, f"{what}: total_recv {total}"
            if over and slots < M:
                over_cap(op, kind, slots, gen, what)
            op.close()
        run_token(kind, False, base_seed + i, cap=world * SLOTS)
        run_token(kind, True, base_seed + 10 + i, cap=world * SLOTS)
        run_expert(kind, base_seed + 20 + i, cap=world * SLOTS)


# ----------------------------------------------------------------------- errors
def run_errors():
    bad = world - 1
    n = 4
    x = torch.randn(n, HIDDEN).to(torch.bfloat16)
    w = torch.rand(n, K)
    idx = torch.tensor([[0, 1, -1, E - 1]] * n, dtype=torch.int64)
    over = idx.clone()
    over[2, 1] = 300
    dup = idx.clone()
    dup[1, 1] = 0
    big = torch.zeros(M + 1, HIDDEN, dtype=torch.bfloat16)
    big_idx = torch.zeros(M + 1, K, dtype=torch.int64)
    for kind in LL:
        op = make_op(kind)
        cases = [
            (f"expert id 300 out of range [-1, {E}) at token 2 slot 1", (x, w, None, over)),
            (f"num_tokens {M + 1} exceeds max_num_inp_token_per_rank {M}",
             (big, torch.zeros(M + 1, K), None, big_idx)),
        ]  # fmt: skip
        for pattern, args in cases:
            if rank == bad:
                expect(mc.InvalidArgumentError, pattern, op.dispatch_send, *args)
            else:

                def call(op=op, kind=kind):
                    op.dispatch_send(x, w, None, idx)
                    if kind == EpDispatchCombineKernelType.AsyncLL:
                        op.dispatch_recv()

                expect(mc.InvalidArgumentError, f"dispatch rejected by rank {bad}", call)
        # DeepEP's entry point: out of range, duplicates, too many tokens.
        for pattern, args in [
            (f"expert id 300 out of range [-1, {E}) at token 2 slot 1", (x, over)),
            ("expert id 0 appears twice in token 1 (slots 0 and 1)", (x, dup)),
            (f"num_tokens {M + 1} exceeds max_num_inp_token_per_rank {M}", (big, big_idx)),
        ]:
            if rank == bad:
                expect(mc.InvalidArgumentError, pattern, op.low_latency_dispatch, *args, M, E)
            else:
                expect(mc.InvalidArgumentError, f"dispatch rejected by rank {bad}",
                       op.low_latency_dispatch, x, idx, M, E)  # fmt: skip
        expect(mc.InvalidStateError, "needs a received expert-major dispatch",
               op.low_latency_combine, torch.zeros(EPR, world * M, HIDDEN, dtype=torch.bfloat16),
               idx, w, None)  # fmt: skip
        # The op still works; a bad combine input fails the combine on every rank.
        recv_x, cnt, handle, _, _ = op.low_latency_dispatch(x, idx, M, E, use_fp8=False)
        y = recv_x.clone()
        if rank == bad:
            expect(mc.InvalidArgumentError, "x must be a bf16 tensor", op.low_latency_combine,
                   y.float(), idx, w, handle)  # fmt: skip
        else:
            expect(mc.InvalidArgumentError, f"combine rejected by rank {bad}",
                   op.low_latency_combine, y, idx, w, handle)  # fmt: skip
        recv_x, cnt, handle, _, _ = op.low_latency_dispatch(x, idx, M, E, use_fp8=False)
        cout, _, _ = op.low_latency_combine(recv_x, idx, torch.ones(n, K), handle)
        dests = (idx >= 0).sum(1)
        want = (x.float() * dests[:, None].float()).to(torch.bfloat16)  # exact: y = x per slot
        assert torch.equal(cout, want), f"{kind}: after errors"
        if kind == EpDispatchCombineKernelType.AsyncLL:
            op.dispatch_send(x, w, None, idx)
            expect(mc.InvalidStateError, "was sent and not received", op.dispatch_send,
                   x, w, None, idx)  # fmt: skip
            op.dispatch_recv()
        op.close()
    op = make_op(EpDispatchCombineKernelType.IntraNode)
    expect(mc.NotSupportedError, "needs kernel_type IntraNodeLL or AsyncLL",
           op.low_latency_dispatch, x, idx, M, E)  # fmt: skip
    op.close()
    if K >= 2 * world:
        # Ranks that decided the standard-MoE combine order differently (rank 0 one row
        # per expert, the others per-rank partials) fail that combine on every rank,
        # naming both wire formats; the op works after.
        if rank == 0:
            os.environ["MORI_EP_LL_PRE_REDUCE"] = "0"
        try:
            op = make_op(EpDispatchCombineKernelType.AsyncLL)
        finally:
            os.environ.pop("MORI_EP_LL_PRE_REDUCE", None)
        px, _, _, _ = op.dispatch_standard_moe(x, w, None, idx)
        mine, theirs = "expert-major bfloat16", "expert-major float32 per-rank partial"
        if rank != 0:
            mine, theirs = theirs, mine
        other = 1 if rank == 0 else 0
        expect(mc.InvalidArgumentError, f"rank {other} returns {theirs} rows, this rank {mine}",
               op.combine_standard_moe, px.clone(), None, idx)  # fmt: skip
        op.dispatch_standard_moe(x, w, None, idx)
        op.close()


def run_graph(base_seed):
    op = make_op(EpDispatchCombineKernelType.IntraNodeLL)
    assert op._impl.copy_engine == (os.environ.get("MORI_EP_LL_COPY_ENGINE") == "1")
    n = M
    x_s = torch.zeros(n, HIDDEN, dtype=torch.bfloat16, device=DEV)
    w_s = torch.zeros(n, K, device=DEV)
    idx_s = torch.full((n, K), -1, dtype=torch.int32, device=DEV)

    def token_step():
        out, ow, _, _, _ = op.dispatch(x_s, w_s, None, idx_s)
        return op.combine(out * 2, ow, idx_s)

    def expert_step():
        recv_x, _, handle, _, _ = op.low_latency_dispatch(x_s, idx_s, M, E, use_fp8=False)
        return op.low_latency_combine(recv_x * 2, idx_s, w_s, handle)[0]

    def stdmoe_step():  # per-rank partials where the op pre-reduces (top-k >= 2 x world)
        px, _, _, _ = op.dispatch_standard_moe(x_s, w_s, None, idx_s)
        return op.combine_standard_moe(px * 2, None, idx_s)[0]

    for step in (token_step, expert_step, stdmoe_step):
        step()  # eager once (and torch's lazy set-up) before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            res = step()
        for it in range(iters):
            gen = torch.Generator().manual_seed(base_seed * 13 + it * 7 + rank)
            x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16)
            w = torch.rand(n, K, generator=gen)
            idx = REF.routing("random", n, gen, it)
            x_s.copy_(x)
            w_s.copy_(w)
            idx_s.copy_(idx)
            graph.replay()
            torch.cuda.synchronize()
            if step is token_step:
                m = torch.tensor([len({int(e) // EPR for e in r if e >= 0}) for r in idx])
                # A token with no destination combines to +0.0 (not x * 0, which is
                # -0.0 where x < 0); the others sum m copies of 2x from -0.0, exactly.
                want = sum_start(m > 0, HIDDEN) + x.float() * 2 * m[:, None].float()
                want = want.to(torch.bfloat16)
                got = cpu(res[0])
            elif step is stdmoe_step:
                want = standard_moe_want(
                    x, w, idx, op.standard_moe_pre_reduce,
                    lambda rows, g: (rows.float() * 2).to(torch.bfloat16),
                )  # fmt: skip
                got = cpu(res)
            else:
                want = sum_start((idx >= 0).any(1), HIDDEN)
                for k in range(K):
                    part = w[:, k : k + 1] * (x.float() * 2).to(torch.bfloat16).float()
                    want = torch.where((idx[:, k] >= 0)[:, None], want + part, want)
                want = want.to(torch.bfloat16)
                got = cpu(res)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (
                f"{step.__name__} replay {it}"
            )
        del graph
    op.close()


def timeout_op(kind) -> EpDispatchCombineOp:
    """An op of `kind` whose waits time out after 1.5 s (the "timeout" mode)."""
    cfg = EpDispatchCombineConfig(
        torch.bfloat16, rank, world, HIDDEN, 0, 4, 2, M, EPR, K, kernel_type=kind
    )
    return EpDispatchCombineOp(cfg, timeout_s=1.5)


if mode == "token":
    for i, kind in enumerate(LL):
        run_token(kind, False, seed + i)
        run_token(kind, True, seed + 10 + i)
elif mode == "expert":
    for i, kind in enumerate(LL):
        run_expert(kind, seed + i)
    run_convert(seed + 5)
elif mode == "errors":
    run_errors()
elif mode == "cap":
    run_cap(seed, over=placement == "cpu")
elif mode == "graph":
    run_graph(seed)
elif mode == "timeout":
    op = timeout_op(EpDispatchCombineKernelType.AsyncLL)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    idx = torch.zeros(2, K, dtype=torch.int32)
    if rank == 0:
        op.dispatch_send(x, None, None, idx)  # returns: the send does not wait
        lost = (
            "low-latency dispatch (call 1) on rank 0: rank 1 did not arrive (dispatch flag) "
            "within 1500 ms (its last signal is from call 0)"
        )
        expect(mc.MoriTimeoutError, lost, op.dispatch_recv)
        expect(mc.InvalidStateError, "timed out earlier", op.dispatch_send, x, None, None, idx)
        expect(mc.InvalidStateError, "timed out earlier", op.low_latency_dispatch, x, idx, M, E)
    op2 = timeout_op(EpDispatchCombineKernelType.IntraNodeLL)  # rank 1 waits for rank 0 here
    idx = torch.arange(2, 2 + K, dtype=torch.int32).repeat(2, 1)  # distinct, on both ranks
    recv, _, handle, _, _ = op2.low_latency_dispatch(x, idx, M, E, use_fp8=False)
    if rank == 0:
        lost = (
            "low-latency combine (call 1) on rank 0: rank 1 did not arrive (combine flag) "
            "within 1500 ms"
        )
        expect(mc.MoriTimeoutError, lost, op2.low_latency_combine, recv, idx,
               torch.ones(2, K), handle)  # fmt: skip
    print(f"rank {rank} ok", flush=True)
    os._exit(0)  # the pes no longer agree on the call they are in: no collective teardown
else:
    raise SystemExit(f"unknown mode {mode}")
shmem.barrier_all()
import gc  # noqa: E402

gc.collect()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
