# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""EpDispatchCombineOp on CPU among real processes (host symmetric heap, gloo)."""

from pathlib import Path

import pytest
import torch

import mori.core as mc
from mori.core.testing import new_seed, run_ranks
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineKernelType, EpDispatchCombineOp

WORKER = str(Path(__file__).parent / "workers" / "ep_worker.py")


def _run(mode, world, *extra, timeout_s=120):
    return run_ranks([WORKER, mode, str(new_seed()), *extra], world, timeout_s=timeout_s)


@pytest.mark.parametrize(("world", "iters"), [(2, 50), (4, 16), (8, 8)])
def test_dispatch_combine_matches_reference(world, iters):
    # `iters` calls per dtype (bf16, fp8) on one op, each with fresh inputs, cycling
    # through every routing kind: 50 at world 2 to catch races (4 and 8 processes share
    # 2 cores in CI: fewer calls there).
    results = _run("random", world, str(iters))
    print("\n".join(r.output.strip().splitlines()[-2] for r in results))


def test_validation_errors_reach_every_rank():
    _run("errors", 3)


def test_a_timed_out_op_refuses_later_calls():
    _run("timeout", 2, timeout_s=60)


def _config(**kw):
    base = dict(
        data_type=torch.bfloat16,
        rank=0,
        world_size=2,
        hidden_dim=256,
        scale_dim=0,
        scale_type_size=4,
        max_token_type_size=2,
        max_num_inp_token_per_rank=16,
        num_experts_per_rank=4,
        num_experts_per_token=4,
    )
    base.update(kw)
    return EpDispatchCombineConfig(**base)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(rank=2), "rank 2 out of range [0, world_size 2)"),
        (dict(world_size=0), "world_size 0 must be a positive int"),
        (dict(hidden_dim=-1), "hidden_dim -1 must be a positive int"),
        (dict(max_token_type_size=3), "max_token_type_size 3 must be 1, 2 or 4"),
        (dict(scale_dim=-1), "scale_dim -1 must be an int >= 0"),
        (dict(scale_dim=2, scale_type_size=3), "scale_type_size 3 must be 1, 2 or 4"),
        (dict(num_experts_per_token=9), "num_experts_per_token 9 exceeds the 8 experts"),
        (
            dict(max_num_inp_token_per_rank=1 << 20),
            "max_num_inp_token_per_rank 1048576 exceeds 1048574",
        ),
        (dict(device="tpu"), "device 'tpu' must be 'cpu', 'cuda' or None"),
    ],
)
def test_config_errors_name_the_value(kw, message):
    with pytest.raises(mc.InvalidArgumentError) as e:
        _config(**kw)
    assert message in str(e.value)


def test_config_keeps_mori_fields_and_defaults():
    c = _config()
    assert (c.warp_num_per_block, c.block_num, c.kernel_type) == (
        8,
        80,
        EpDispatchCombineKernelType.IntraNode,
    )
    assert c.num_experts == 8 and c.max_num_out_tokens == 32
    assert c.data_type == torch.bfloat16


def test_op_needs_shmem():
    with pytest.raises(mc.InvalidStateError, match=r"needs mori.core.shmem.init\(\) first"):
        EpDispatchCombineOp(_config())
