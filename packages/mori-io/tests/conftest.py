# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Fixtures shared by mori-io's tests."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mori.io import _C, EngineDesc, IOEngine, MemoryDesc

# Tests marked io_testing use mori.io._C._testing: the test hooks, the RDMA loopback
# double (MORI_IO_RDMA_LOOPBACK=1) and the CMA fault switch (MORI_IO_TEST_CMA_REFUSE)
# that only a test build carries. `nox -s tests` makes one (and checks that it has
# them); against a wheel they skip.
NO_TEST_HOOKS = (
    "mori-io was built without its test hooks (mori.io._C._testing): rebuild it with "
    "-C cmake.define.MORI_IO_TESTING=ON, as `nox -s tests` does"
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "io_testing: needs mori-io's test build (mori.io._C._testing)"
    )


def pytest_collection_modifyitems(config, items):
    if hasattr(_C, "_testing"):
        return
    skip = pytest.mark.skip(reason=NO_TEST_HOOKS)
    for item in items:
        if item.get_closest_marker("io_testing"):
            item.add_marker(skip)


@pytest.fixture
def engine_pair():
    """make(*backends, configs={type: config}, mutual=True) -> (a, b): engines "a" and
    "b" of this process with those backends (TCP first when listed), a registered with
    b and, when mutual, b with a. Closed when the test ends."""
    made = []

    def make(*backends, configs=None, mutual=True):
        a, b = IOEngine("a"), IOEngine("b")
        made.extend((a, b))
        for e in (a, b):
            for t in backends:
                e.create_backend(t, (configs or {}).get(t))
        a.register_remote_engine(b.get_engine_desc())
        if mutual:
            b.register_remote_engine(a.get_engine_desc())
        return a, b

    yield make
    for e in made:
        e.close()


@pytest.fixture
def peer_target(tmp_path):
    """A target engine in another process (tests/io_peer_worker.py, TCP, a 32 MiB
    region): yields (its EngineDesc, its MemoryDesc, the worker's seed, the process).
    The process is resumed (a test may have stopped it) and killed afterwards."""
    from mori.core.testing import wait_for_path

    seed = random.randrange(1 << 30)
    print("seed", seed)
    worker = str(Path(__file__).with_name("io_peer_worker.py"))
    proc = subprocess.Popen(
        [sys.executable, worker, "target", str(tmp_path), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_path(tmp_path / "mem", proc, what="target did not start")
        time.sleep(0.05)
        desc = EngineDesc.unpack((tmp_path / "engine").read_bytes())
        yield desc, MemoryDesc.unpack((tmp_path / "mem").read_bytes()), seed, proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)


@pytest.fixture
def rss_bytes():
    """() -> this process's resident set size in bytes (VmRSS)."""

    def read():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/self/status")

    return read
