# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Fixtures shared by mori-ep's GPU tests."""

import pytest

from mori.core.testing import new_seed, require_cuda, run_ranks


@pytest.fixture
def cuda_gpus() -> int:
    """How many CUDA GPUs mori-ep's kernels can use here; skips the test, naming why,
    when there is none (a mori build without CUDA, or no GPU visible)."""
    import mori.ep

    return require_cuda(mori.ep._C)


@pytest.fixture(params=["shared", "per_gpu"])
def gpu_placement(request, cuda_gpus) -> str:
    """Where a GPU test's two ranks run: "shared" (both on GPU 0) or "per_gpu" (rank r
    on GPU r; skipped below 2 GPUs), as the workers' placement argument."""
    if request.param == "per_gpu" and cuda_gpus < 2:
        pytest.skip("needs 2 GPUs")
    return request.param


@pytest.fixture
def run_workers():
    """A function running ``tests/workers/<worker>`` as 2 processes with ``args`` and a
    fresh random seed (printed) last, printing each rank's output; every rank must end
    with "rank N ok". ``env`` is added to the workers' environment."""
    from pathlib import Path

    def run(worker: str, *args: str, env: dict | None = None, timeout_s: float = 300) -> None:
        path = Path(__file__).parent / "workers" / worker
        run_ranks([path, *args, str(new_seed())], 2, timeout_s=timeout_s, env=env)

    return run
