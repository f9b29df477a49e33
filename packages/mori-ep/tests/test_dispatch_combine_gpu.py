# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""EpDispatchCombineOp's CUDA kernels among real processes: world 1, one process per
visible GPU (2, 4 or 8) and 2 processes on 1 GPU, bf16 and fp8, a CUDA graph.
Combine has three paths (streaming, one-pass for few rows per block, and the tiled one
it replaced) that each rank picks for itself: by default the launch shapes and ragged
token counts mix one-pass and streaming (tiled where a block has one warp) across
calls and ranks; test_one_process_per_gpu also forces each path on every call, and
dispatch's two kernels likewise.

Skipped without a CUDA GPU or a mori build without CUDA. Each scenario runs in
fresh worker processes (tests/workers/ep_gpu_worker.py) with a bounded wall time.
"""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "ep_gpu_worker.py")


def _run(mode: str, placement: str, world: int, iters: int, timeout_s: float = 240, env=None):
    print(f"env={env}")
    argv = [WORKER, mode, placement, str(new_seed()), str(iters)]
    return run_ranks(argv, world, timeout_s=timeout_s, env=env)


def test_world_one(cuda_gpus):
    _run("random", "shared", 1, 8, env={"MORI_EP_DISPATCH_DYNAMIC_TOKENS": "32"})


# Combine's paths, forced on every call: one-pass up to MORI_EP_COMBINE_ONEPASS_ROWS rows
# per block ("0": never), else streaming, or tiled with MORI_EP_COMBINE_STREAM=0 (the
# tiled case also returns full-width segments, and runs the static dispatch kernel
# with 4-word segments; the streaming case posts one group per step). Dispatch's
# kernels: dynamic item hand-out from MORI_EP_DISPATCH_DYNAMIC_TOKENS tokens up by
# default, so "mixed" lowers that to mix both kernels over the ragged token counts;
# MORI_EP_DISPATCH_DYNAMIC forces one.
PATHS = {
    "mixed": {"MORI_EP_DISPATCH_DYNAMIC_TOKENS": "32"},
    "stream": {
        "MORI_EP_COMBINE_ONEPASS_ROWS": "0",
        "MORI_EP_COMBINE_STEP_GROUPS": "1",
        "MORI_EP_DISPATCH_DYNAMIC": "1",
    },
    "onepass": {"MORI_EP_COMBINE_ONEPASS_ROWS": "1000000", "MORI_EP_DISPATCH_DYNAMIC": "1"},
    "tiled": {
        "MORI_EP_COMBINE_ONEPASS_ROWS": "0",
        "MORI_EP_COMBINE_STREAM": "0",
        "MORI_EP_DISPATCH_DYNAMIC": "0",
        "MORI_EP_DISPATCH_SEG": "4",
        "MORI_EP_EVEN_SEG": "0",
    },
}


@pytest.mark.parametrize("path", list(PATHS))
def test_one_process_per_gpu(path, cuda_gpus):
    """World size = every visible GPU (2 here; 4 or 8 on the larger machines)."""
    n = cuda_gpus
    if n < 2:
        pytest.skip("needs 2 GPUs")
    # The default ("mixed") path takes 50 calls per dtype with fresh inputs, to catch
    # races; the forced paths 16.
    iters = 50 if path == "mixed" else 16
    _run("random", "per_gpu", n, iters, timeout_s=240 + 30 * n, env=PATHS[path])


def test_two_processes_one_gpu(cuda_gpus):
    _run("random", "shared", 2, 6, env={"MORI_EP_DISPATCH_DYNAMIC_TOKENS": "32"})


def test_cuda_graph_replays(cuda_gpus):
    placement = "per_gpu" if cuda_gpus >= 2 else "shared"
    _run("graph", placement, 2, 6, env={"MORI_EP_DISPATCH_DYNAMIC": "1"})


def test_each_call_is_one_kernel_without_host_sync(cuda_gpus):
    """Dispatch and combine (MORI's combine(out, None, topk_ids) too), bf16 and fp8:
    one mori kernel per call, no torch kernel or copy, no host synchronisation."""
    _run("costs", "shared", 2, 1)
