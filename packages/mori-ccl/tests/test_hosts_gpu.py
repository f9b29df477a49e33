# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A group that spans hosts on GPUs: hosts emulated with MORI_SHMEM_NODE_ID, one
process per GPU, the host's part on mori's CUDA collectives and the part between hosts
through NCCL. 2 hosts x 1 GPU with 2 GPUs, 2 hosts x 2 GPUs with 4 or more. Skipped
with fewer than 2 GPUs (NCCL refuses two ranks on one GPU)."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "hosts_worker.py")


@pytest.mark.parametrize("layout", ["blocked", "interleaved"])
def test_two_emulated_hosts_over_nccl(cuda_gpus, layout):
    if cuda_gpus < 2:
        pytest.skip("needs 2 GPUs (NCCL between the emulated hosts, one rank per GPU)")
    world = 4 if cuda_gpus >= 4 else 2
    run_ranks([WORKER, layout, str(new_seed()), "168", "cuda"], world, timeout_s=300)
