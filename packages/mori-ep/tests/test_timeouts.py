# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The timeout rules (mori.core.timeouts) in mori-ep: inf and huge values mean
"practically forever", NaN, zero and negative values are refused naming the value."""

import math

import pytest
import torch

import mori.core as mc
import mori.ep as ep
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineOp

BAD = [(math.nan, "nan"), (0.0, "0"), (-1.0, "-1"), (-math.inf, "-inf")]


@pytest.mark.parametrize("huge", ["inf", "1e300", "1e10"])
def test_huge_timeouts_wait_for_a_late_rank(huge, run_workers):
    # Converted by hand before, inf expired at once ("within -9223372036854775808 ms").
    run_workers("ep_timeout_worker.py", huge, timeout_s=240)


@pytest.mark.parametrize(("bad", "text"), BAD)
def test_bad_timeouts_are_refused_naming_the_value(bad, text):
    cfg = EpDispatchCombineConfig(
        torch.bfloat16, rank=0, world_size=1, hidden_dim=128, scale_dim=0, scale_type_size=4,
        max_token_type_size=2, max_num_inp_token_per_rank=4, num_experts_per_rank=2,
        num_experts_per_token=2,
    )  # fmt: skip
    # Checked before anything collective (and before the heap is looked for).
    with pytest.raises(mc.InvalidArgumentError, match=f"timeout_s {text} must be > 0"):
        EpDispatchCombineOp(cfg, timeout_s=bad)


@pytest.mark.parametrize("cls", ["IntraNodeCpu", "LowLatencyCpu"])
@pytest.mark.parametrize(("bad", "text"), BAD)
def test_the_native_constructors_refuse_bad_timeouts(cls, bad, text):
    # The binding converts with mori-core's rule before the constructor sees the block.
    with pytest.raises(mc.InvalidArgumentError, match=f"timeout_s {text} must be > 0"):
        getattr(ep._C, cls)(1, 0, 4, 2, 128, 2, 0, 2, 0, -1, bad)
