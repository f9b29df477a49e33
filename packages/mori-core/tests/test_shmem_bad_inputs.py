# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.core.shmem refuses bad inputs with an error naming the value instead of
crashing, aliasing memory or desynchronising the pes (CPU; runs in CI).

Cases that used to crash the process run in a subprocess, so a SIGSEGV fails
the test instead of killing pytest."""

import math
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import mori.core as mc
from mori.core import shmem
from mori.core.launch import launch_local

torch = pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "shmem_bad_inputs_worker.py")


def _run_isolated(body: str) -> str:
    """Run ``body`` in a fresh interpreter with a one-pe host heap; returns its
    output and fails (with that output) on a non-zero exit or a signal."""
    script = (
        textwrap.dedent(
            """
        import torch
        import mori.core as mc
        from mori.core import shmem
        from mori.core.launch import expect_raises
        shmem.init(device="cpu", heap_size="4M", bootstrap=mc._C.TcpBootstrap(0, 1))
        """
        )
        + textwrap.dedent(body)
        + "\nshmem.finalize(force=True)\nprint('isolated ok')\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"exit status {p.returncode}:\n{out}"
    assert "isolated ok" in out, out
    return out


@pytest.fixture
def heap():
    shmem.init(device="cpu", heap_size="4M", bootstrap=mc._C.TcpBootstrap(0, 1))
    try:
        yield
    finally:
        shmem.finalize(force=True)


def test_put_get_refuse_a_meta_tensor_naming_device_and_shape():
    _run_isolated(
        """
        x = shmem.empty((16,), torch.float32)
        m = torch.empty((4, 4), dtype=torch.float32, device="meta")
        msg = expect_raises(mc.InvalidArgumentError, "meta", shmem.put, x, m, 0)
        assert "(4, 4)" in msg, msg
        msg = expect_raises(mc.InvalidArgumentError, "meta", shmem.get, m, x, 0)
        assert "(4, 4)" in msg, msg
        # The symmetric side as a meta tensor is not in the heap either.
        expect_raises(mc.InvalidArgumentError, "meta", shmem.put, m, torch.zeros(16), 0)
        del x
        """
    )


def test_put_get_refuse_a_null_local_address():
    _run_isolated(
        """
        x = shmem.empty((16,), torch.float32)
        expect_raises(mc.InvalidArgumentError, "null", mc._C.shmem_put, x.data_ptr(), 0, 64, 0)
        expect_raises(mc.InvalidArgumentError, "null", mc._C.shmem_get, 0, x.data_ptr(), 64, 0)
        expect_raises(
            mc.InvalidArgumentError, "wraps", mc._C.shmem_get, 2**64 - 8, x.data_ptr(), 64, 0
        )
        del x
        """
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_put_get_refuse_a_cuda_tensor_on_a_host_heap():
    _run_isolated(
        """
        x = shmem.empty((16,), torch.float32)
        c = torch.zeros(16, device="cuda")
        expect_raises(mc.InvalidArgumentError, "cuda", shmem.put, x, c, 0)
        expect_raises(mc.InvalidArgumentError, "cuda", shmem.get, c, x, 0)
        del x
        """
    )


def test_free_of_an_empty_tensor_is_not_freed_again_by_collection(heap):
    x = shmem.empty((256,), torch.float32)
    addr = x.data_ptr()
    shmem.free(x)
    assert shmem.info()["live_allocations"] == 0
    y = shmem.empty((256,), torch.float32)  # lands where x was: x was freed
    assert y.data_ptr() == addr
    del x  # must not free y's block
    assert shmem.info()["live_allocations"] == 1
    z = shmem.empty((256,), torch.float32)
    assert z.data_ptr() != y.data_ptr(), "a later empty() aliases a live tensor"
    del y, z
    assert shmem.info()["live_allocations"] == 0


def test_double_free_names_the_address(heap):
    p = shmem.malloc(1024)
    shmem.free(p)
    with pytest.raises(mc.InvalidArgumentError, match=hex(p)):
        shmem.free(p)
    t = shmem.empty((8,), torch.int64)
    shmem.free(t)
    with pytest.raises(mc.InvalidArgumentError, match="not a live allocation"):
        shmem.free(t)
    assert shmem.info()["live_allocations"] == 0


def test_heap_size_overflowing_the_node_total_is_refused():
    results = launch_local([WORKER, "overflow"], 2, timeout_s=120)
    for r in results:
        assert r.output.strip().endswith(f"pe {r.rank} ok"), r.output


@pytest.mark.parametrize("mode", ["mismatch", "mismatch-tcp"])
def test_malloc_against_finalize_raises_on_every_pe(mode):
    results = launch_local([WORKER, mode], 2, timeout_s=120)
    for r in results:
        assert r.output.strip().endswith(f"pe {r.rank} ok"), r.output


@pytest.mark.parametrize("huge", [math.inf, 1e300, 1e30])
def test_huge_timeouts_mean_practically_forever(huge):
    b = mc._C.TcpBootstrap(0, 1, timeout_s=huge)
    b.barrier()
    shmem.init(device="cpu", heap_size="4M", bootstrap=b, timeout_s=huge)
    try:
        shmem.barrier_all()
        w = shmem.empty((1,), torch.int64)
        w.zero_()
        addr = w.data_ptr()
        threading.Timer(0.2, lambda: shmem.signal(addr, 7, 0)).start()
        start = time.monotonic()
        assert shmem.wait_until(w, "eq", 7, timeout_s=huge) == 7
        assert time.monotonic() - start >= 0.1
        del w
    finally:
        shmem.finalize(force=True)


@pytest.mark.parametrize("tiny", [1e-300, 1e-10, 1e-4])
def test_tiny_positive_timeouts_round_up_to_a_millisecond(tiny, heap):
    """A positive timeout below the millisecond the waits count in is one millisecond:
    1e-300 s truncated to 0 ns and reported "timed out after 0 ms"."""
    w = shmem.empty((1,), torch.int64)
    w.zero_()
    with pytest.raises(mc.MoriTimeoutError, match="timed out after 1 ms"):
        shmem.wait_until(w, "eq", 1, timeout_s=tiny)
    del w


@pytest.mark.parametrize("bad", [math.nan, -1.0, 0.0, -math.inf])
def test_nan_negative_and_zero_timeouts_are_refused_naming_the_value(bad, heap):
    text = {math.nan: "nan", -1.0: "-1", 0.0: "0"}.get(bad, "-inf") if bad == bad else "nan"
    w = shmem.empty((1,), torch.int64)
    with pytest.raises(mc.InvalidArgumentError, match=f"timeout_s {text}"):
        shmem.wait_until(w, "eq", 1, timeout_s=bad)
    with pytest.raises(mc.InvalidArgumentError, match=f"timeout_s {text}"):
        mc._C.TcpBootstrap(0, 1, timeout_s=bad)
    del w
