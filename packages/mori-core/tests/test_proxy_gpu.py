# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The proxy with kernel producers over a CUDA heap: 2 processes on GPU 0, on two
emulated nodes (tcp, staged) and on one (mapped). Skipped without a CUDA GPU or a
libmori_core built without CUDA."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, require_cuda, run_ranks

pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "proxy_gpu_worker.py")


@pytest.mark.parametrize("per_node", [1, 2], ids=["two-nodes-tcp", "one-node-mapped"])
def test_kernel_pushes_write_add_and_adds(per_node):
    require_cuda()
    run_ranks([WORKER, str(new_seed()), str(per_node)], 2, timeout_s=300, who="pe")
