# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Engines in two real processes: bytes verified on both sides, and a peer killed with
SIGKILL in the middle of a large batch turns it into Failed (never a hang)."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mori.core.launch import launch_local
from mori.core.testing import wait_for_path
from mori.io import (
    BackendType,
    EngineDesc,
    IOEngine,
    MemoryDesc,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
)

WORKER = str(Path(__file__).with_name("io_peer_worker.py"))


def test_read_and_batch_write_across_processes(tmp_path):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    results = launch_local([WORKER, "rank", str(tmp_path), str(seed)], 2, timeout_s=60)
    assert "target verified" in results[0].output
    assert "initiator verified" in results[1].output


def test_peer_killed_mid_batch_fails_the_transfer(tmp_path):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    target = subprocess.Popen(
        [sys.executable, WORKER, "target", str(tmp_path), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        eng = IOEngine("initiator")
        eng.create_backend(BackendType.TCP, TcpBackendConfig(chunk_size=64 << 10))
        wait_for_path(tmp_path / "mem", target, what="target did not start")
        time.sleep(0.05)
        eng.register_remote_engine(EngineDesc.unpack((tmp_path / "engine").read_bytes()))
        remote = MemoryDesc.unpack((tmp_path / "mem").read_bytes())
        buf = np.zeros(remote.size, np.uint8)
        mem = eng.register_array(buf)
        n = 4096
        blk = remote.size // n
        offs = [i * blk for i in range(n)]
        # Several rounds of large batches keep the sockets busy while the peer dies.
        statuses = [
            eng.batch_read(mem, offs, remote, offs, [blk] * n, eng.allocate_transfer_uid())
            for _ in range(20)
        ]
        os.kill(target.pid, signal.SIGKILL)
        t0 = time.monotonic()
        for s in statuses:
            assert s.WaitFor(10000) != StatusCode.IN_PROGRESS, "a transfer hung after its peer died"
        elapsed = time.monotonic() - t0
        failed = [s for s in statuses if s.Failed()]
        assert failed, "no transfer failed although the peer was killed"
        assert all(s.Detail() == StatusDetail.ERR_PEER_LOST for s in failed)
        assert "lost" in failed[0].Message()
        assert elapsed < 5.0
        # Later transfers fail at once until the engine is registered again.
        s = eng.read(mem, 0, remote, 0, 16, eng.allocate_transfer_uid())
        assert s.Failed() and s.Detail() == StatusDetail.ERR_PEER_LOST
        assert "register it again" in s.Message()
        assert eng._engine.ledger_stats()["live"] == 0
    finally:
        target.kill()
        target.wait(10)
