# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The proxy with kernel producers over a CUDA heap: 2 processes on GPU 0, on two
emulated nodes (tcp, staged) and on one (mapped); a CPU producer's scatter of writes
through the same paths; a kernel waiting on a proxy whose peer died traps naming it.
Skipped without a CUDA GPU or a libmori_core built without CUDA."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, require_cuda, run_ranks, seconds_of, trap_outcomes

pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "proxy_gpu_worker.py")
TRAP_WORKER = str(Path(__file__).parent / "workers" / "proxy_trap_worker.py")
SCATTER_WORKER = str(Path(__file__).parent / "workers" / "proxy_scatter_worker.py")


@pytest.mark.parametrize("per_node", [1, 2], ids=["two-nodes-tcp", "one-node-mapped"])
def test_kernel_pushes_write_add_and_adds(per_node):
    require_cuda()
    run_ranks([WORKER, str(new_seed()), str(per_node)], 2, timeout_s=300, who="pe")


# runs: runs of 257..600 writes that continue on both sides or on one side only, so a
# run crosses the proxy's rounds and the TCP receiver merges consecutive copies.
@pytest.mark.parametrize("layout", ["scatter", "runs"])
@pytest.mark.parametrize("per_node", [1, 2], ids=["two-nodes-tcp", "one-node-mapped"])
def test_a_scatter_of_writes_through_the_staging_lands_bit_for_bit(per_node, layout):
    require_cuda()
    argv = [SCATTER_WORKER, str(new_seed()), str(per_node), "cuda", layout]
    run_ranks(argv, 2, timeout_s=300, who="pe")


def test_a_dead_peer_traps_the_pushing_kernel_naming_it():
    n = require_cuda()
    (outcome, output), (peer_outcome, _) = trap_outcomes(TRAP_WORKER, "dead_peer", n)
    assert peer_outcome == "left"
    assert outcome.startswith("CUDA error"), outcome
    assert seconds_of(outcome) < 10, outcome
    assert "mori.proxy queue 0 of pe 0" in output, output
    assert "pe 1 (node 'env:n1')" in output, output
