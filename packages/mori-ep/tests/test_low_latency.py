# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The low-latency kernel types (IntraNodeLL, AsyncLL), the expert-major layout and
DeepEP's entry points on CPU among real processes (host symmetric heap, gloo)."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "ep_ll_worker.py")


def _run(mode, world, iters, timeout_s=120):
    run_ranks([WORKER, mode, str(new_seed()), str(iters)], world, timeout_s=timeout_s)


@pytest.mark.parametrize(("world", "iters"), [(2, 50), (4, 4)])  # 50 fresh-input calls
def test_token_major_matches_reference(world, iters):
    # MORI's IntraNodeLL / AsyncLL calls, bf16 and fp8, every routing kind, fresh inputs.
    _run("token", world, iters)


@pytest.mark.parametrize(("world", "iters"), [(2, 50), (4, 5)])  # 50 fresh-input calls
def test_expert_major_matches_deepep_oracle(world, iters):
    # low_latency_dispatch/combine in every cast variant, hooks, zero-copy, out=;
    # dispatch_standard_moe/combine_standard_moe; convert_dispatch_output/convert_combine_input.
    _run("expert", world, iters)


@pytest.mark.parametrize(("world", "iters"), [(2, 8), (4, 3)])
def test_receive_cap_at_under_and_over_capacity(world, iters):
    # MORI's max_total_recv_tokens: at the worst case, above it, below it (smaller
    # receive areas and outputs); every rank sending its P slots to every rank; every
    # routing within P tokens; a rank past its slots fails the call on every rank
    # naming it, the destination and both counts, and the op works after.
    _run("cap", world, iters)


@pytest.mark.parametrize("world", [2])
def test_low_latency_errors_reach_every_rank(world):
    _run("errors", world, 1)


def test_an_absent_peer_times_out_and_the_op_refuses_later_calls():
    _run("timeout", 2, 1, timeout_s=60)
