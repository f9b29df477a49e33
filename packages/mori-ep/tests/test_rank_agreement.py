# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Ranks that disagree are told so, on every rank, within the op's timeout: configs
compared when the op is built, token dtypes in dispatch's count exchange and in
combine's group words, the low-latency kernel types' per-call wire tags in their
flags, and whether each rank combines weights (CPU implementation, real processes at world 2,
the weights also at 4; tests/workers/ep_mismatch_worker.py; the CUDA kernels' traps:
test_device_traps_gpu.py)."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = Path(__file__).parent / "workers" / "ep_mismatch_worker.py"


def test_ranks_building_different_configs_raise_on_every_rank(run_workers):
    run_workers("ep_mismatch_worker.py", "config", timeout_s=120)


def test_ranks_dispatching_different_dtypes_fail_the_call_on_every_rank(run_workers):
    run_workers("ep_mismatch_worker.py", "dtype", timeout_s=120)


def test_ranks_combining_different_dtypes_fail_the_call_on_every_rank(run_workers):
    run_workers("ep_mismatch_worker.py", "combine", timeout_s=120)


def test_low_latency_ranks_of_other_dtypes_or_layouts_fail_the_call_on_every_rank(run_workers):
    run_workers("ep_mismatch_worker.py", "ll", timeout_s=180)


def test_expert_major_ranks_of_other_dtypes_or_casts_fail_the_call_on_every_rank(run_workers):
    # dispatch_standard_moe's bf16 / fp16 / fp32 / fp8 rows and DeepEP's cast with and
    # without round_scale travel under their own wire tags.
    run_workers("ep_mismatch_worker.py", "expert", timeout_s=180)


def test_low_latency_combine_refuses_a_stale_handle_on_every_rank(run_workers):
    # The handle of an earlier dispatch (or of another op) once returned other tokens'
    # rows; it now fails that combine on every rank, naming both dispatches.
    run_workers("ep_mismatch_worker.py", "stale", timeout_s=180)


@pytest.mark.parametrize("kind", ["IntraNode", "IntraNodeLL", "AsyncLL"])
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_combining_with_and_without_weights_fail_the_call_on_every_rank(kind, world):
    # A rank returns weights with its rows only when its own call combines weights, so
    # a rank asking for them beside one passing None would read an earlier call's: the
    # call fails on every rank naming the other rank and what each passes, then works.
    run_ranks([WORKER, "weights", kind, str(new_seed())], world, timeout_s=180)
