# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ccl.Communicator's CUDA kernels among real processes: 2 processes on one GPU,
one process per visible GPU (2, 4 or 8), world 1, a CUDA graph, and the failures only
the device sees (an absent rank, calls that differ, a rejected input, splits that do
not pair up), each ending in a trap that names it within the timeout.

Skipped without a CUDA GPU or a mori build without CUDA. Each scenario runs in fresh
worker processes (tests/workers/ccl_gpu_worker.py, ccl_trap_worker.py) with a bounded
wall time.
"""

import re
from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks, seconds_of, trap_outcomes

WORKERS = Path(__file__).parent / "workers"


def _run(mode: str, placement: str, world: int, iters: int, timeout_s: float = 300):
    argv = [WORKERS / "ccl_gpu_worker.py", mode, placement, str(new_seed()), str(iters)]
    return run_ranks(argv, world, timeout_s=timeout_s)


def test_world_one(cuda_gpus):
    _run("random", "shared", 1, 40)


def test_two_processes_one_gpu(cuda_gpus):
    # Every collective, algorithm, dtype and op (10 x 4 x 3 = 120 calls cover them).
    _run("random", "shared", 2, 240)


def test_one_process_per_gpu(cuda_gpus):
    if cuda_gpus < 2:
        pytest.skip("needs 2 GPUs")
    _run("random", "per_gpu", cuda_gpus, 480, timeout_s=300 + 30 * cuda_gpus)


def test_one_shot_ll(cuda_gpus):
    # Apart from the other algorithms, so that a failure of one says which.
    _run("ll", "per_gpu" if cuda_gpus >= 2 else "shared", 2, 120)


def test_zero_copy_inputs(cuda_gpus):
    # Symmetric inputs read in place: every SM algorithm, in and out of place, per-rank
    # offsets, bit for bit against the staged path and the reference; back-to-back
    # calls overwriting the input right after each call; a CUDA graph.
    _run("zero_copy", "per_gpu" if cuda_gpus >= 2 else "shared", 2, 144)


def test_cuda_graph_replays(cuda_gpus):
    _run("graph", "per_gpu" if cuda_gpus >= 2 else "shared", 2, 12)


def _outcomes(case: str, gpus: int) -> list[tuple[str, str]]:
    return trap_outcomes(WORKERS / "ccl_trap_worker.py", case, gpus)


def test_an_absent_rank_traps_naming_it(cuda_gpus):
    (o0, out0), (o1, _) = _outcomes("absent_peer", cuda_gpus)
    assert o0.startswith("CUDA error"), o0
    assert "all_reduce (call 2) on rank 0: rank 1 did not arrive within 3000 ms" in out0, out0
    assert seconds_of(o0) < 30, o0
    assert o1 == "stayed away"


def test_calls_that_differ_trap_on_both_ranks_naming_both(cuda_gpus):
    outcomes = _outcomes("mismatch", cuda_gpus)
    for o, out in outcomes:
        assert o.startswith("CUDA error"), o
        assert "ranks disagree" in out, out
        assert "rank 0 calls all_reduce of 400 bytes of float32" in out, out
        assert "rank 1 calls all_reduce of 384 bytes of float32" in out, out
        assert seconds_of(o) < 3.0, o  # at once, not after the timeout


def test_a_rejected_input_raises_there_and_traps_the_peer(cuda_gpus):
    (o0, _), (o1, out1) = _outcomes("host_reject", cuda_gpus)
    assert o0.startswith("InvalidArgumentError"), o0
    assert "has 4100 bytes, more than the communicator's max_bytes 4096" in o0, o0
    assert o1.startswith("CUDA error"), o1
    assert "all_reduce (call 2) on rank 1: rejected by rank 0" in out1, out1


def test_a_zero_copy_input_beside_a_staged_one_traps_on_both_ranks(cuda_gpus):
    # Whether the input is read in place is part of the call's descriptor.
    outcomes = _outcomes("zero_copy_mismatch", cuda_gpus)
    for o, out in outcomes:
        assert o.startswith("CUDA error"), o
        assert "ranks disagree" in out, out
        assert re.search(
            r"rank 0 calls all_reduce of 400 bytes .*symmetric \(zero-copy\) input", out
        )
        assert re.search(r"rank 1 calls all_reduce of 400 bytes .*staged input", out), out
        assert seconds_of(o) < 3.0, o


def test_splits_that_do_not_pair_up_trap_on_both_ranks(cuda_gpus):
    for o, out in _outcomes("splits", cuda_gpus):
        assert o.startswith("CUDA error"), o
        assert "splits disagree: rank 1 sends 1 rows to rank 0, which expects 2 rows" in out, out


def test_mori_sdma_adapters_on_the_copy_engines(cuda_gpus):
    placement = "per_gpu" if cuda_gpus >= 2 else "shared"
    run_ranks([WORKERS / "sdma_worker.py", placement, str(new_seed())], 2, timeout_s=240)
