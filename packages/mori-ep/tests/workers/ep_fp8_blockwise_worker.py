# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the fp8_blockwise combine tests (CPU implementation, host heap).

argv: seed. Per kernel type (IntraNode, IntraNodeLL, AsyncLL) and shape (hidden 7168
with MORI's default 56 scale blocks of 128 columns; hidden 256 with 56 blocks of 5
columns, the last of 1 and four empty; hidden 256 with MORI_FP8_COMBINE_SCALE_DIM=2,
blocks of 128):
  ref     random routings (-1 slots, tokens with no expert); every part a rank returns
          is a row of a table every rank builds from the seed, with blocks of every
          magnitude (all zero, subnormal in e4m3, below 448, far above it, so both
          MORI's unscaled and scaled blocks occur). The output equals, bit for bit,
          the torch reference below (quantize per block, dequantize, fp32 sum in
          ascending rank order, bf16), and is within the tolerance derived from e4m3's
          rounding of the exact fp32 sum of the bf16 parts. Weights combine exactly.
  wire    (IntraNode) what a peer writes into this rank's combine slot is the fp8 row
          and its fp32 scales, BlockwiseRowBytes = align4(hidden) + 4 * blocks bytes
          (7392 of the bf16 row's 14336 at hidden 7168: 51.6 %), and nothing past it.
  tags    a rank whose combine sends fp8_blockwise rows while the other sends bf16
          fails on every rank, each naming both wire formats.
  narrow  rows whose wire size exceeds the combine slot (hidden 64) fail the combine
          on every rank naming both sizes; the op keeps working.
Before them: ops whose configs differ in the quant type or the scale blocks
(MORI_FP8_COMBINE_SCALE_DIM) fail on every rank naming both values.
Prints "rank N ok" last; any failed check raises.
"""

import os
import sys

import torch
import torch.distributed as dist
from ep_reference import blockwise_dequantize as dequantize
from ep_reference import blockwise_quantize as quantize

from mori.core import InvalidArgumentError, shmem
from mori.core.testing import start_rank
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

seed = int(sys.argv[1])
rank, world, dev = start_rank("cpu", "512M", 60)
EPR, K, M = 2, 3, 6
E = EPR * world
KINDS = ("IntraNode", "IntraNodeLL", "AsyncLL")
SHAPES = ((7168, None), (256, None), (256, "2"))  # (hidden, MORI_FP8_COMBINE_SCALE_DIM)


def make_op(kind: str, hidden: int, scale_env: str | None, quant="fp8_blockwise"):
    os.environ.pop("MORI_FP8_COMBINE_SCALE_DIM", None)
    if scale_env is not None:
        os.environ["MORI_FP8_COMBINE_SCALE_DIM"] = scale_env
    cfg = EpDispatchCombineConfig(
        torch.bfloat16, rank, world, hidden, 0, 4, 2, M, EPR, K,
        kernel_type=EpDispatchCombineKernelType[kind], quant_type=quant,
    )  # fmt: skip
    return EpDispatchCombineOp(cfg, timeout_s=60)


def table(hidden: int, blocks: int) -> torch.Tensor:
    """bf16 [world (source), M, world (expert rank), hidden]: what expert rank d returns
    for token t of rank s; the same on every rank (seeded by the seed alone). Each
    block's magnitude is one of 0 (an all-zero block), 2^-12 (e4m3 subnormals), 1, 300
    (below 448), 2000 and 3e4 (scaled)."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-hidden // blocks)
    mags = torch.tensor([0.0, 2.0**-12, 1.0, 300.0, 2000.0, 3e4])
    pick = torch.randint(0, len(mags), (world, M, world, blocks), generator=gen)
    mag = mags[pick].repeat_interleave(width, dim=3)[..., :hidden]
    return (torch.randn(world, M, world, hidden, generator=gen) * mag).to(torch.bfloat16)


def routing(gen: torch.Generator) -> torch.Tensor:
    """Random top-K expert ids with -1 slots; token 0 has no expert."""
    idx = torch.rand(M, E, generator=gen).topk(K, dim=1).indices.to(torch.int32)
    idx[torch.rand(M, K, generator=gen) < 0.3] = -1
    idx[0] = -1
    return idx


def dispatch(op, kind, x, w, idx):
    """dispatch, or AsyncLL's dispatch_send + dispatch_recv (the outputs fill in place)."""
    if kind != "AsyncLL":
        return op.dispatch(x, w, None, idx)
    outs = op.dispatch_send(x, w, None, idx)
    op.dispatch_recv()
    return outs


def combine(op, kind, y, w, idx):
    """combine, or AsyncLL's combine_send + combine_recv."""
    if kind != "AsyncLL":
        return op.combine(y, w, idx)
    outs = op.combine_send(y, w, idx)
    op.combine_recv()
    return outs


def gather(t: torch.Tensor) -> list[torch.Tensor]:
    outs = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(outs, t.contiguous())
    return outs


def run_ref(kind: str, hidden: int, scale_env: str | None) -> None:
    op = make_op(kind, hidden, scale_env)
    S = op._fp8_blockwise_combine_scale_dim
    assert S == (56 if scale_env is None else int(scale_env)), S
    tab = table(hidden, S)
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    for it in range(3):
        tag = f"{kind} hidden {hidden} blocks {S} call {it}"
        idx = routing(gen)
        w = torch.rand(M, K, generator=gen)
        # Row t of rank s carries (s, t) in its first two columns (exact in bf16).
        x = torch.zeros(M, hidden, dtype=torch.bfloat16)
        x[:, 0] = rank
        x[:, 1] = torch.arange(M, dtype=torch.float32)
        if kind == "IntraNode" and it == 0:  # marks check_wire looks for
            op._mode.block[op._mode.layout["comb_tokens"] :][: world * M * hidden * 2].fill_(0xAB)
        out, out_w, _, _, total = dispatch(op, kind, x, w, idx)
        total = int(total.item())
        src = out[:total].view(torch.bfloat16)[:, :2].float().to(torch.int64)
        y = (
            tab[src[:, 0], src[:, 1], rank]
            if total
            else torch.empty(0, hidden, dtype=torch.bfloat16)
        )
        got, got_w = combine(op, kind, y.contiguous(), out_w[:total], idx)

        # The reference: for each of my tokens, the parts of the ranks it went to,
        # ascending, quantized and dequantized, summed in fp32 from -0.0; no part: 0.
        want = torch.zeros(M, hidden)
        want_w = torch.zeros(M, K)
        exact = torch.zeros(M, hidden)
        tol = torch.zeros(M, hidden)
        for t in range(M):
            dests = sorted({int(e) // EPR for e in idx[t] if e >= 0})
            if not dests:
                continue
            want[t] = -0.0
            want_w[t] = w[t] if len(dests) == 1 else -0.0
            for d in dests:
                part = tab[rank, t, d][None]
                q, s = quantize(part, S)
                want[t] += dequantize(q, s)[0]
                exact[t] += part[0].float()
                # e4m3 keeps 3 mantissa bits: a normal value comes back within 2^-4
                # of itself (relative), a subnormal one (below 2^-6 after scaling)
                # within 2^-10 (absolute, times the block's scale); the fp32 scaling,
                # products and sums add less than 2^-20 relative.
                sw = s.repeat_interleave(-(-hidden // S), dim=1)[0, :hidden]
                tol[t] += part[0].float().abs() * (2.0**-4 + 2.0**-20) + sw * 2.0**-10
                if len(dests) > 1:
                    want_w[t] += w[t]
        want_bf16 = want.to(torch.bfloat16)
        assert got.shape == (M, hidden) and got.dtype == torch.bfloat16, (tag, got.shape)
        assert torch.equal(got.view(torch.int16), want_bf16.view(torch.int16)), (
            f"{tag}: {int((got.view(torch.int16) != want_bf16.view(torch.int16)).sum())} "
            "values differ from the torch reference"
        )
        # bf16 output rounding: half an ulp, 2^-9 relative.
        err = (got.float() - exact).abs()
        bound = tol + exact.abs() * 2.0**-9 + (tol * 2.0**-9)
        assert bool((err <= bound).all()), f"{tag}: max excess {float((err - bound).max())}"
        assert torch.equal(got_w, want_w), (tag, "weights")
        if kind == "IntraNode" and it == 0:
            check_wire(op, tab, idx, hidden, S, tag)
    op.close()


def check_wire(op, tab, idx, hidden, S, tag) -> None:
    """The last combine's rows in this rank's slots: fp8 bytes then fp32 scales,
    BlockwiseRowBytes of them, and the rest of each slot as it was (0xAB, written
    before the dispatch; no peer combines before this rank has dispatched)."""
    mode = op._mode
    hc = hidden * 2
    wire = -(-hidden // 4) * 4 + 4 * S
    comb = mode.block[mode.layout["comb_tokens"] :][: world * M * hc].view(world, M, hc)
    ids = [gather(idx)]  # every rank's routing: which slots its peers wrote
    for d in range(world):
        if d == rank:
            continue
        for t in range(M):
            if d not in {int(e) // EPR for e in ids[0][rank][t] if e >= 0}:
                continue
            q, s = quantize(tab[rank, t, d][None], S)
            slot = comb[d, t]
            assert torch.equal(slot[:hidden], q[0].view(torch.uint8)), (tag, "wire fp8", d, t)
            off = -(-hidden // 4) * 4
            assert torch.equal(slot[off:wire].view(torch.float32), s[0]), (tag, "scales", d, t)
            assert bool((slot[wire:] == 0xAB).all()), (tag, "bytes past the wire row", d, t)
    if rank == 0:
        print(f"{tag}: wire row {wire} bytes, bf16 row {hc} ({100 * wire / hc:.1f} %)")


def run_tags(kind: str) -> None:
    """Rank 0 combines as fp8_blockwise (the op built with 'none', its mode told to
    send blocks), the others bf16: every rank fails naming both."""
    hidden = 256
    op = make_op(kind, hidden, None, quant="none")
    if rank == 0:
        op._mode.config._combine_scale_dim = 56
    idx = torch.tensor([[rank * EPR, ((rank + 1) % world) * EPR, -1]] * M, dtype=torch.int32)
    x = torch.randn(M, hidden).to(torch.bfloat16)
    out, out_w, _, _, total = dispatch(op, kind, x, torch.rand(M, K), idx)
    try:
        combine(op, kind, out[: int(total.item())], None, idx)
    except InvalidArgumentError as e:
        msg = str(e)  # both wire formats: the blockwise one's name also starts "bfloat16"
        assert "(fp8_blockwise)" in msg and msg.count("bfloat16") >= 2, msg
    else:
        raise AssertionError(f"{kind}: a combine of mixed wire formats succeeded")
    op.close()


def run_config_mismatch() -> None:
    """Ranks built with different quant types or scale blocks fail, naming both values."""
    for quant, env, want in (
        ("fp8_blockwise" if rank == 0 else "none", None,
         "quant is Fp8BlockwiseQuant on rank 0 and None_ on rank"),
        ("fp8_blockwise", "28" if rank == 0 else "56",
         "combine_scale_dim is 28 on rank 0 and 56 on rank"),
    ):  # fmt: skip
        try:
            make_op("IntraNode", 7168, env, quant=quant)
        except InvalidArgumentError as e:
            assert want in str(e), str(e)
        else:
            raise AssertionError(f"ops of different configs were built: {want}")


def run_too_narrow(kind: str) -> None:
    """hidden 64 with 56 blocks: 64 fp8 bytes and 56 scales (288 bytes) do not fit the
    128-byte combine slot; the combine fails on every rank naming both sizes, and the
    op still works for a dispatch after it."""
    op = make_op(kind, 64, None)
    idx = torch.tensor([[rank * EPR, ((rank + 1) % world) * EPR, -1]] * M, dtype=torch.int32)
    x = torch.randn(M, 64).to(torch.bfloat16)
    for attempt in range(2):
        out, out_w, _, _, total = dispatch(op, kind, x, torch.rand(M, K), idx)
        assert int(total.item()) == M * min(world, 2), (kind, attempt)
        try:
            combine(op, kind, out[: int(total.item())], None, idx)
        except InvalidArgumentError as e:
            assert "fp8_blockwise rows of 288 bytes" in str(e) and "128" in str(e), str(e)
        else:
            raise AssertionError(f"{kind}: an fp8_blockwise row wider than its slot was sent")
    op.close()


run_config_mismatch()
for kind in KINDS:
    run_too_narrow(kind)
    for hidden, scale_env in SHAPES:
        run_ref(kind, hidden, scale_env)
    run_tags(kind)
    print(f"rank {rank}: {kind} ok")
os.environ.pop("MORI_FP8_COMBINE_SCALE_DIM", None)
shmem.barrier_all()
import gc  # noqa: E402

gc.collect()
shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
