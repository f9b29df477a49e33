# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""CUDA symmetric heap among real processes: 2 processes on 1 GPU and 1 process
per GPU on every visible GPU (peer views, host and kernel put/get at each scope, data-then-
flag stress, barrier_on_stream in a CUDA graph, handle-type fallback).

Skipped without a CUDA GPU or a libmori_core built without CUDA. Each scenario
runs in fresh worker processes (tests/workers/shmem_gpu_worker.py) with a bounded
wall time, so a hang fails the test instead of CI.
"""

import random
from pathlib import Path

import pytest

import mori.core as mc
from mori.core.launch import NO_MULTICAST_ENV, launch_local

torch = pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "shmem_gpu_worker.py")


def _gpus() -> int:
    if not mc.build_info().get("with_cuda"):
        pytest.skip("libmori_core was built without CUDA")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    n = mc.build_info().get("cuda_device_count", 0)
    if n == 0:
        pytest.skip(f"no CUDA device: {mc.build_info().get('cuda_unavailable_reason')}")
    return n


def _seed() -> int:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    return seed


def _run(mode: str, placement: str, world: int, *extra: str, timeout_s: float = 420):
    env = dict(NO_MULTICAST_ENV)
    env["MORI_LOG_LEVEL_SHMEM"] = "info"
    results = launch_local(
        [WORKER, mode, placement, str(_seed()), *extra], world, timeout_s=timeout_s, env=env
    )
    for r in results:
        print(f"----- pe {r.rank} -----\n{r.output}")
        assert r.output.strip().endswith(f"pe {r.rank} ok"), r.output
    return results


def test_one_process_per_gpu():
    """Every visible GPU takes part (2, 4 or 8 pes on the machines we use)."""
    n = _gpus()
    if n < 2:
        pytest.skip("needs 2 GPUs")
    _run("suite", "per_gpu", n, "20000", timeout_s=180 + 30 * n)


def test_handle_type_fallback_and_override():
    n = _gpus()
    results = _run("handle", "per_gpu" if n >= 2 else "shared", 2, timeout_s=120)
    out = results[0].output
    assert "MORI_SHMEM_HANDLE=auto: handle_type=" in out
    assert "MORI_SHMEM_HANDLE=posix_fd: handle_type=posix_fd" in out
    assert "forced fabric refused" in out or "forced fabric accepted" in out


def test_two_processes_one_gpu():
    _gpus()
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
