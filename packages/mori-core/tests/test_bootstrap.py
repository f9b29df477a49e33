# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Bootstrap among real processes: native TCP and torch.distributed (gloo)."""

import random
import time
from pathlib import Path

import pytest

import mori.core as mc
from mori.core.bootstrap import TcpBootstrap
from mori.core.launch import launch_local

WORKER = str(Path(__file__).parent / "workers" / "bootstrap_worker.py")


def _seed() -> int:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    return seed


@pytest.mark.parametrize("world", [2, 4])
def test_tcp_bootstrap_processes(world):
    results = launch_local([WORKER, "tcp", str(_seed())], world, timeout_s=120)
    assert [r.output.strip().splitlines()[-1] for r in results] == [
        f"rank {r} ok" for r in range(world)
    ]


@pytest.mark.parametrize("world", [2, 3])
def test_torch_bootstrap_gloo_through_native_interface(world):
    pytest.importorskip("torch")
    results = launch_local([WORKER, "torch", str(_seed())], world, timeout_s=180)
    assert all(r.output.strip().endswith(f"rank {r.rank} ok") for r in results)
    # torch 2.13 deprecates all_gather_into_tensor with a FutureWarning per call site
    # and rank; TorchBootstrap must use the current name and print nothing.
    for r in results:
        assert "Warning" not in r.output, r.output


def test_dead_rank_raises_instead_of_hanging():
    start = time.monotonic()
    results = launch_local([WORKER, "dies", "0"], 3, timeout_s=90)
    assert time.monotonic() - start < 60
    for r in results:
        if r.rank != 1:
            assert "raised TransportError" in r.output or "raised MoriTimeoutError" in r.output, (
                r.output
            )


def test_single_rank_needs_no_network():
    b = TcpBootstrap(0, 1)
    assert b.all_gather(b"x") == [b"x"]
    assert b.broadcast(b"y", 0) == b"y"
    b.barrier()


def test_bad_arguments_name_the_value():
    with pytest.raises(mc.InvalidArgumentError, match=r"rank 3 out of range \[0, 2\)"):
        TcpBootstrap(3, 2)
    with pytest.raises(mc.InvalidArgumentError, match="needs rank 0's port"):
        TcpBootstrap(1, 2, "127.0.0.1", 0)
    with pytest.raises(mc.InvalidArgumentError, match="timeout_s -1"):
        TcpBootstrap(0, 2, timeout_s=-1)
    with pytest.raises(mc.InvalidArgumentError, match="type object has no attribute 'rank'"):
        mc._C.bootstrap_all_gather(object(), b"x")


def test_from_env_reports_missing_variables(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(mc.InvalidArgumentError, match="RANK is not set"):
        TcpBootstrap.from_env()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(mc.InvalidArgumentError, match="WORLD_SIZE='two'"):
        TcpBootstrap.from_env()


def test_connect_timeout_is_bounded():
    # A port nobody listens on: rank 1 gives up after its timeout.
    port = TcpBootstrap(0, 2).port
    start = time.monotonic()
    with pytest.raises(mc.MoriTimeoutError, match="could not connect to rank 0"):
        TcpBootstrap(1, 2, "127.0.0.1", port, timeout_s=0.5)
    assert time.monotonic() - start < 10
