# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A group that spans hosts (emulated with MORI_SHMEM_NODE_ID): the host's part on
mori's host heap, the part between hosts through gloo. World 4 as 2 hosts x 2 ranks,
real processes, every result bit for bit with the two-level reference."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "hosts_worker.py")
# The workers see no GPU, so the heap they create is a host heap.
CPU_ENV = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("layout", ["blocked", "interleaved"])
def test_two_hosts_of_two_match_the_reference_bit_for_bit(layout):
    # Every collective, all-reduce algorithm, dtype and op (7 x 4 x 3 = 84 calls cycle
    # through them), then calls that differ across hosts, a rejected input and unpaired
    # splits, each failing every rank.
    run_ranks([WORKER, layout, str(new_seed()), "84"], 4, timeout_s=180, env=CPU_ENV)
