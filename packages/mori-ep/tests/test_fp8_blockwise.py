# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""quant_type="fp8_blockwise" (MORI's blockwise fp8 combine) on the CPU implementation:
IntraNode, IntraNodeLL and AsyncLL at world 2 and 4 against a torch reference, bit for
bit and within the tolerance derived from e4m3's rounding; the bytes a row crosses as;
ranks whose wire formats differ fail naming both (tests/workers/ep_fp8_blockwise_worker.py).
The CUDA kernels: test_fp8_blockwise_gpu.py."""

from pathlib import Path

import pytest
import torch

import mori.core as mc
from mori.core.testing import new_seed, run_ranks
from mori.ep import EpDispatchCombineConfig, EpDispatchCombineQuantType

WORKER = str(Path(__file__).parent / "workers" / "ep_fp8_blockwise_worker.py")


def _config(**kw):
    return EpDispatchCombineConfig(torch.bfloat16, 0, 2, 7168, 0, 4, 2, 16, 4, 4, **kw)


@pytest.mark.parametrize("world", [2, 4])
def test_fp8_blockwise_combine_matches_the_torch_reference(world):
    run_ranks([WORKER, str(new_seed())], world, timeout_s=600)


def test_fp8_blockwise_is_accepted_with_moris_scale_dim(monkeypatch):
    monkeypatch.delenv("MORI_FP8_COMBINE_SCALE_DIM", raising=False)
    for q in ("fp8_blockwise", " FP8_BLOCKWISE", EpDispatchCombineQuantType.Fp8BlockwiseQuant):
        c = _config(quant_type=q)
        assert c.quant == EpDispatchCombineQuantType.Fp8BlockwiseQuant
        assert c.combine_scale_dim == 56
    assert _config(quant_type="fp8_direct_cast").combine_scale_dim == 0
    monkeypatch.setenv("MORI_FP8_COMBINE_SCALE_DIM", "28")
    assert _config(quant_type="fp8_blockwise").combine_scale_dim == 28
    monkeypatch.setenv("MORI_FP8_COMBINE_SCALE_DIM", "0")
    with pytest.raises(mc.InvalidArgumentError, match="MORI_FP8_COMBINE_SCALE_DIM"):
        _config(quant_type="fp8_blockwise")


def test_fp4_blockwise_config_is_made_as_moris():
    # Its combine is refused on every rank (tests/test_fp4.py), as MORI's inter-node
    # kernel types refuse it; the config itself is made, as MORI's is.
    c = _config(quant_type="fp4_blockwise")
    assert c.quant == EpDispatchCombineQuantType.Fp4BlockwiseQuant
    assert c.combine_scale_dim == 0


def test_the_cuda_tests_checks_hold_on_the_cpu_implementation():
    """test_fp8_blockwise_gpu.py's worker with a host heap (its CUDA graphs left out):
    its shapes, paths, unaligned rows and wire checks hold for the CPU implementation,
    so on a GPU they test the kernels, not the worker."""
    gpu_worker = str(Path(__file__).parent / "workers" / "ep_fp8_blockwise_gpu_worker.py")
    run_ranks([gpu_worker, "cpu", str(new_seed())], 2, timeout_s=600)
