# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""get_dispatch_layout against a plain-Python reference, on CPU and (if present) CUDA."""

import pytest
import torch

import mori.core as mc
from mori.ep import get_dispatch_layout

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def reference(indices: torch.Tensor, num_experts: int, world: int):
    per_rank = num_experts // world
    tpr = [0] * world
    tpe = [0] * num_experts
    in_rank = [[False] * world for _ in range(indices.shape[0])]
    for t, row in enumerate(indices.tolist()):
        for e in row:
            if e == -1:
                continue
            tpe[e] += 1
            if not in_rank[t][e // per_rank]:
                in_rank[t][e // per_rank] = True
                tpr[e // per_rank] += 1
    return torch.tensor(tpr), torch.tensor(tpe), torch.tensor(in_rank, dtype=torch.bool)


def random_indices(gen, tokens, top_k, num_experts):
    # Distinct experts per token, as a router's top-k gives, with some slots unused.
    scores = torch.rand(tokens, num_experts, generator=gen)
    idx = scores.topk(top_k, dim=1).indices.to(torch.int32)
    drop = torch.rand(tokens, top_k, generator=gen) < 0.1
    idx[drop] = -1
    return idx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("tokens", "top_k", "num_experts", "world"),
    [
        (0, 8, 256, 8),
        (1, 1, 2, 2),
        (257, 8, 256, 8),
        (1000, 6, 64, 4),
        (64, 4, 16, 1),
    ],
)
def test_matches_reference(device, tokens, top_k, num_experts, world):
    seed = torch.seed()
    print(f"seed={seed}")
    gen = torch.Generator().manual_seed(seed)
    idx = (
        random_indices(gen, tokens, top_k, num_experts)
        if tokens
        else torch.empty((0, top_k), dtype=torch.int32)
    )
    tpr, tpe, in_rank = get_dispatch_layout(idx.to(device), num_experts, world)
    rtpr, rtpe, rin = reference(idx, num_experts, world)
    assert torch.equal(tpr.cpu(), rtpr.to(torch.int32))
    assert torch.equal(tpe.cpu(), rtpe.to(torch.int32))
    assert torch.equal(in_rank.cpu(), rin.reshape(tokens, world))


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_expert_names_value_token_and_slot(device):
    idx = torch.tensor([[0, 1], [2, -1], [3, 300]], dtype=torch.int32, device=device)
    with pytest.raises(
        mc.InvalidArgumentError, match=r"expert id 300 out of range \[-1, 256\) at token 2 slot 1"
    ):
        get_dispatch_layout(idx, 256, 8)
    idx[2, 1] = -2
    with pytest.raises(mc.InvalidArgumentError, match="expert id -2"):
        get_dispatch_layout(idx, 256, 8)


def test_shape_dtype_and_config_errors_are_named():
    with pytest.raises(mc.InvalidArgumentError, match="must be int32, got torch.int64"):
        get_dispatch_layout(torch.zeros(2, 2, dtype=torch.int64), 8, 2)
    with pytest.raises(mc.InvalidArgumentError, match=r"got shape \(4,\)"):
        get_dispatch_layout(torch.zeros(4, dtype=torch.int32), 8, 2)
    with pytest.raises(mc.InvalidArgumentError, match="num_experts 10 must be a positive multiple"):
        get_dispatch_layout(torch.zeros(2, 2, dtype=torch.int32), 10, 4)
