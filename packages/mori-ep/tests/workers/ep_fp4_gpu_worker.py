# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the packed-fp4 test on the CUDA kernels (and, with placement "cpu", the
same checks on a host heap). argv: placement seed

For IntraNode, IntraNodeLL and AsyncLL, fresh random inputs each call:
  full  float4_e2m1fn_x2 rows of hidden_dim bytes dispatched: every received row, weight
        and scale equal to its source's bit for bit (the source from the table of every
        rank's inputs and dispatch's src positions); an fp4 combine is refused on every
        rank on a CUDA heap ("host heaps only"), and on a host heap gives each token's
        bytes back when it went to one rank.
  half  rows of hidden_dim / 2 bytes (hidden_dim e2m1 values) beside a bf16 combine of
        hidden_dim columns: rows bit for bit, and the combine of their values as bf16
        (exact) equal to each value times the token's destination ranks.
Prints "rank N ok" last; any failed check raises.
"""

import sys

import torch
import torch.distributed as dist

import mori.core as mc
from mori.core import shmem
from mori.core.dist_compat import all_gather_single
from mori.core.testing import start_rank
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

FP4 = torch.float4_e2m1fn_x2
placement, seed = sys.argv[1], int(sys.argv[2])
rank, world, dev = start_rank(placement, "512M", 60)
CUDA = dev.type == "cuda"
gen = torch.Generator().manual_seed(seed * 17 + rank)
print(f"rank {rank}: {placement}, seed {seed}", flush=True)
H, M, EPR, K, S = 1024, 16, 2, 3, 4
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def gather(t: torch.Tensor) -> list[torch.Tensor]:
    b = (t.view(torch.uint8) if t.dtype == FP4 else t).cpu().contiguous()
    pad = torch.zeros((M, *b.shape[1:]), dtype=b.dtype)
    pad[: b.size(0)] = b
    out = torch.zeros((world * M, *b.shape[1:]), dtype=b.dtype)
    all_gather_single(out, pad)
    return list(out.view(world, *pad.shape))


def values_bf16(b: torch.Tensor) -> torch.Tensor:
    """uint8 [n, B] -> bf16 [n, 2B]: the e2m1 values, low nibble first (exact)."""
    nib = torch.stack([b & 0xF, b >> 4], -1).long()
    mag = E2M1[nib & 7]
    return torch.where((nib & 8) != 0, -mag, mag).reshape(b.size(0), -1).to(torch.bfloat16)


def call(kind, op, *args, combine=False):
    if kind == EpDispatchCombineKernelType.AsyncLL:
        out = (op.combine_send if combine else op.dispatch_send)(*args)
        (op.combine_recv if combine else op.dispatch_recv)()
        return out
    return (op.combine if combine else op.dispatch)(*args)


def check_rows(op, x, sc, out, out_sc, total) -> list[tuple[int, int]]:
    ax, asc = gather(x), gather(sc) if sc is not None else None
    got = [op.decode_send_flat_idx(p) for p in op.get_dispatch_src_token_pos().tolist()]
    assert len(got) == total
    ob = out[:total].view(torch.uint8).cpu()
    for i, (s, t) in enumerate(got):
        assert torch.equal(ob[i], ax[s][t]), (i, s, t)
        if asc is not None:
            assert torch.equal(out_sc[i].cpu(), asc[s][t]), (i, s, t)
    return got


def routing(n: int) -> torch.Tensor:
    rows = [torch.randperm(EPR * world, generator=gen)[:K] for _ in range(n)]
    idx = torch.stack(rows).to(torch.int32)
    return torch.where(torch.rand(n, K, generator=gen) < 0.25, -1, idx).to(dev)


for kind in ("IntraNode", "IntraNodeLL", "AsyncLL"):
    kt = EpDispatchCombineKernelType[kind]
    for form in ("full", "half"):
        hidden = H if form == "full" else 2 * H
        cfg = EpDispatchCombineConfig(
            FP4, rank, world, hidden, S if form == "full" else 0, 4, 2, M, EPR, K, kernel_type=kt
        )
        op = EpDispatchCombineOp(cfg, timeout_s=30.0)
        for it in range(3):
            n = int(torch.randint(1, M + 1, (1,), generator=gen))
            xb = torch.randint(0, 256, (n, H), dtype=torch.uint8, generator=gen)
            x, idx = xb.to(dev).view(FP4), routing(n)
            sc = torch.randn(n, S, generator=gen).to(dev) if form == "full" else None
            out, out_w, out_sc, _, total = call(kt, op, x, None, sc, idx)
            sync()
            total = int(total.item())
            got = check_rows(op, x, sc, out, out_sc, total)
            ranks = [len({int(e) // EPR for e in idx[t].tolist() if e >= 0}) for t in range(n)]
            # a bf16 combine of the rows' values (half: all of them; full: the low nibbles)
            vals = values_bf16(out[:total].view(torch.uint8).cpu())
            vals = vals if form == "half" else vals[:, 0::2].contiguous()
            y, _ = call(kt, op, vals.to(dev), None, idx, combine=True)
            sync()
            src = values_bf16(xb) if form == "half" else values_bf16(xb)[:, 0::2]
            want = src.float() * torch.tensor(ranks, dtype=torch.float32)[:, None]
            assert torch.equal(y.cpu().float(), want), (kind, form, it)
        if form == "full":  # one more dispatch, then an fp4 combine
            n = 4
            xb = torch.randint(0, 256, (n, H), dtype=torch.uint8, generator=gen)
            idx = routing(n)
            sc = torch.randn(n, S, generator=gen).to(dev)
            out, _, _, _, total = call(kt, op, xb.to(dev).view(FP4), None, sc, idx)
            sync()
            total = int(total.item())
            if CUDA:
                try:
                    call(kt, op, out[:total], None, idx, combine=True)
                except mc.InvalidArgumentError as e:
                    assert "host heaps only" in str(e), str(e)
                else:
                    raise AssertionError("an fp4 combine on CUDA was not refused")
            else:
                y, _ = call(kt, op, out[:total], None, idx, combine=True)
                ranks = [len({int(e) // EPR for e in idx[t].tolist() if e >= 0}) for t in range(n)]
                one = [t for t in range(n) if ranks[t] == 1]
                assert torch.equal(y.view(torch.uint8)[one], xb[one]), (kind, one)
        print(f"rank {rank}: {kind} {form}: 3 calls bit for bit", flush=True)
        op.close()

shmem.finalize()
# The gloo group too: left to interpreter exit, its teardown can abort a rank whose
# peer has already gone ("terminate called without an active exception").
dist.destroy_process_group()
print(f"rank {rank} ok", flush=True)
