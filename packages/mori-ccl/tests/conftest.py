# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Fixtures shared by mori-ccl's GPU tests."""

import pytest

import mori.core as mc


@pytest.fixture
def cuda_gpus() -> int:
    """How many CUDA GPUs mori-ccl's kernels can use here; skips the test when there is
    none (a mori build without CUDA, or no GPU visible)."""
    torch = pytest.importorskip("torch")
    import mori.ccl

    if not mc.build_info().get("with_cuda"):
        pytest.skip("libmori_core was built without CUDA")
    if not mori.ccl._C.with_cuda:
        pytest.skip("mori.ccl was built without CUDA kernels")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    n = mc.build_info().get("cuda_device_count", 0)
    if n == 0:
        pytest.skip(f"no CUDA device: {mc.build_info().get('cuda_unavailable_reason')}")
    return n
