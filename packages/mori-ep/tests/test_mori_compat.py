# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ep as a drop-in for ROCm/mori's dispatch/combine API (mori.ops there).

The expectations are MORI's documented behaviour: its config's field order and
defaults, its quant and kernel type names and values, its receive-capacity rule, its
dispatch/combine argument order, and combine's ``indices`` being the caller's own
routing. The multi-process cases run on CPU (tests/workers/ep_compat_worker.py)."""

import dataclasses
from pathlib import Path

import pytest
import torch

import mori.core as mc
from mori.core.testing import new_seed, run_ranks
from mori.ep import (
    EpDispatchCombineConfig,
    EpDispatchCombineKernelType,
    EpDispatchCombineQuantType,
)

WORKER = str(Path(__file__).parent / "workers" / "ep_compat_worker.py")
FP8_CAP_WORKER = str(Path(__file__).parent / "workers" / "ep_fp8_cap_worker.py")

# ROCm/mori's EpDispatchCombineConfig, in order, with its defaults.
MORI_FIELDS = [
    ("data_type", dataclasses.MISSING),
    ("rank", dataclasses.MISSING),
    ("world_size", dataclasses.MISSING),
    ("hidden_dim", dataclasses.MISSING),
    ("scale_dim", dataclasses.MISSING),
    ("scale_type_size", dataclasses.MISSING),
    ("max_token_type_size", dataclasses.MISSING),
    ("max_num_inp_token_per_rank", dataclasses.MISSING),
    ("num_experts_per_rank", dataclasses.MISSING),
    ("num_experts_per_token", dataclasses.MISSING),
    ("warp_num_per_block", 8),
    ("block_num", 80),
    ("max_total_recv_tokens", 0),
    ("use_external_inp_buf", True),
    ("kernel_type", EpDispatchCombineKernelType.IntraNode),
    ("gpu_per_node", 8),
    ("rdma_block_num", 0),
    ("num_qp_per_pe", 1),
    ("quant_type", "none"),
]


def _positional(**kw):
    """A config with MORI's required fields passed positionally, the rest by name."""
    return EpDispatchCombineConfig(torch.bfloat16, 0, 2, 256, 0, 4, 2, 16, 4, 4, **kw)


def test_config_fields_are_moris_in_order_with_its_defaults():
    fields = [f for f in dataclasses.fields(EpDispatchCombineConfig) if not f.kw_only]
    assert [(f.name, f.default) for f in fields] == MORI_FIELDS
    c = EpDispatchCombineConfig(
        torch.float8_e4m3fn, 1, 2, 7168, 56, 4, 1, 128, 32, 8, 16, 64, 0, True,
        EpDispatchCombineKernelType.IntraNode, 8, 0, 1, "fp8_direct_cast",
    )  # fmt: skip
    assert (c.data_type, c.rank, c.hidden_dim, c.block_num) == (torch.float8_e4m3fn, 1, 7168, 64)
    assert c.quant == EpDispatchCombineQuantType.Fp8DirectCast


def test_kernel_and_quant_types_carry_moris_names_and_values():
    assert {k.name: int(k) for k in EpDispatchCombineKernelType} == {
        "IntraNode": 0, "InterNode": 1, "InterNodeV1": 2, "InterNodeV1LL": 3, "AsyncLL": 4,
        "IntraNodeLL": 5,
    }  # fmt: skip
    assert {q.name: int(q) for q in EpDispatchCombineQuantType} == {
        "None_": 0, "Fp8DirectCast": 1, "Fp8BlockwiseQuant": 2, "Fp4BlockwiseQuant": 3,
    }  # fmt: skip
    assert str(EpDispatchCombineKernelType.IntraNodeLL) == "IntraNodeLL"


@pytest.mark.parametrize("name", ["fp4_blockwise", "FP4_BLOCKWISE"])
def test_fp4_blockwise_config_is_made_its_combine_refused_later(name):
    # MORI makes the config (its inter-node tests build one) and refuses the combine;
    # tests/test_fp4.py checks the refusal on every rank.
    assert _positional(quant_type=name).quant == EpDispatchCombineQuantType.Fp4BlockwiseQuant


def test_unknown_quant_type_is_a_value_error():
    with pytest.raises(ValueError, match="quant_type 'fp16_cast' is not one of"):
        _positional(quant_type="fp16_cast")
    for ok in ("none", "fp8_direct_cast", " NONE ", EpDispatchCombineQuantType.Fp8DirectCast,
               "fp8_blockwise"):  # fmt: skip
        _positional(quant_type=ok)


@pytest.mark.parametrize(
    ("cap", "per_rank", "recv"),
    [(0, 16, 32), (10, 5, 10), (11, 6, 12), (100, 16, 32), (1, 1, 2)],
)
def test_receive_capacity_follows_moris_rule(cap, per_rank, recv):
    c = _positional(max_total_recv_tokens=cap)
    assert (c.max_num_tokens_to_recv_per_rank, c.max_num_tokens_to_recv) == (per_rank, recv)
    assert (c.max_num_tokens_to_send_per_rank, c.max_num_tokens_to_send) == (16, 32)


def test_bad_cap_names_the_value():
    with pytest.raises(mc.InvalidArgumentError, match="max_total_recv_tokens -1 must be"):
        _positional(max_total_recv_tokens=-1)


def test_compat_scenarios_on_cpu_at_world_2():
    run_ranks([WORKER, str(new_seed())], 2, timeout_s=240)


def test_fp8_combine_and_cap_on_cpu_at_world_2():
    """The scenarios the CUDA kernels are checked with (test_fp8_cap_gpu.py), on the CPU
    implementation: the references they use hold for it bit for bit."""
    run_ranks([FP8_CAP_WORKER, "cpu", str(new_seed())], 2, timeout_s=240)
