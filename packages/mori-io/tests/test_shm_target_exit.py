# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One-sided SHM writes — mapped (the target's region in its shared host memory, one
memcpy by the initiator) and CMA with a cached grant (one process_vm_writev) — against a
target that dies or stops. Killed (SIGKILL): no write that starts after the target
exited reports success, and the first error comes within 5 ms of the exit, not when the
TCP connections drop; with the target's liveness word (a load per copy) and with its
pidfd polled instead (MORI_IO_SHM_LIVENESS_WORD=0). Stopped (SIGSTOP): one-sided writes
keep landing, and on resuming the target finds every inbound status and the bytes."""

import hashlib
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

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

WORKER = str(Path(__file__).with_name("shm_target_worker.py"))
SIZE = 1 << 20  # the target's region (shm_target_worker.SIZE)
EXIT_TO_ERROR_S = 0.005


@pytest.fixture(
    params=[
        ("mapped", "1", None),
        ("mapped", "0", None),
        ("cma", "1", None),
        ("mapped", "1", "65536"),
        ("cma", "1", "65536"),
    ],
    ids=["mapped-word", "mapped-pidfd", "cma-word", "mapped-word-shares", "cma-word-shares"],
)
def mapped_target(tmp_path, monkeypatch, request):
    """(initiator engine, its local array and memory desc, the target's desc, target
    process, rendezvous folder, bytes per write): the initiator writes into the target's
    memory itself, with memcpy into its shared host memory (mapped) or
    process_vm_writev under a cached grant (cma), and learns of the target's exit from
    its liveness word ("1") or by polling its pidfd ("0"). "-shares": writes of 128 KiB
    with MORI_IO_SHM_SPLIT_BYTES=65536, each copied in shares by the submitting thread
    and the reactors at once (where the process may use several CPUs); else 64 B."""
    mode, word, split = request.param
    monkeypatch.setenv("MORI_IO_SHM_LIVENESS_WORD", word)
    if split is not None:
        monkeypatch.setenv("MORI_IO_SHM_SPLIT_BYTES", split)
    proc = subprocess.Popen(
        [sys.executable, WORKER, str(tmp_path), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    eng = IOEngine("initiator")
    try:
        wait_for_path(tmp_path / "mem", proc, what="target did not start")
        eng.create_backend(BackendType.TCP, TcpBackendConfig(num_worker_threads=4))
        eng.create_backend(BackendType.SHM)
        eng.register_remote_engine(EngineDesc.unpack((tmp_path / "engine").read_bytes()))
        # Published by rename: the target must never read a partly written file.
        (tmp_path / "initiator.tmp").write_bytes(eng.get_engine_desc().pack())
        os.replace(tmp_path / "initiator.tmp", tmp_path / "initiator")
        remote = MemoryDesc.unpack((tmp_path / "mem").read_bytes())
        wait_for_path(tmp_path / "ready", proc, what="target not ready")
        local = np.zeros(SIZE, np.uint8)
        ma = eng.register_array(local)
        name, why = eng.backend_for(ma, remote)
        assert name == "SHM" and ("mapped memcpy" if mode == "mapped" else "CMA") in why, why
        # One write first: it also maps the target's notice ring, so the writes under
        # test are the steady state (a copy and a ring slot each).
        st = eng.write(ma, 0, remote, 0, 64, eng.allocate_transfer_uid())
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        assert eng._engine.notice_ring_state("target") == 1
        assert eng._engine.shm_liveness("target") == ("word" if word == "1" else "pidfd")
        if mode == "cma":
            assert eng._engine.shm_cma_grant_state("target", remote.id) == 1
        yield eng, ma, local, remote, proc, tmp_path, (64 if split is None else 128 << 10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)
        eng.close()


def _exited(pidfd, timeout_s=0.0):
    return bool(select.select([pidfd], [], [], timeout_s)[0])


def test_no_write_succeeds_after_the_target_exited(mapped_target):
    eng, ma, _, remote, proc, _, n = mapped_target
    pidfd = os.pidfd_open(proc.pid)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        assert _exited(pidfd, 10), "the killed target did not exit within 10 s"
        # The very next write, the target known to have exited:
        st = eng.write(ma, 0, remote, 0, n, eng.allocate_transfer_uid())
        assert st.WaitFor(1000) != StatusCode.IN_PROGRESS, (
            "a write to an exited target did not finish"
        )
        assert st.Detail() == StatusDetail.ERR_PEER_LOST, (st.Detail(), st.Message())
        assert "'target'" in st.Message(), st.Message()
        print("first write after exit:", st.Message())
    finally:
        os.close(pidfd)


def test_first_error_comes_within_5_ms_of_the_exit(mapped_target):
    """Writes in a loop through the kill; each iteration first checks (pidfd, no wait)
    whether the target has exited. Every write issued after that fails, and the first
    failure completes within 5 ms of the exit being visible."""
    eng, ma, _, remote, proc, _, n = mapped_target
    pidfd = os.pidfd_open(proc.pid)
    try:
        t_exit = first_fail = None
        ok_after_exit = writes = 0
        os.kill(proc.pid, signal.SIGKILL)
        t_kill = time.perf_counter()
        while first_fail is None:
            now = time.perf_counter()
            assert now - t_kill < 10, "no write failed within 10 s of the kill"
            if t_exit is None and _exited(pidfd):
                t_exit = now
            st = eng.write(ma, 0, remote, 0, n, eng.allocate_transfer_uid())
            assert st.WaitFor(5000) != StatusCode.IN_PROGRESS, (
                "a write to a dying target did not finish"
            )
            writes += 1
            if st.Failed():
                first_fail = (time.perf_counter(), st)
            elif t_exit is not None:
                ok_after_exit += 1
        while t_exit is None:  # the failure came first (the TCP drop): note the exit
            assert _exited(pidfd, 10), "the killed target did not exit"
            t_exit = time.perf_counter()
        t_fail, st = first_fail
        print(
            f"{writes} writes; kill -> exit {(t_exit - t_kill) * 1e3:.2f} ms, "
            f"exit -> first error {(t_fail - t_exit) * 1e3:.3f} ms: {st.Message()}"
        )
        assert st.Detail() == StatusDetail.ERR_PEER_LOST, (st.Detail(), st.Message())
        assert ok_after_exit == 0, f"{ok_after_exit} writes issued after the exit succeeded"
        assert t_fail - t_exit < EXIT_TO_ERROR_S, f"first error {t_fail - t_exit:.4f} s after exit"
    finally:
        os.close(pidfd)


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_writes_land_in_a_stopped_target_and_it_finds_them_on_resuming(mapped_target):
    """One-sided: a stopped target's memory takes mapped writes (no target CPU needed)
    and they succeed; the announcements wait in its notice ring, so once resumed it pops
    every inbound status and sees every byte."""
    eng, ma, local, remote, proc, d, size = mapped_target
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    image = np.zeros(SIZE, np.uint8)  # the target's region as the writes leave it
    n, blk = 64, max(size, 4096) + 7
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while _state(proc.pid) != "T":
        assert time.monotonic() < deadline, "the target did not stop"
        time.sleep(0.001)
    uids = []
    for _ in range(n):
        lo, ro = int(rng.integers(0, SIZE - blk)), int(rng.integers(0, SIZE - blk))
        local[lo : lo + blk] = rng.integers(0, 256, blk, dtype=np.uint8)
        uid = eng.allocate_transfer_uid()
        st = eng.write(ma, lo, remote, ro, blk, uid)
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        image[ro : ro + blk] = local[lo : lo + blk]
        uids.append(uid)
    assert _state(proc.pid) == "T", "the target ran during the writes"
    digest = hashlib.sha256(image.tobytes()).hexdigest()
    (d / "uids.tmp").write_text(" ".join(map(str, uids)) + " " + digest)
    os.replace(d / "uids.tmp", d / "uids")  # whole, as the target reads it
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    assert f"target popped {n} statuses, bytes verified" in out.decode()
