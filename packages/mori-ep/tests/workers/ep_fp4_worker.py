# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the packed-fp4 (torch.float4_e2m1fn_x2) tests (CPU, host heap).
argv: scenario seed kind local_size [iters]

``local_size`` is gpu_per_node (the inter-node kinds' emulated nodes; the intra-node
kinds ignore it). A row of hidden_dim fp4x2 elements is hidden_dim bytes of two e2m1
values each (the low nibble first), as in MORI.
  bits     fresh random bytes every call (ranks with no tokens, -1 slots, fp32 scales):
           every dispatched row, weight, scale and index equal to its source's bit for
           bit, each source token received exactly once per destination rank; then a
           combine of fresh random fp4 rows: every value summed as MORI's combine of
           its fp4 type does (fp32 sum, rounded to nearest even, saturating at +-6;
           InterNodeV1/V1LL round one partial per node first), compared byte for byte
           with an independent reference (the nearest e2m1 value, ties to the even
           code). e2m1 values are multiples of 0.5 below 7, so the fp32 sums are exact
           and the reference does not depend on the summation order.
  mismatch rank 1 dispatches bf16 rows while the others dispatch fp4, then combines
           bf16 rows while the others combine fp4: every rank fails each call naming
           both dtypes; the op then dispatches and combines fp4 again.
  half     MORI's fp4 dispatch beside a bf16 combine: the config's hidden_dim is the
           combine's columns, dispatch takes fp4 rows of hidden_dim / 2 bytes (hidden_dim
           e2m1 values) and moves them bit for bit; a combine of their values as bf16
           (exact) gives each token's value times its destination ranks. A rank passing
           fp4 rows of hidden_dim bytes beside one passing hidden_dim / 2 fails the call
           on every rank naming both.
  fp4bw    a config with quant_type "fp4_blockwise" is made and dispatches; its
           combine fails on every rank naming the quant types that exist.
Prints "rank N ok" last.
"""

import os
import sys

import torch
import torch.distributed as dist

import mori.core as mc
from mori.core import shmem
from mori.core.dist_compat import all_gather_single
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

FP4 = torch.float4_e2m1fn_x2
scenario, seed, kind, local = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
iters = int(sys.argv[5]) if len(sys.argv) > 5 else 4
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
shmem.init(device="cpu", heap_size="64M", timeout_s=60)
gen = torch.Generator().manual_seed(seed * 31 + rank)
print(f"rank {rank}: {scenario} {kind} local {local}, seed {seed}", flush=True)

H, M, EPR, K, S = 96, 12, 2, 3, 3  # bytes per row (192 e2m1 values), scales per token
KIND = EpDispatchCombineKernelType[kind]
ASYNC = KIND == EpDispatchCombineKernelType.AsyncLL
PER_NODE = KIND in (
    EpDispatchCombineKernelType.InterNodeV1,
    EpDispatchCombineKernelType.InterNodeV1LL,
)
INTER = KIND in (
    EpDispatchCombineKernelType.InterNode,
    EpDispatchCombineKernelType.InterNodeV1,
    EpDispatchCombineKernelType.InterNodeV1LL,
)
NODE = local if INTER else world  # ranks per node (min with the host's pes: all local here)

# e2m1 magnitudes by code (OCP): written out, not derived from the native tables.
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def make_op(quant="none", scale_dim=S) -> EpDispatchCombineOp:
    cfg = EpDispatchCombineConfig(
        FP4, rank, world, H, scale_dim, 4, 2, M, EPR, K,
        kernel_type=KIND, gpu_per_node=local, quant_type=quant,
    )  # fmt: skip
    return EpDispatchCombineOp(cfg, timeout_s=30.0)


def decode(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., H] -> fp32 [..., H, 2] (low nibble, high nibble)."""
    nib = torch.stack([b & 0xF, b >> 4], -1).long()
    mag = E2M1[nib & 7]
    return torch.where((nib & 8) != 0, -mag, mag)


def encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 [..., H, 2] -> uint8 [..., H]: the nearest e2m1 value, a tie to the even
    code, saturating; the sign of v (zeros keep theirs)."""
    a = v.abs().clamp(max=6.0)
    dist_ = (a[..., None] - E2M1).abs()
    best = dist_.min(-1, keepdim=True).values
    cand = (dist_ == best).to(torch.int64)
    # among equally near codes (at most two), the even one
    codes = torch.arange(8)
    even = cand * ((codes % 2) == 0)
    code = torch.where(even.sum(-1) > 0, (even * codes).sum(-1), (cand * codes).sum(-1))
    code = code | (torch.signbit(v).to(torch.int64) << 3)
    return (code[..., 0] | (code[..., 1] << 4)).to(torch.uint8)


def rand_fp4(n: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, H), dtype=torch.uint8, generator=gen).view(FP4)


def routing(n: int) -> torch.Tensor:
    """Distinct experts per token (their ranks may repeat), about one slot in four -1."""
    rows = [torch.randperm(EPR * world, generator=gen)[:K] for _ in range(n)]
    idx = (torch.stack(rows) if rows else torch.zeros(0, K)).reshape(n, K).to(torch.int32)
    return torch.where(torch.rand(n, K, generator=gen) < 0.25, -1, idx)


def gather(t: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """Every rank's t padded to `rows` rows, as uint8 bytes of the same shape."""
    b = t.contiguous().view(torch.uint8) if t.dtype == FP4 else t.contiguous()
    pad = torch.zeros((rows, *b.shape[1:]), dtype=b.dtype)
    pad[: b.size(0)] = b
    out = torch.zeros((world * rows, *pad.shape[1:]), dtype=b.dtype)
    all_gather_single(out, pad)
    return list(out.view(world, *pad.shape))


def counts(n: int) -> list[int]:
    c = torch.zeros(world, dtype=torch.int64)
    all_gather_single(c, torch.tensor([n], dtype=torch.int64))
    return [int(v) for v in c]


def dispatch(op, x, w, sc, idx):
    if ASYNC:
        out = op.dispatch_send(x, w, sc, idx)
        op.dispatch_recv()
        return out
    return op.dispatch(x, w, sc, idx)


def combine(op, inp, w, idx):
    if ASYNC:
        out = op.combine_send(inp, w, idx)
        op.combine_recv()
        return out
    return op.combine(inp, w, idx)


def run_bits() -> None:
    op = make_op()
    cap = op.max_num_tokens_to_recv()
    for it in range(iters):
        n = 0 if (it + rank) % 4 == 3 else int(torch.randint(1, M + 1, (1,), generator=gen))
        x, idx = rand_fp4(n), routing(n)
        w = torch.rand(n, K, generator=gen)
        sc = torch.randn(n, S, generator=gen)
        out, out_w, out_sc, out_idx, total = dispatch(op, x, w, sc, idx)
        total = int(total.item())
        assert out.dtype == FP4 and tuple(out.shape[1:]) == (H,), (out.dtype, out.shape)
        ns = counts(n)
        ax, aw, asc, ai = gather(x, M), gather(w, M), gather(sc, M), gather(idx, M)
        pos = op.get_dispatch_src_token_pos().tolist()
        got = [op.decode_send_flat_idx(p) for p in pos]
        want = {
            (s, t)
            for s in range(world)
            for t in range(ns[s])
            if any(int(e) >= 0 and int(e) // EPR == rank for e in ai[s][t])
        }
        assert len(got) == total == len(want) and set(got) == want, (it, total, len(want))
        ob = out[:total].view(torch.uint8)
        for i, (s, t) in enumerate(got):
            assert torch.equal(ob[i], ax[s][t]), (it, i, s, t)
            assert torch.equal(out_w[i], aw[s][t]) and torch.equal(out_sc[i], asc[s][t])
            assert torch.equal(out_idx[i].to(torch.int32), ai[s][t].to(torch.int32))
        # combine: fresh rows on every rank, summed per source token
        inp = rand_fp4(total)
        y, _ = combine(op, inp, out_w[:total], idx)
        assert y.dtype == FP4 and tuple(y.shape) == (n, H)
        rows = gather(inp, cap)
        srcs = gather(torch.tensor([s * M + t for s, t in got], dtype=torch.int64), cap)
        tot = counts(total)
        want_y = torch.zeros(n, H, dtype=torch.uint8)
        for t in range(n):
            parts = {}  # node -> fp32 [H, 2] partial sums (exact)
            for d in range(world):
                hit = (srcs[d][: tot[d]] == rank * M + t).nonzero().flatten().tolist()
                assert len(hit) <= 1
                if hit:
                    v = decode(rows[d][hit[0]])
                    node = d // NODE if PER_NODE else 0
                    parts[node] = parts.get(node, torch.full_like(v, -0.0)) + v
            if not parts:
                continue  # no part: zeros
            if PER_NODE:  # one e2m1 partial per node, then their sum
                acc = torch.full((H, 2), -0.0)
                for node in sorted(parts):
                    acc = acc + decode(encode(parts[node]))
            else:
                acc = parts[0]
            want_y[t] = encode(acc)
        got_y = y.view(torch.uint8)
        bad = (got_y != want_y).any(1).nonzero().flatten().tolist()
        assert not bad, f"iter {it}: combine differs at tokens {bad[:8]}"
        print(f"rank {rank}: iter {it}: {n} tokens, {total} received, bit for bit", flush=True)


def expect_both(fn, *names) -> None:
    try:
        fn()
    except mc.InvalidArgumentError as e:
        for name in names:
            assert name in str(e), (name, str(e))
        return
    raise AssertionError(f"expected InvalidArgumentError naming {names}")


def run_mismatch() -> None:
    op = make_op(scale_dim=0)
    n = 4
    idx = routing(n)
    x = torch.randn(n, H, generator=gen).to(torch.bfloat16) if rank == 1 else rand_fp4(n)

    def bad_dispatch():
        dispatch(op, x, None, None, idx)

    expect_both(bad_dispatch, "float4_e2m1fn_x2", "bfloat16")
    x = rand_fp4(n)
    out, _, _, _, total = dispatch(op, x, None, None, idx)
    total = int(total.item())
    inp = out[:total].view(torch.uint8).to(torch.bfloat16) if rank == 1 else out[:total]

    def bad_combine():
        combine(op, inp, None, idx)

    expect_both(bad_combine, "float4_e2m1fn_x2", "bfloat16")
    out, _, _, _, total = dispatch(op, x, None, None, idx)
    y, _ = combine(op, out[: int(total.item())], None, idx)
    assert y.dtype == FP4 and tuple(y.shape) == (n, H)


def unpack_bf16(b: torch.Tensor) -> torch.Tensor:
    """uint8 [n, H/2] -> bf16 [n, H]: the e2m1 values, low nibble first (exact)."""
    return decode(b).reshape(b.size(0), -1).to(torch.bfloat16)


def run_half() -> None:
    cfg = EpDispatchCombineConfig(
        FP4, rank, world, 2 * H, 0, 4, 2, M, EPR, K, kernel_type=KIND, gpu_per_node=local
    )
    op = EpDispatchCombineOp(cfg, timeout_s=30.0)
    for it in range(iters):
        n = int(torch.randint(1, M + 1, (1,), generator=gen))
        x, idx = rand_fp4(n), routing(n)  # [n, H] bytes = [n, 2H] values
        out, _, _, _, total = dispatch(op, x, None, None, idx)
        total = int(total.item())
        assert out.dtype == FP4 and tuple(out.shape[1:]) == (H,), out.shape
        ax = gather(x, M)
        got = [op.decode_send_flat_idx(p) for p in op.get_dispatch_src_token_pos().tolist()]
        ob = out[:total].view(torch.uint8)
        for i, (s, t) in enumerate(got):
            assert torch.equal(ob[i], ax[s][t]), (it, i, s, t)
        y, _ = combine(op, unpack_bf16(ob), None, idx)
        ranks = [len({int(e) // EPR for e in idx[t] if int(e) >= 0}) for t in range(n)]
        want = unpack_bf16(x.view(torch.uint8)).float() * torch.tensor(ranks)[:, None]
        assert y.dtype == torch.bfloat16 and torch.equal(y.float(), want), it
    n = 3
    idx = routing(n)
    x = rand_fp4(n) if rank == 0 else torch.zeros(n, 2 * H, dtype=torch.uint8).view(FP4)

    def two_widths():
        dispatch(op, x, None, None, idx)

    expect_both(two_widths, "float4_e2m1fn_x2 (rows of hidden_dim / 2 bytes)", "rank")
    print(f"rank {rank}: {iters} calls of half-width fp4 rows, bit for bit", flush=True)


def run_fp4bw() -> None:
    cfg = EpDispatchCombineConfig(
        torch.bfloat16, rank, world, H, 0, 4, 2, M, EPR, K,
        kernel_type=KIND, gpu_per_node=local, quant_type="fp4_blockwise",
    )  # fmt: skip
    op = EpDispatchCombineOp(cfg, timeout_s=30.0)
    n = 3
    idx = routing(n)
    out, w, _, _, total = dispatch(op, torch.randn(n, H, generator=gen).bfloat16(), None, None, idx)
    total = int(total.item())
    try:
        combine(op, out[:total], w[:total], idx)
    except mc.InvalidArgumentError as e:
        msg = str(e)
        assert "only supports" in msg and "fp8_blockwise" in msg, msg
        assert "fp8_direct_cast" in msg and "fp4_blockwise" in msg, msg
    else:
        raise AssertionError("an fp4_blockwise combine was not refused")


{"bits": run_bits, "mismatch": run_mismatch, "half": run_half, "fp4bw": run_fp4bw}[scenario]()
dist.barrier()
shmem.finalize()  # the inter-node proxies say goodbye before any rank exits
dist.destroy_process_group()
print(f"rank {rank} ok", flush=True)
