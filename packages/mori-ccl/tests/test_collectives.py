# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ccl.Communicator on CPU among real processes (gloo group, host symmetric heap)."""

from pathlib import Path

import pytest
import torch

import mori.ccl as ccl
import mori.core as mc
from mori.ccl import communicator
from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "collectives_worker.py")
# The first communicator creates the heap: 2 x 64 KiB for the tests' own, 2 x 64 MiB
# for the functional shortcuts' default one. It is a host heap because the workers see
# no GPU: with one visible, shmem.init() without a device makes a CUDA heap, and these
# tests pass CPU tensors.
ENV = {"MORI_SHMEM_HEAP_SIZE": "160M", "CUDA_VISIBLE_DEVICES": ""}


def _run(mode, world, *extra, timeout_s=120):
    return run_ranks([WORKER, mode, str(new_seed()), *extra], world, timeout_s=timeout_s, env=ENV)


@pytest.mark.parametrize(("world", "iters"), [(2, 10000), (4, 56), (8, 14)])
def test_collectives_match_the_reference_bit_for_bit(world, iters):
    # Back-to-back calls with fresh inputs on one communicator, cycling through every
    # collective and all-reduce algorithm, dtype and op (10,000 at world 2 to catch
    # races between calls; 4 and 8 processes share 2 cores in CI: fewer there).
    results = _run("random", world, str(iters))
    print(results[0].output.strip().splitlines()[-2])


def test_mismatches_and_rejections_fail_every_rank():
    _run("errors", 3)


def test_a_rank_that_never_arrives_is_named():
    _run("timeout", 2, timeout_s=60)


def test_a_cuda_heap_without_the_kernels_is_refused_honestly(monkeypatch):
    monkeypatch.setattr(communicator.shmem, "initialized", lambda: True)
    monkeypatch.setattr(communicator.shmem, "my_pe", lambda: 0)
    monkeypatch.setattr(communicator.shmem, "n_pes", lambda: 1)
    monkeypatch.setattr(communicator.shmem, "info", lambda: {"kind": "cuda", "device": 0})
    monkeypatch.setattr(communicator._C, "with_cuda", False)
    with pytest.raises(mc.NotSupportedError, match="built without its CUDA kernels"):
        ccl.Communicator()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(max_bytes=0), "max_bytes 0 must be a positive int"),
        (dict(timeout_s=0), "timeout_s 0 must be > 0"),
        (dict(max_blocks=0), r"max_blocks 0 must be an int in \[1, 64\]"),
        (dict(max_blocks=65), r"max_blocks 65 must be an int in \[1, 64\]"),
    ],
)
def test_bad_arguments_name_the_value(kw, message):
    with pytest.raises(mc.InvalidArgumentError, match=message):
        ccl.Communicator(**kw)


def test_stubs_match_the_module():
    # Every public name of mori.ccl._C is in _C.pyi and the reverse; classes' methods too.
    from mori.core.testing import parse_stub

    names, classes = parse_stub(Path(ccl.__file__).parent / "_C.pyi")
    methods = {cls: set(members) - {"__init__"} for cls, members in classes.items()}
    module = {n for n in dir(ccl._C) if not n.startswith("_") or n.startswith("__mori")}
    cuda_only = {"CommunicatorCuda"}
    assert names - (set() if ccl._C.with_cuda else cuda_only) == module
    for cls, expected in methods.items():
        if cls in cuda_only and not ccl._C.with_cuda:
            continue
        assert expected == {n for n in dir(getattr(ccl._C, cls)) if not n.startswith("_")}, cls


def test_block_size_grows_with_max_bytes():
    small, big = ccl._C.ccl_block_bytes(4, 1000), ccl._C.ccl_block_bytes(4, 1 << 20)
    assert small >= 2 * 1000 and big - small == 2 * ((1 << 20) - 1024)
    assert isinstance(torch.empty(0), torch.Tensor)
    # CUDA: staging and reduced per parity, and the copy engine's staging (5 x max_bytes),
    # and one_shot_ll's packets (8 bytes per 4 input bytes, per parity and rank, up to
    # 256 KiB of input).
    small, big = ccl._C.ccl_cuda_block_bytes(4, 1024), ccl._C.ccl_cuda_block_bytes(4, 1 << 20)
    assert big - small == 5 * ((1 << 20) - 1024) + 2 * 4 * 8 * ((256 << 10) - 1024) // 4


SDMA_WORKER = str(Path(__file__).parent / "workers" / "sdma_worker.py")


def test_mori_sdma_adapters_on_a_host_heap():
    run_ranks([SDMA_WORKER, "cpu", str(new_seed())], 2, timeout_s=120)


def test_an_out_that_partly_overlaps_the_input_is_refused_on_every_rank():
    # all_reduce's docstring promised it; the host heap accepted it (only CUDA refused).
    worker = str(Path(__file__).parent / "workers" / "overlap_worker.py")
    run_ranks([worker, str(new_seed())], 2, timeout_s=120, env=ENV)
