# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Fixtures shared by mori-ep's GPU tests."""

import pytest

import mori.core as mc


@pytest.fixture
def cuda_gpus() -> int:
    """How many CUDA GPUs mori-ep's kernels can use here; skips the test when there is
    none (a mori build without CUDA, or no GPU visible)."""
    torch = pytest.importorskip("torch")
    import mori.ep

    if not mc.build_info().get("with_cuda"):
        pytest.skip("libmori_core was built without CUDA")
    if not mori.ep._C.with_cuda:
        pytest.skip("mori.ep was built without CUDA kernels")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    n = mc.build_info().get("cuda_device_count", 0)
    if n == 0:
        pytest.skip(f"no CUDA device: {mc.build_info().get('cuda_unavailable_reason')}")
    return n


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
    import random
    from pathlib import Path

    from mori.core.launch import launch_local

    def run(worker: str, *args: str, env: dict | None = None, timeout_s: float = 300) -> None:
        seed = random.randrange(1 << 30)
        print(f"seed={seed}")
        path = str(Path(__file__).parent / "workers" / worker)
        results = launch_local([path, *args, str(seed)], 2, timeout_s=timeout_s, env=env)
        for r in results:
            print(f"----- rank {r.rank} -----\n{r.output}")
            assert r.output.strip().endswith(f"rank {r.rank} ok"), r.output

    return run
