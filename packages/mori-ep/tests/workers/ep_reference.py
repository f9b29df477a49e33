# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""What the CPU and CUDA dispatch/combine workers share: the routing kinds, token
counts, all-gathers of every rank's inputs, the "expert" whose outputs combine sums
(a worker starts with mori.core.testing.start_rank). Imported by the workers beside
it (run as scripts, so this file sits on sys.path beside them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

FP8 = torch.float8_e4m3fn
ROUTINGS = ["random", "zero", "one_expert", "one_rank", "round_robin", "one_token", "max", "dup"]


def op_config(rank, world, hidden, m, epr, k, dtype, **kw):
    """The tests' EpDispatchCombineConfig: ``dtype`` tokens (fp8: one fp32 scale per 128
    columns), ``m`` tokens per rank, ``epr`` experts per rank, top-``k``; ``kw`` sets
    the rest (kernel type, gpu_per_node, quant type)."""
    from mori.ep import EpDispatchCombineConfig

    return EpDispatchCombineConfig(
        rank=rank,
        world_size=world,
        hidden_dim=hidden,
        scale_dim=hidden // 128 if dtype == FP8 else 0,
        scale_type_size=4,
        max_token_type_size=2,
        max_num_inp_token_per_rank=m,
        num_experts_per_rank=epr,
        num_experts_per_token=k,
        data_type=dtype,
        **kw,
    )


def sum_start(has_part: torch.Tensor, cols: int) -> torch.Tensor:
    """Where combine's fp32 sums start, per token (row): -0.0, the identity of addition,
    for a token with a part (``has_part``, bool [n]), +0.0 for one with none."""
    start = torch.where(has_part, -0.0, 0.0).to(torch.float32)
    return start[:, None].expand(-1, cols).clone()


def to_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``, except that fp8 e4m3fn saturates at +-448 as the kernels convert
    (CUDA's __NV_SATFINITE, MORI's default): torch's own conversion of magnitudes past
    448 changed between versions (NaN in 2.11, saturation in 2.13). Clamping keeps NaN."""
    if dtype == FP8:
        return t.float().clamp(-448.0, 448.0).to(FP8)
    return t.to(dtype)


def factor(d: int) -> float:
    """Rank d's "experts" scale its rows by this."""
    return 1.0 + 0.375 * d


def expert(x: torch.Tensor, scales: torch.Tensor | None, d: int) -> torch.Tensor:
    """What rank d's experts return for received rows: bf16 of dequant(x) * factor."""
    xf = x.float()
    if scales is not None:
        xf = xf * scales.repeat_interleave(128, dim=1)
    return (xf * factor(d)).to(torch.bfloat16)


class Routing:
    """Inputs of one rank: `world` ranks, `m` max tokens, `epr` experts per rank, top-`k`."""

    def __init__(self, world: int, rank: int, m: int, epr: int, k: int):
        self.world, self.rank, self.m, self.epr, self.k = world, rank, m, epr, k
        self.e = epr * world

    def routing(self, kind: str, n: int, gen: torch.Generator, it: int) -> torch.Tensor:
        k, e, epr = self.k, self.e, self.epr
        if kind == "random":
            idx = torch.rand(n, e, generator=gen).topk(k, dim=1).indices.to(torch.int32)
            idx[torch.rand(n, k, generator=gen) < 0.2] = -1
            return idx
        idx = torch.full((n, k), -1, dtype=torch.int32)
        if kind == "one_expert":
            idx[:, 0] = it % e
        elif kind == "one_rank":
            r = it % self.world
            idx[:] = torch.arange(r * epr, r * epr + k, dtype=torch.int32)
        elif kind == "round_robin":
            for t in range(n):
                idx[t] = torch.tensor([(t + j * epr) % e for j in range(k)], dtype=torch.int32)
        elif kind == "dup":  # the same expert twice, and a token with no expert at all
            idx[:, 0] = idx[:, 1] = (torch.arange(n) * 3 % e).to(torch.int32)
            if n:
                idx[0] = -1
        else:  # zero / one_token / max: random routing, the count is what varies
            return self.routing("random", n, gen, it)
        return idx

    def num_tokens(self, kind: str, gen: torch.Generator, it: int) -> int:
        m = self.m
        if kind == "zero":
            if (self.rank + it) % 2 == 0:
                return 0
            return int(torch.randint(1, m + 1, (1,), generator=gen))
        if kind == "one_token":
            return 1
        if kind == "max":
            return m
        return int(torch.randint(0, m + 1, (1,), generator=gen))

    def gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """All-gather a CPU [m, ...] tensor through an int32 view (gloo-safe dtypes)."""
        m = self.m
        raw = t.contiguous().view(torch.uint8).reshape(m, -1)
        cols = raw.size(1)
        raw = torch.nn.functional.pad(raw, (0, (-cols) % 4)).view(torch.int32)
        outs = [torch.empty_like(raw) for _ in range(self.world)]
        dist.all_gather(outs, raw)
        return [
            o.view(torch.uint8)[:, :cols].contiguous().view(t.dtype).reshape(t.shape) for o in outs
        ]

    def padded(self, t: torch.Tensor, n: int, fill: int = 0) -> torch.Tensor:
        """t's n rows, padded to m rows (for all-gathers of equal shapes)."""
        p = torch.zeros((self.m, *t.shape[1:]), dtype=torch.uint8 if t.dtype == FP8 else t.dtype)
        p = p.view(FP8) if t.dtype == FP8 else p.fill_(fill)
        p[:n] = t
        return p


def blockwise_quantize(rows: torch.Tensor, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MORI's fp8_blockwise quantization of bf16 rows [n, hidden]: fp8 [n, hidden] and
    fp32 scales [n, blocks]. Blocks of ceil(hidden / blocks) columns (the last short,
    any past the row empty); a block with amax <= 448 is cast as is (scale 1), a larger
    one as fp8(v * (448 / amax)) with scale amax * (1 / 448), in fp32."""
    n, hidden = rows.shape
    width = -(-hidden // blocks)
    x = torch.zeros(n, blocks * width)
    x[:, :hidden] = rows.float()
    x = x.view(n, blocks, width)
    amax = x.abs().amax(dim=2)
    scaled = amax > 448.0
    f448 = torch.tensor(448.0)
    inv = torch.where(scaled, f448 / amax, torch.ones(()))
    scale = torch.where(scaled, amax * (torch.tensor(1.0) / f448), torch.ones(()))
    q = (x * inv[:, :, None]).to(FP8).view(n, blocks * width)[:, :hidden]
    return q, scale


def blockwise_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 [n, hidden] times its block's scale, each product rounded to fp32."""
    n, hidden = q.shape
    width = -(-hidden // scale.size(1))
    return q.float() * scale.repeat_interleave(width, dim=1)[:, :hidden]
