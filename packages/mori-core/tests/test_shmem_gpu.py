# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""CUDA symmetric heap among real processes: 2 processes on 1 GPU and 1 process
per GPU on every visible GPU (peer views, host and kernel put/get at each scope, data-then-
flag stress, barrier_on_stream in a CUDA graph, handle-type fallback).

Skipped without a CUDA GPU or a libmori_core built without CUDA. Each scenario
runs in fresh worker processes (tests/workers/shmem_gpu_worker.py) with a bounded
wall time, so a hang fails the test instead of CI.
"""

from pathlib import Path

import pytest

import mori.core as mc
from mori.core.testing import new_seed, require_cuda, run_ranks

torch = pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "shmem_gpu_worker.py")


def _run(mode: str, placement: str, world: int, *extra: str, timeout_s: float = 420):
    return run_ranks(
        [WORKER, mode, placement, str(new_seed()), *extra], world, timeout_s=timeout_s,
        env={"MORI_LOG_LEVEL_SHMEM": "info"}, who="pe",
    )  # fmt: skip


def test_one_process_per_gpu():
    """Every visible GPU takes part (2, 4 or 8 pes on the machines we use)."""
    n = require_cuda(min_gpus=2)
    _run("suite", "per_gpu", n, "20000", timeout_s=180 + 30 * n)


def test_handle_type_fallback_and_override():
    n = require_cuda()
    results = _run("handle", "per_gpu" if n >= 2 else "shared", 2, timeout_s=120)
    out = results[0].output
    assert "MORI_SHMEM_HANDLE=auto: handle_type=" in out
    assert "MORI_SHMEM_HANDLE=posix_fd: handle_type=posix_fd" in out
    assert "forced fabric refused" in out or "forced fabric accepted" in out


def test_two_processes_one_gpu():
    require_cuda()
    _run("suite", "shared", 2, "10000", timeout_s=200)


def test_diag_kernels_refuse_without_heap():
    # Bound in every build; before init they raise instead of launching on a missing
    # context. A build without CUDA refuses either way (which check comes first
    # differs between the two entry points).
    if mc.build_info().get("with_cuda"):
        error, match = mc.InvalidStateError, "not initialized"
    else:
        error = (mc.InvalidStateError, mc.NotSupportedError)
        match = "not initialized|built without CUDA"
    with pytest.raises(error, match=match):
        mc._C._shmem_barrier_loop(1, 0)
    with pytest.raises(error, match=match):
        mc._C._shmem_put_kernel(0, 0, 16, 0, "block", 1, 64, 0)
