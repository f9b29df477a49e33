# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The CUDA kernels' receive cap (max_total_recv_tokens), combine of fp8 e4m3 input
and MORI's fp8_direct_cast, bit for bit against torch's conversions (the references
the CPU implementation matches in test_mori_compat.py), on every combine path and
both dispatch kernels (tests/workers/ep_fp8_cap_worker.py). A dispatch past the cap
is a trap: test_device_traps_gpu.py.

Skipped without a CUDA GPU or a mori build without CUDA.
"""

import random
from pathlib import Path

import pytest

from mori.core.launch import NO_MULTICAST_ENV, launch_local

WORKER = str(Path(__file__).parent / "workers" / "ep_fp8_cap_worker.py")


def _run(placement: str) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    results = launch_local([WORKER, placement, str(seed)], 2, timeout_s=300, env=NO_MULTICAST_ENV)
    for r in results:
        print(f"----- rank {r.rank} -----\n{r.output}")
        assert r.output.strip().endswith(f"rank {r.rank} ok"), r.output


def test_two_processes_one_gpu(cuda_gpus):
    _run("shared")


def test_one_process_per_gpu(cuda_gpus):
    if cuda_gpus < 2:
        pytest.skip("needs 2 GPUs")
    _run("per_gpu")
