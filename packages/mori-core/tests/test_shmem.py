# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Host symmetric heap among real processes (CPU; runs in CI)."""

from pathlib import Path

import pytest

import mori.core as mc
from mori.core import shmem
from mori.core.testing import new_seed, run_ranks

pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "shmem_worker.py")


def _run(mode, world, *extra, env=None, timeout_s=240):
    argv = [WORKER, mode, str(new_seed()), *extra]
    return run_ranks(argv, world, timeout_s=timeout_s, env=env, who="pe")


@pytest.mark.parametrize("world", [2, 4])
def test_peer_views_put_get_signal(world):
    _run("basic", world)


def test_basic_over_native_tcp_bootstrap():
    _run("basic-tcp", 3)


@pytest.mark.parametrize("world", [2, 4])
def test_data_then_flag_ordering_10k_rounds(world):
    results = _run("stress", world, "10000")
    print("\n".join(r.output.strip().splitlines()[0] for r in results))


@pytest.mark.parametrize("world", [2, 4])
def test_allocator_and_error_paths(world):
    _run("alloc", world)


def test_unreachable_pe_on_another_node():
    _run("twonodes", 4)


def test_calls_before_init_are_clear_errors():
    assert not shmem.initialized()
    with pytest.raises(mc.InvalidStateError, match="not initialized"):
        shmem.malloc(64)
    with pytest.raises(mc.InvalidStateError, match="not initialized"):
        shmem.barrier_all()
    with pytest.raises(mc.InvalidArgumentError, match="unknown shmem handle type 'nvlink'"):
        mc._C.shmem_init(mc._C.TcpBootstrap(0, 1), 1 << 21, -1, "nvlink", 10.0)


def test_single_process_heap_and_sizes():
    import torch

    shmem.init(device="cpu", heap_size="4M", bootstrap=mc._C.TcpBootstrap(0, 1))
    try:
        info = shmem.info()
        assert info["heap_size"] == 4 << 20 and info["kind"] == "host"
        t = shmem.empty((3, 5), torch.bfloat16)
        assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
        assert shmem.info()["live_allocations"] == 1
        del t  # the tensor owns its block
        assert shmem.info()["live_allocations"] == 0
        assert mc._C.shmem_parse_size("512M") == 512 << 20
        with pytest.raises(mc.InvalidArgumentError, match="unknown unit"):
            mc._C.shmem_parse_size("5Q")
        with pytest.raises(mc.InvalidArgumentError, match="is not 8-byte aligned"):
            p = shmem.malloc(64)
            shmem.signal(p + 4, 1, 0)
        shmem.free(p)
        with pytest.raises(mc.MoriTimeoutError, match=r"waiting for value >= 1"):
            w = shmem.malloc(8)
            torch.zeros(1, dtype=torch.int64)  # noqa: B018
            shmem.wait_until(w, "ge", 1, timeout_s=0.2)
        shmem.free(w)
        with pytest.raises(mc.NotSupportedError, match="needs a CUDA heap"):
            shmem.barrier_on_stream(0)
    finally:
        shmem.finalize(force=True)
