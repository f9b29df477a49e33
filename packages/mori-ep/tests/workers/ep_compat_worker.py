# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the MORI-compatibility tests of dispatch/combine (CPU, host heap).

argv: seed. Each scenario uses MORI's call shapes and checks the result exactly;
prints "rank N ok" last.
  cap        max_total_recv_tokens: buffers sized by MORI's rule, a dispatch within
             the cap works, one past it fails on every rank with no data moved
  fp8        combine of fp8 e4m3 input (fp32 accumulation, one rounding to fp8) and
             quant_type="fp8_direct_cast" (bf16 rounded to fp8 before the reduction),
             both bit for bit against torch's own conversions, over every fp8 /
             bf16 bit pattern
  api        MORI's positional dispatch/combine arguments, weights=None, int64
             routing, combine(out, None, topk_ids), call_local_expert_count, the
             registered combine input buffer, decode_send_flat_idx
  srcpos     get_dispatch_src_token_pos uses MORI's flat send index (stride
             max_num_tokens_to_send()), so decode_send_flat_idx names the source
             rank and token of every received row
"""

import os
import sys

import torch
import torch.distributed as dist

import mori.core as mc
from mori.core import shmem
from mori.core.launch import expect_raises as expect
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp

seed = int(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")
shmem.init(device="cpu", heap_size="128M", timeout_s=60)
FP8 = torch.float8_e4m3fn
EPR, K = 2, 2
E = EPR * world


def config(dtype, hidden, m, **kw):
    # MORI's positional order: data_type, rank, world_size, hidden_dim, scale_dim,
    # scale_type_size, max_token_type_size, max_num_inp_token_per_rank,
    # num_experts_per_rank, num_experts_per_token, then keywords.
    return EpDispatchCombineConfig(dtype, rank, world, hidden, 0, 4, 2, m, EPR, K, **kw)


def to_self(n: int) -> torch.Tensor:
    """Routing that keeps every token on this rank (slot 1 unused)."""
    idx = torch.full((n, K), -1, dtype=torch.int32)
    idx[:, 0] = rank * EPR
    return idx


def run_cap() -> None:
    m, cap = 16, 10
    op = EpDispatchCombineOp(config(torch.bfloat16, 128, m, max_total_recv_tokens=cap))
    per_rank = min(-(-cap // world), m)
    assert op.max_num_tokens_to_recv() == world * per_rank
    assert op.max_num_tokens_to_recv_per_rank() == per_rank
    assert op.max_num_tokens_to_send() == world * m
    gen = torch.Generator().manual_seed(seed + rank)
    # Within the cap: every rank sends `per_rank` tokens to rank 0 only.
    x = torch.randn(per_rank, 128, generator=gen).to(torch.bfloat16)
    idx = torch.zeros(per_rank, K, dtype=torch.int32)
    idx[:, 1] = -1
    out, _, _, _, total = op.dispatch(x, None, None, idx)
    assert out.shape[0] == world * per_rank, out.shape
    assert int(total.item()) == (world * per_rank if rank == 0 else 0)
    cout, _ = op.combine(out, None, idx)
    assert torch.equal(cout, x)
    # One token more from rank 0: rank 0 would receive past its capacity, and every
    # rank fails the same call (each sees the same count matrix).
    extra = 1 if rank == 0 else 0
    x2 = torch.randn(per_rank + extra, 128, generator=gen).to(torch.bfloat16)
    idx2 = torch.zeros(per_rank + extra, K, dtype=torch.int32)
    idx2[:, 1] = -1
    expect(
        mc.InvalidArgumentError,
        f"dispatch would deliver {world * per_rank + 1} tokens to rank 0, more than the "
        f"receive capacity of {world * per_rank} rows",
        op.dispatch,
        x2,
        None,
        None,
        idx2,
    )
    out, _, _, _, total = op.dispatch(x, None, None, idx)  # still usable
    assert torch.equal(op.combine(out, None, idx)[0], x)
    op.close()


def to_fp8(t: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3fn as the kernels convert: round to nearest even, saturating at +-448
    (CUDA's __NV_SATFINITE, MORI's default). torch's own conversion of magnitudes past
    448 changed between versions (NaN in 2.11, saturation in 2.13): clamp first, which
    keeps NaN."""
    return t.clamp(-448.0, 448.0).to(FP8)


def run_fp8() -> None:
    # fp8 input: every fp8 bit pattern, each token kept on this rank and sent to the
    # next one too, so each output is fp8(a + b) of two fp8 values.
    m, hidden = 2, 256
    op = EpDispatchCombineOp(config(FP8, hidden, m))
    patterns = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    x = torch.stack([patterns, patterns.roll(37 * (rank + 1))]).view(FP8)
    idx = torch.tensor([[rank * EPR, ((rank + 1) % world) * EPR]] * m, dtype=torch.int32)
    out, _, _, _, total = op.dispatch(x, None, None, idx)
    total = int(total.item())
    cout, _ = op.combine(out[:total], None, idx)
    assert cout.dtype == FP8
    # Token t comes back from this rank and from the next one, the same bytes both
    # times: fp8(-0.0 + v + v), summed from -0.0 as the reduction does (README,
    # Semantics; so -0 + -0 gives -0).
    v = x.float()
    want = to_fp8(torch.full_like(v, -0.0) + v + (v if world > 1 else 0))
    got_bits, want_bits = cout.view(torch.uint8), want.view(torch.uint8)
    nan = torch.isnan(want.float())
    assert torch.equal(got_bits[~nan], want_bits[~nan]), "fp8 combine differs from torch"
    assert bool(torch.isnan(cout.float())[nan].all())
    op.close()

    # fp8_direct_cast: every bf16 bit pattern (256 tokens x 256 columns), each token
    # kept on this rank only, so the output is bf16(fp8(x)).
    m = 256
    op = EpDispatchCombineOp(config(torch.bfloat16, hidden, m, quant_type="fp8_direct_cast"))
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x.view(m, hidden)
    idx = to_self(m)
    out, _, _, _, total = op.dispatch(x, None, None, idx)
    cout, _ = op.combine(out[: int(total.item())], None, idx)
    want = (torch.full((m, hidden), -0.0) + to_fp8(x.float()).float()).to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(cout.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    assert bool(torch.isnan(cout)[nan].all())
    # Without the quant type the same call is exact.
    op.close()
    op = EpDispatchCombineOp(config(torch.bfloat16, hidden, m))
    out, _, _, _, total = op.dispatch(x, None, None, idx)
    cout, _ = op.combine(out[: int(total.item())], None, idx)
    # One part per token: its bytes come back, NaN payloads included.
    assert torch.equal(cout.view(torch.int16), x.view(torch.int16))
    op.close()


def run_api() -> None:
    m, hidden = 8, 128
    op = EpDispatchCombineOp(config(torch.bfloat16, hidden, m))
    gen = torch.Generator().manual_seed(seed * 7 + rank)
    n = 6
    x = torch.randn(n, hidden, generator=gen).to(torch.bfloat16)
    w = torch.rand(n, K, generator=gen)
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(n)]).to(torch.int64)
    # MORI's positional order: block_num, rdma_block_num, warp_per_block,
    # call_local_expert_count.
    out, out_w, out_s, out_idx, total = op.dispatch(x, w, None, idx, -1, -1, -1, True)
    assert out_s is None and out_idx.dtype == torch.int32
    total = int(total.item())
    recv = out_idx[:total]
    want = torch.zeros(EPR, dtype=torch.int32)
    for e in recv.flatten().tolist():
        if e // EPR == rank:
            want[e % EPR] += 1
    assert torch.equal(op.local_expert_count, want), (op.local_expert_count, want)
    # The expert writes straight into the registered combine input buffer.
    buf = op.get_registered_combine_input_buffer(torch.bfloat16)
    assert buf.shape == (op.max_num_tokens_to_recv(), hidden)
    assert op.get_registered_combine_input_buffer(torch.bfloat16) is buf
    torch.mul(out[:total], 3, out=buf[:total])
    # MORI's positional order: block_num, rdma_block_num, warp_per_block,
    # use_external_inp_buf, call_reset.
    cout, cw = op.combine(buf, out_w, idx, -1, -1, -1, 0, False)
    dests = [len({int(e) // EPR for e in row if e >= 0}) for row in idx]
    for t in range(n):
        assert torch.equal(cout[t], (x[t].float() * 3 * dests[t]).to(torch.bfloat16)), t
        assert torch.allclose(cw[t], w[t] * dests[t]), t
    assert op.decode_send_flat_idx(op.max_num_tokens_to_send() * 1 + 5) == (1, 5)
    op.reset()
    op.close()


def run_src_pos() -> None:
    m, hidden = 4, 64
    op = EpDispatchCombineOp(config(torch.bfloat16, hidden, m))
    # Token t of rank r carries 10 * r + t and goes to both ranks, so every rank
    # receives all world * m tokens; a stride of m instead of world * m would
    # decode rank 1's tokens as tokens m.. of rank 0.
    x = (torch.arange(m, dtype=torch.float32)[:, None] + 10 * rank).expand(m, hidden)
    idx = torch.tensor([[0, EPR]] * m, dtype=torch.int32)
    out, _, _, _, total = op.dispatch(x.to(torch.bfloat16), None, None, idx)
    pos = op.get_dispatch_src_token_pos()
    assert pos.dtype == torch.int32 and pos.numel() == int(total.item()) == world * m, pos
    assert pos.tolist() == [s * world * m + t for s in range(world) for t in range(m)], pos
    for i, p in enumerate(pos.tolist()):
        s, t = op.decode_send_flat_idx(p)
        assert (s, t) == (i // m, i % m) and out[i, 0].item() == 10 * s + t, (i, p, s, t)
    op.close()


run_cap()
run_fp8()
run_api()
run_src_pos()
dist.barrier()
print(f"rank {rank} ok", flush=True)
dist.destroy_process_group()
