# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""EpDispatchCombineOp's CUDA kernels among real processes: world 1, world 2 with
one process per GPU and with 2 processes on 1 GPU, bf16 and fp8, a CUDA graph.
Combine has two paths (tiled, one-pass for few rows per block) that each rank picks
for itself: by default the launch shapes and ragged token counts mix them across
calls and ranks; test_two_gpus also forces each path on every call.

Skipped without a CUDA GPU or a mori build without CUDA. Each scenario runs in
fresh worker processes (tests/workers/ep_gpu_worker.py) with a bounded wall time.
"""

import random
from pathlib import Path

import pytest

import mori.core as mc
from mori.core.launch import launch_local

torch = pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "ep_gpu_worker.py")
# NVLink multicast stays off on shared hosts.
ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def _gpus() -> int:
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


def _run(mode: str, placement: str, world: int, iters: int, timeout_s: float = 240, env=None):
    seed = random.randrange(1 << 30)
    print(f"seed={seed} env={env}")
    results = launch_local(
        [WORKER, mode, placement, str(seed), str(iters)],
        world,
        timeout_s=timeout_s,
        env={**ENV, **(env or {})},
    )
    for r in results:
        print(f"----- rank {r.rank} -----\n{r.output}")
        assert r.output.strip().endswith(f"rank {r.rank} ok"), r.output
    return results


def test_world_one():
    _gpus()
    _run("random", "shared", 1, 8)


# Combine's one-pass path: rows per block up to which a rank takes it ("0": never).
@pytest.mark.parametrize("onepass_rows", [None, "0", "1000000"], ids=["mixed", "tiled", "onepass"])
def test_two_gpus(onepass_rows):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    env = {"MORI_EP_COMBINE_ONEPASS_ROWS": onepass_rows} if onepass_rows else None
    _run("random", "per_gpu", 2, 16, env=env)


def test_two_processes_one_gpu():
    _gpus()
    _run("random", "shared", 2, 6)


def test_cuda_graph_replays():
    placement = "per_gpu" if _gpus() >= 2 else "shared"
    _run("graph", placement, 2, 6)
