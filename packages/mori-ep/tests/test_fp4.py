# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Packed fp4 (torch.float4_e2m1fn_x2) dispatch and combine on CPU among real processes
(tests/workers/ep_fp4_worker.py), on every kernel type: rows moved bit for bit, combine
summed as MORI's combine of its fp4 type, a rank passing another dtype named on every
rank, quant_type fp4_blockwise refused at combine."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "ep_fp4_worker.py")
INTRA = ["IntraNode", "IntraNodeLL", "AsyncLL"]
INTER = ["InterNode", "InterNodeV1", "InterNodeV1LL"]


def _run(scenario, kind, world, local, iters=4, timeout_s=240):
    argv = [WORKER, scenario, str(new_seed()), kind, str(local), str(iters)]
    run_ranks(argv, world, timeout_s=timeout_s)


@pytest.mark.parametrize("kind", INTRA)
def test_intra_node_kinds_bit_for_bit(kind):
    _run("bits", kind, 2, 2)


@pytest.mark.parametrize("kind", INTER)
@pytest.mark.parametrize(("world", "local"), [(2, 1), (4, 2)])
def test_inter_node_kinds_bit_for_bit(kind, world, local):
    # world 4 = 2 nodes x 2: V1 forwards through the gateway and sums one partial per node
    _run("bits", kind, world, local, iters=3)


@pytest.mark.parametrize(
    ("kind", "local"), [("IntraNode", 2), ("IntraNodeLL", 2), ("InterNodeV1", 1)]
)
def test_half_width_rows_beside_a_wider_combine(kind, local):
    # MORI's fp4 dispatch + bf16 combine: config hidden_dim = combine columns, fp4 rows of
    # hidden_dim / 2 bytes; the two fp4 widths on two ranks are named like two dtypes.
    _run("half", kind, 2, local, iters=3)


@pytest.mark.parametrize(("kind", "local"), [("IntraNode", 2), ("AsyncLL", 2), ("InterNodeV1", 1)])
def test_a_rank_passing_another_dtype_is_named_on_every_rank(kind, local):
    _run("mismatch", kind, 2, local)


@pytest.mark.parametrize(
    ("kind", "local"), [("IntraNode", 2), ("IntraNodeLL", 2), ("InterNodeV1LL", 1)]
)
def test_fp4_blockwise_config_is_made_and_its_combine_refused(kind, local):
    _run("fp4bw", kind, 2, local)


def test_the_cuda_tests_checks_hold_on_a_host_heap():
    # test_fp4_gpu.py's worker with a host heap: on a GPU it then tests the kernels
    run_ranks([str(Path(__file__).parent / "workers" / "ep_fp4_gpu_worker.py"), "cpu",
               str(new_seed())], 2, timeout_s=300)  # fmt: skip
