# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.core.launch.launch_local: output, failures, timeouts — and workers that print
more than a pipe holds never block."""

import sys

import pytest

from mori.core.launch import WorkersFailed, launch_local


def test_large_output_does_not_block_the_workers():
    # 4 MiB per worker: far more than a pipe buffer (64 KiB).
    code = "import os,sys; sys.stdout.write(('x' * 1023 + '\\n') * 4096); print('rank', os.environ['RANK'])"
    results = launch_local([sys.executable, "-c", code], 2, timeout_s=60)
    for r in results:
        assert r.returncode == 0
        assert len(r.output) > 4 << 20
        assert r.output.rstrip().endswith(f"rank {r.rank}")


def test_failure_and_timeout_are_reported_with_output():
    code = "import os,sys,time; print('hello', os.environ['RANK']); sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)"
    with pytest.raises(WorkersFailed, match="a worker failed") as e:
        launch_local([sys.executable, "-c", code], 2, timeout_s=30, grace_s=0.5)
    assert [r.returncode for r in e.value.results][1] == 3
    assert "hello 1" in e.value.results[1].output
    with pytest.raises(WorkersFailed, match="timed out"):
        launch_local([sys.executable, "-c", "import time; time.sleep(60)"], 1, timeout_s=1)


def test_a_killed_worker_shows_where_its_threads_waited():
    code = "import threading,time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    with pytest.raises(WorkersFailed, match="timed out") as e:
        launch_local([sys.executable, "-c", code], 1, timeout_s=1)
    out = e.value.results[0].output
    assert "(killed; its threads were at:)" in out, out
    # gdb's backtraces (one "Thread" header per thread) or, without gdb, a row per thread.
    assert out.count("Thread ") >= 2 or out.count("thread ") >= 2, out


def test_the_lost_trap_signature_is_matched_and_nothing_else():
    from mori.core.launch import WorkerResult
    from mori.core.testing import lost_trap_on_shared_gpu

    hung = 'boom A\nTimeout (0:00:45)!\n  File "x.py", line 1 in synchronize\n'
    ok = "boom B\nrank 1 outcome: CUDA error after 0.4s: x\nrank 1 ok\n"
    want = {0: "boom A", 1: "boom B"}

    def err(msg, r0):
        return WorkersFailed(msg, [r0, WorkerResult(1, 0, ok)])

    assert lost_trap_on_shared_gpu(err("timed out after 60s", WorkerResult(0, -9, hung)), want)
    # Not that signature: another failure, a missing message, no synchronize, an exit code.
    assert not lost_trap_on_shared_gpu(err("a worker failed", WorkerResult(0, -9, hung)), want)
    assert not lost_trap_on_shared_gpu(
        err("timed out after 60s", WorkerResult(0, -9, hung.replace("boom A", ""))), want
    )
    assert not lost_trap_on_shared_gpu(
        err("timed out after 60s", WorkerResult(0, -9, hung.replace("synchronize", "wait"))), want
    )
    assert not lost_trap_on_shared_gpu(err("timed out after 60s", WorkerResult(0, 1, hung)), want)
    assert not lost_trap_on_shared_gpu(ValueError("timed out"), want)
