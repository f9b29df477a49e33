# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the balanced mode's tests. argv: mode seed S H K epn token_padding
[placement]: "cpu" (a host heap, the default), "shared" (every rank on GPU 0) or
"per_gpu" (rank r on GPU r): a CUDA heap, the kernels.

Creates a host heap over gloo, runs the scenario and prints "rank N ok" last. Every
rank draws every rank's inputs from the shared seed, so each checks its own results
against a reference of all ranks' inputs without communication.
  paths   per routing kind: the plan equals mori.ep.balanced.plan's and the Python
          reference's; dispatch is traceable (each row at its dst, pads zero, S*K real
          rows received); combine of dispatch == hidden * K; combine of random expert
          outputs == the reference sum bit for bit; route weights round trip; plan
          reuse, zero_copy and async_finish give the same bits; a per-expert scale
          within the rounding bound of the global fp64 reference (1 bf16 ulp when at
          most one rank pre-sums a token's rows); prefetch slots equal
          their owners' weights bitwise, other slots untouched (on a CUDA heap with
          both prefetch engines); reduce_grad bitwise against an ascending-order sum,
          consumed slots zeroed; CUDA-graph capture refused (CUDA heap); autograd.
  timeout (host heap) rank 1 never dispatches: rank 0's error names it and the stage
          within the timeout; the Buffer refuses later calls.
  errors  (host heap) each rank in turn passes a bad input: that rank's error names
          the value, the others' name that rank; rank 0 plans while the others reuse a
          plan: every rank refuses the call; the Buffer still works afterwards.
"""

import dataclasses
import gc
import random
import sys
import zlib

import torch
import torch.distributed as dist
from balanced_reference import KINDS, counts, destinations, plan_tables, routing

import mori.core as mc
from mori.core import shmem
from mori.core.launch import expect_raises
from mori.core.testing import start_rank
from mori.ep import balanced

mode, seed = sys.argv[1], int(sys.argv[2])
S, H, K, EPN, PAD = (int(x) for x in sys.argv[3:8])
placement = sys.argv[8] if len(sys.argv) > 8 else "cpu"
rank, world, DEV = start_rank(placement, "64M", 60)
R, E = world, EPN * world


def D(x):
    """x on the heap's device."""
    return None if x is None else x.to(DEV)


def host_plan(p):
    """p with every tensor on the CPU (checks compare on the host)."""
    return dataclasses.replace(
        p, **{f.name: getattr(p, f.name).cpu() for f in dataclasses.fields(p)
              if isinstance(getattr(p, f.name), torch.Tensor)}
    )  # fmt: skip


def gen(*key) -> torch.Generator:
    # crc32, not hash(): every process must draw the same inputs for a key.
    return torch.Generator().manual_seed(zlib.crc32(repr((seed, *key)).encode()))


def exact_hidden(r: int) -> torch.Tensor:
    """[S, H] bf16 whose sums of up to 8 copies are exact (<= 4 significant bits)."""
    g = gen("hidden", r)
    m = torch.randint(-15, 16, (S, H), generator=g).float()
    return (m * torch.exp2(torch.randint(-4, 5, (S, H), generator=g).float())).bfloat16()


def random_bf16(shape, *key) -> torch.Tensor:
    return torch.randn(shape, generator=gen(*key)).bfloat16()


def decode(v: int, nvs: int) -> tuple[int, int]:
    raw = v if v >= 0 else -v - 1
    return raw // nvs, raw % nvs


def check_plan(p, tpe, topk, kind):
    want = plan_tables(tpe, S, K, PAD)
    mine = balanced.plan(torch.tensor(tpe, dtype=torch.int32), S, K, PAD,
                         topk=torch.tensor(topk, dtype=torch.int32)).for_rank(rank)  # fmt: skip
    for name in ("dst", "cu_seqlens", "experts_to_copy", "zero_fill_ranges", "remote_stats",
                 "dup_groups", "dup_loffs", "dup_counts", "alloc", "expert_offsets"):  # fmt: skip
        assert torch.equal(getattr(p, name), getattr(mine, name)), (kind, name)
    assert p.cu_seqlens.tolist() == want["cu_seqlens"][rank], kind
    assert p.dst.tolist() == destinations(tpe, want, topk[rank], rank), kind
    assert p.received_rows() == S * K


def check_dispatch(hidden_nvsh, weights_nvs, p, hidden_all, weights_all, dst_all, kind):
    """Every pair sent here sits at its slot; pads are zero; exactly S*K real rows."""
    nvs = p.nvs
    real = 0
    for s in range(R):
        for t in range(S):
            for k in range(K):
                d, slot = decode(dst_all[s][t * K + k], nvs)
                if d != rank:
                    continue
                real += 1
                assert torch.equal(hidden_nvsh[slot].view(torch.int16),
                                   hidden_all[s][t].view(torch.int16)), (kind, s, t, k)  # fmt: skip
                if weights_nvs is not None:
                    assert weights_nvs[slot].item() == weights_all[s][t, k].item(), (kind, s, t)
    assert real == S * K, (kind, real)
    for first, rows in p.zero_fill_ranges.tolist():
        assert not hidden_nvsh[first : first + rows].view(torch.int16).any(), kind


def reference_combine(expert_all, dst_all_me, dup_of) -> torch.Tensor:
    """Rank `rank`'s combine output of expert outputs expert_all[d] [NvS, H] (bf16):
    per destination, the fp32 sum of its rows (primary then duplicates in ascending
    slot) rounded once to bf16; then the fp32 sum of those in k order, rounded once."""
    out = torch.empty(S, H, dtype=torch.bfloat16)
    nvs = expert_all[0].shape[0]
    for t in range(S):
        parts = []
        for k in range(K):
            v = dst_all_me[t * K + k]
            if v < 0:
                continue
            d, slot = decode(v, nvs)
            dups = dup_of[d].get(slot, [])
            if dups:
                acc = torch.full((H,), -0.0) + expert_all[d][slot].float()
                for u in dups:
                    acc = acc + expert_all[d][u].float()
                parts.append(acc.bfloat16())
            else:
                parts.append(expert_all[d][slot])
        if len(parts) == 1:
            out[t] = parts[0]
        else:
            acc = torch.full((H,), -0.0)
            for q in parts:
                acc = acc + q.float()
            out[t] = acc.bfloat16()
    return out


def dup_tables(ps) -> list[dict]:
    out = []
    for d in range(R):
        n = int(ps.dup_counts[d][0])
        groups = {}
        for i in range(n):
            p, start, cnt = ps.dup_groups[d][i].tolist()
            groups[p] = ps.dup_loffs[d][start : start + cnt].tolist()
        out.append(groups)
    return out


def check_expert_scale(buf, p, hp, topk, kind):
    """An expert FFN scaling its rows by a per-expert factor (positive inputs, so no
    cancellation) against the global reference, the fp64 sum of bf16(x * scale). The
    bound comes from the arithmetic: the final rounding (1/2 ulp) plus 1/2 ulp for each
    rank that pre-sums two or more of the token's rows into one bf16 partial (no larger
    than the result): 1 ulp when at most one rank does, more where several do."""
    x = random_bf16((S, H), "sx", kind, rank).abs() + 0.5
    scale = torch.rand(E, generator=gen("scale", kind)).bfloat16().float() + 0.25
    h_nvs, _, cu, _ = buf.dispatch(D(x.bfloat16()), None, plan=p)
    y = h_nvs.cpu().float()
    start = 0
    for g, end in enumerate(hp.cu_seqlens.tolist()):
        e = rank * EPN + g if g < EPN else int(hp.experts_to_copy[rank][g - EPN])
        if e >= 0:
            y[start:end] *= scale[e]
        start = end
    out, _, _ = buf.combine(p, D(y.bfloat16()))
    exact = torch.zeros(S, H, dtype=torch.float64)
    xb = x.bfloat16().float()
    for k in range(K):
        e = torch.tensor([row[k] for row in topk[rank]])
        exact += (xb * scale[e][:, None]).bfloat16().double()
    dst = hp.dst.view(S, K).tolist()
    presums = []
    for row in dst:
        ranks = [decode(v, hp.nvs)[0] for v in row]
        presums.append(sum(1 for d in set(ranks) if ranks.count(d) > 1))
    got = out.cpu().double()
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(got.abs(), exact.abs()))) - 7)
    bound = ulp * (0.5 + 0.5 * torch.tensor(presums, dtype=torch.float64))[:, None]
    bound += exact.abs() * 2.0**-20  # fp32 accumulation, far below a bf16 ulp
    err = (got - exact).abs()
    assert bool((err <= bound).all()), (kind, float((err / ulp).max()))


def sync():
    """Device work done and every rank past this point."""
    if DEV.type == "cuda":
        torch.cuda.synchronize(DEV)
    shmem.barrier_all()


def check_weights(buf, p, hp):
    """prefetch_weight and reduce_grad on [R, epn, 8, 4] pools."""
    shape = (EPN, 8, 4)
    names = ("gate", "up", "down")
    local = {n: D(random_bf16(shape, "w", n, rank)) for n in names}
    owner = {n: [random_bf16(shape, "w", n, r) for r in range(R)] for n in names}
    pools = {n: shmem.empty((R, *shape), torch.bfloat16) for n in names}
    sentinel = torch.full((R, *shape), -7.0, dtype=torch.bfloat16)
    etc = hp.experts_to_copy.tolist()
    # Both prefetch engines on a CUDA heap (kernel stores, copy-engine peer copies).
    for engine in ("sm", "copy") if DEV.type == "cuda" else ("sm",):
        buf.prefetch_engine = engine
        for n in names:
            pools[n].copy_(sentinel)
        sync()
        buf.prefetch_weight(
            p, local_gate_weight=local["gate"], local_up_weight=local["up"],
            local_down_weight=local["down"], gate_prefetch_buffer=pools["gate"],
            up_prefetch_buffer=pools["up"], down_prefetch_buffer=pools["down"],
        )  # fmt: skip
        sync()
        for n in names:
            got = pools[n].cpu()
            for b in range(EPN):
                e = etc[rank][b]
                want = owner[n][e // EPN][e % EPN] if e >= 0 else sentinel[rank][b]
                assert torch.equal(got[rank][b].view(torch.int16), want.view(torch.int16)), (
                    engine, n, b)  # fmt: skip
            for d in range(R):
                if d != rank:
                    assert torch.equal(got[d], sentinel[d]), (engine, n, d)
    buf.prefetch_engine = "sm"

    gshape = (R, *shape)
    grads = {n: D(torch.randn(shape, generator=gen("g", n, rank))) for n in names}
    before = {n: g.cpu().clone() for n, g in grads.items()}
    rbufs = {n: shmem.empty(gshape, torch.float32) for n in names}
    slot_grad = {n: [torch.randn(gshape, generator=gen("s", n, r)) for r in range(R)]
                 for n in names}  # fmt: skip
    for n in names:
        rbufs[n].copy_(slot_grad[n][rank])
    sync()
    buf.reduce_grad(
        p, local_gate_grad=grads["gate"], local_up_grad=grads["up"],
        local_down_grad=grads["down"], gate_reduce_buffer=rbufs["gate"],
        up_reduce_buffer=rbufs["up"], down_reduce_buffer=rbufs["down"],
    )  # fmt: skip
    sync()
    grads = {n: g.cpu() for n, g in grads.items()}
    rbufs = {n: b.cpu() for n, b in rbufs.items()}
    for n in names:
        for le in range(EPN):
            want = before[n][le].clone()
            for d in range(R):
                for b in range(EPN):
                    if etc[d][b] == rank * EPN + le:
                        want = want + slot_grad[n][d][d][b]
            assert torch.equal(grads[n][le].view(torch.int32), want.view(torch.int32)), (n, le)
        for b in range(EPN):
            if etc[rank][b] >= 0:
                assert not rbufs[n][rank][b].any(), (n, b)
            else:
                assert torch.equal(rbufs[n][rank][b], slot_grad[n][rank][rank][b]), (n, b)
        for d in range(R):
            if d != rank:
                assert torch.equal(rbufs[n][d], slot_grad[n][rank][d])


def run_paths():
    buf = balanced.Buffer(S, H, K, E, R, token_padding=PAD, timeout_s=30)
    rng = random.Random(seed)
    for kind in KINDS:
        topk = routing(kind, R, E, S, K, rng)
        tpe = [counts(topk[r], E) for r in range(R)]
        ps = balanced.plan(torch.tensor(tpe, dtype=torch.int32), S, K, PAD,
                           topk=torch.tensor(topk, dtype=torch.int32))  # fmt: skip
        dst_all = ps.dst.tolist()
        hidden_all = [exact_hidden(r) for r in range(R)]
        weights_all = [torch.rand(S, K, generator=gen("rw", kind, r)) for r in range(R)]
        topk_me = torch.tensor(topk[rank], dtype=torch.int32)
        tpe_me = torch.tensor(tpe[rank], dtype=torch.int32)
        h_nvs, w_nvs, cu, p = buf.dispatch(
            D(hidden_all[rank]), D(weights_all[rank]), D(topk_me), D(tpe_me)
        )
        assert h_nvs.shape == (buf.NvS, H) and cu.shape == (2 * EPN,)
        hp = host_plan(p)
        check_plan(hp, tpe, topk, kind)
        check_dispatch(h_nvs.cpu(), w_nvs.cpu(), hp, hidden_all, weights_all, dst_all, kind)
        valid = int(cu[-1])
        h_host, w_host = h_nvs.cpu(), w_nvs.cpu()

        out, w_sk, ev = buf.combine(p, h_nvs, w_nvs)
        out, w_sk = out.cpu(), w_sk.cpu()
        assert ev is None
        assert torch.equal(out.view(torch.int16), (hidden_all[rank].float() * K).bfloat16()
                           .view(torch.int16)), kind  # fmt: skip
        assert torch.equal(w_sk, weights_all[rank]), kind

        # Random expert outputs, combined against the reference sum, bit for bit.
        expert_all = [random_bf16((buf.NvS, H), "x", kind, d) for d in range(R)]
        out, _, _ = buf.combine(p, D(expert_all[rank].clone()))
        out = out.cpu()
        want = reference_combine(expert_all, dst_all[rank], dup_tables(ps))
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), kind

        # Plan reuse, zero_copy and async_finish give the same bits.
        h2 = random_bf16((S, H), "h2", kind, rank)
        r_nvs, r_w, r_cu, r_p = buf.dispatch(D(h2), D(weights_all[rank]), plan=p)
        assert r_cu is None and r_p is p
        h2_all = [random_bf16((S, H), "h2", kind, r) for r in range(R)]
        check_dispatch(r_nvs.cpu(), r_w.cpu(), hp, h2_all, weights_all, dst_all, kind + " reuse")
        z_nvs, z_w, z_cu, z_p, ev = buf.dispatch(
            D(hidden_all[rank]), D(weights_all[rank]), D(topk_me), D(tpe_me), async_finish=True,
            zero_copy=True, router_weights_zero_copy=True,
        )  # fmt: skip
        ev.synchronize()
        assert z_nvs.data_ptr() == buf.hidden_nvsh_buffer_view.data_ptr()
        assert torch.equal(z_nvs[:valid].cpu().view(torch.int16), h_host[:valid].view(torch.int16))
        assert torch.equal(z_w[:valid].cpu(), w_host[:valid]) and torch.equal(z_cu, cu)
        assert torch.equal(z_p.dst, p.dst)
        z_out, z_wsk, ev = buf.combine(z_p, z_nvs, z_w, async_finish=True, zero_copy=True,
                                       router_weights_zero_copy=True)  # fmt: skip
        ev.synchronize()
        z_out, z_wsk = z_out.cpu(), z_wsk.cpu()
        assert torch.equal(z_out.view(torch.int16), (hidden_all[rank].float() * K).bfloat16()
                           .view(torch.int16)), kind  # fmt: skip
        assert torch.equal(z_wsk, weights_all[rank])
        check_expert_scale(buf, p, hp, topk, kind)
        check_weights(buf, p, hp)
        print(f"rank {rank}: {kind} ok (remote experts {p.remote_stats.tolist()})")

    if DEV.type == "cuda":
        # CUDA-graph capture is refused before any launch, every op; the Buffer works after.
        xs, h_cap = D(hidden_all[rank]), D(torch.zeros(buf.NvS, H, dtype=torch.bfloat16))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for call in (lambda: buf.dispatch(xs, None, plan=p), lambda: buf.combine(p, h_cap),
                         lambda: buf.prefetch_weight(p), lambda: buf.reduce_grad(p)):  # fmt: skip
                expect_raises(mc.NotSupportedError, "cannot be captured in a CUDA graph", call)
        del g
        sync()
        h_nvs, _, _, _ = buf.dispatch(xs, None, plan=p)
        out, _, _ = buf.combine(p, h_nvs)
        assert torch.equal(out.cpu().view(torch.int16), (hidden_all[rank].float() * K).bfloat16()
                           .view(torch.int16))  # fmt: skip

    # Autograd: combine(dispatch(x)) with an identity expert; grads go back through
    # the other op with the saved plan.
    topk = routing("biased", R, E, S, K, rng)
    tpe = [counts(topk[r], E) for r in range(R)]
    x = D(exact_hidden(rank)).requires_grad_(True)
    w = D(torch.rand(S, K, generator=gen("aw", rank))).requires_grad_(True)
    h_nvs, w_nvs, cu, p = balanced.autograd.dispatch(
        buf, x, w, D(torch.tensor(topk[rank], dtype=torch.int32)),
        D(torch.tensor(tpe[rank], dtype=torch.int32)),
    )  # fmt: skip
    y = balanced.autograd.combine(buf, p, h_nvs * 1)
    assert torch.equal(y.detach().float(), x.detach().float() * K)
    g = D(exact_hidden(rank + R))
    (y.float() * g.float()).sum().backward()
    # d(sum y*g)/dx = K * g (each copy carries g back).
    assert torch.equal(x.grad.float(), (g.float() * K).bfloat16().float())
    (w_nvs * 1).sum().backward()
    assert torch.equal(w.grad.cpu(), torch.ones(S, K))
    buf.destroy()
    buf.destroy()


def run_errors():
    buf = balanced.Buffer(S, H, K, E, R, token_padding=PAD, timeout_s=30)
    rng = random.Random(seed)
    topk = routing("biased", R, E, S, K, rng)
    tpe = [counts(topk[r], E) for r in range(R)]
    x = D(exact_hidden(rank))
    t_me = D(torch.tensor(topk[rank], dtype=torch.int32))
    c_me = D(torch.tensor(tpe[rank], dtype=torch.int32))
    _, _, _, p = buf.dispatch(x, None, t_me, c_me)
    bad_topk = t_me.clone()
    bad_topk[1, 0] = E + 3
    bad_counts = c_me.clone()
    bad_counts[0] += 1
    bad_counts[1] -= 1
    pool = shmem.empty((R, EPN, 4, 4), torch.bfloat16)
    plain = torch.zeros(R, EPN, 4, 4, dtype=torch.bfloat16)
    lw = torch.zeros(EPN, 4, 4, dtype=torch.bfloat16)
    rb = shmem.empty((R, EPN, 4, 4), torch.float32)
    cases = [
        ("dispatch", lambda: buf.dispatch(x.float(), None, t_me, c_me),
         "hidden_sh dtype torch.float32 must be torch.bfloat16"),
        ("dispatch", lambda: buf.dispatch(x, None, t_me[:, :1].contiguous(), c_me),
         f"topk_experts_sk shape ({S}, 1) must be ({S}, {K})"),
        ("dispatch", lambda: buf.dispatch(x, None, bad_topk, c_me),
         f"expert id {E + 3} out of range [0, {E}) at token 1, k 0 on rank {{culprit}}"),
        ("dispatch", lambda: buf.dispatch(x, None, t_me, bad_counts),
         "tokens_per_expert[0] is {bad0} but topk_experts_sk routes {seen0} tokens to expert 0 "
         "on rank {culprit}"),
        ("combine", lambda: buf.combine(p, torch.zeros(buf.NvS + 1, H, dtype=torch.bfloat16)),
         f"hidden_nvsh shape ({buf.NvS + 1}, {H}) must be ({buf.NvS}, {H})"),
        ("prefetch_weight", lambda: buf.prefetch_weight(
            p, local_gate_weight=lw, local_up_weight=lw, local_down_weight=lw,
            gate_prefetch_buffer=pool, up_prefetch_buffer=pool, down_prefetch_buffer=plain),
         "prefetch buffer 2 is not a symmetric tensor"),
        ("reduce_grad", lambda: buf.reduce_grad(
            p, local_gate_grad=lw, local_up_grad=lw, local_down_grad=lw,
            gate_reduce_buffer=pool, up_reduce_buffer=pool, down_reduce_buffer=pool),
         "dtypes torch.bfloat16/torch.bfloat16 must be torch.float32"),
    ]  # fmt: skip
    good = {
        "dispatch": lambda: buf.dispatch(x, None, t_me, c_me),
        "combine": lambda: buf.combine(p, torch.zeros(buf.NvS, H, dtype=torch.bfloat16)),
        "prefetch_weight": lambda: buf.prefetch_weight(
            p, local_gate_weight=lw, local_up_weight=lw, local_down_weight=lw,
            gate_prefetch_buffer=pool, up_prefetch_buffer=pool, down_prefetch_buffer=pool),
        "reduce_grad": lambda: None,
    }  # fmt: skip
    for i, (op, bad, message) in enumerate(cases):
        culprit = i % R
        message = message.format(culprit=culprit, bad0=tpe[culprit][0] + 1, seen0=tpe[culprit][0])
        if rank == culprit:
            expect_raises(mc.InvalidArgumentError, message, bad)
        elif op == "reduce_grad":
            # The others' call is a good one; they see the culprit's refusal.
            g = torch.zeros(EPN, 4, 4)
            got = expect_raises(mc.InvalidArgumentError, f"rank {culprit} refused",
                                buf.reduce_grad, p, local_gate_grad=g, local_up_grad=g,
                                local_down_grad=g, gate_reduce_buffer=rb, up_reduce_buffer=rb,
                                down_reduce_buffer=rb)  # fmt: skip
            assert message in got, got
        else:
            got = expect_raises(mc.InvalidArgumentError, f"rank {culprit} refused", good[op])
            assert message in got, got
    # Ranks that call different things in one call: every rank refuses it.
    if rank == 0:
        want = "called dispatch (planning) but rank 1 called dispatch (with a saved plan)"
        expect_raises(mc.InvalidArgumentError, want, buf.dispatch, x, None, t_me, c_me)
    else:
        want = "called dispatch (with a saved plan) but rank 0 called dispatch (planning)"
        expect_raises(mc.InvalidArgumentError, want, buf.dispatch, x, None, plan=p)
    # Still usable: a full dispatch/combine round trip.
    h, _, _, p2 = buf.dispatch(x, None, t_me, c_me)
    out, _, _ = buf.combine(p2, h)
    assert torch.equal(out.float(), x.float() * K)
    buf.destroy()


def run_timeout():
    # Rank 1 never dispatches: rank 0's wait ends after its timeout naming rank 1 and the
    # stage, and the Buffer refuses later calls.
    buf = balanced.Buffer(S, H, K, E, R, token_padding=PAD, timeout_s=1.5)
    topk = routing("balanced", R, E, S, K, random.Random(seed))
    if rank == 0:
        t = torch.tensor(topk[0], dtype=torch.int32)
        c = torch.tensor(counts(topk[0], E), dtype=torch.int32)
        x = exact_hidden(0)
        msg = expect_raises(mc.MoriTimeoutError, "rank 1 did not arrive (entry)", buf.dispatch,
                            x, None, t, c)  # fmt: skip
        assert "dispatch (call 1) on rank 0" in msg, msg
        expect_raises(mc.InvalidStateError, "an earlier call failed", buf.dispatch, x, None, t, c)
    dist.barrier()


{"paths": run_paths, "errors": run_errors, "timeout": run_timeout}[mode]()
# Teardown as the other workers do it: every symmetric tensor released, then the heap
# and the process group (left to interpreter exit, their threads can abort it).
if DEV.type == "cuda":
    torch.cuda.synchronize(DEV)
gc.collect()
shmem.barrier_all()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
