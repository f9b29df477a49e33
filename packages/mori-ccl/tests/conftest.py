# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Fixtures shared by mori-ccl's GPU tests."""

import pytest

from mori.core.testing import require_cuda


@pytest.fixture
def cuda_gpus() -> int:
    """How many CUDA GPUs mori-ccl's kernels can use here; skips the test, naming why,
    when there is none (a mori build without CUDA, or no GPU visible)."""
    import mori.ccl

    return require_cuda(mori.ccl._C)
