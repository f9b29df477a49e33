# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Start N local worker processes with torchrun's environment, bounded in time.

Used by the tests and the demo; handy for users who want a multi-process run on
one machine without torchrun. Each worker gets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port for torch's
store) and MORI_BOOTSTRAP_PORT (another free port for mori's TCP bootstrap).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from . import timeouts

# NVLink multicast stays off on shared hosts (it can take every GPU of the host out of
# service): the environment the benches and GPU tests give their workers.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass
class WorkerResult:
    rank: int
    returncode: int
    output: str


class WorkersFailed(RuntimeError):
    """A worker exited non-zero or the group outlived its timeout."""

    def __init__(self, message: str, results: list[WorkerResult]):
        super().__init__(message)
        self.results = results


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _format(results: list[WorkerResult]) -> str:
    return "\n".join(
        f"----- rank {r.rank} (exit {r.returncode}) -----\n{r.output.rstrip()}" for r in results
    )


def _stack_dump(argv: list[str], timeout_s: float, keep=None) -> str:
    """The first 400 lines (kept by ``keep``, where given) of a stack-dumping tool's
    output, each cut at 160 characters; "" when the tool fails or outlives timeout_s."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = done.stdout.splitlines()[:400]
    return "\n".join(ln[:160] for ln in lines if keep is None or keep(ln))


def _thread_rows(pid: int) -> str:
    """A row per thread: name, state, kernel wait channel, system call number and CPU
    ticks used (a spinning thread's grow between two dumps)."""
    rows = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError as e:
        return f"(threads of pid {pid} unreadable: {e})"
    for tid in tids:
        fields = []
        for name in ("comm", "wchan", "syscall"):
            try:
                with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                    fields.append(f.read().strip().split(" ")[0] or "-")
            except OSError:
                fields.append("?")
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            state, ticks = stat[0], int(stat[11]) + int(stat[12])
        except (OSError, IndexError, ValueError):
            state, ticks = "?", -1
        rows.append(
            f"thread {tid} {fields[0]}: state {state} wchan {fields[1]} "
            f"syscall {fields[2]} cpu ticks {ticks}"
        )
    return "\n".join(rows)


def _threads_of(pid: int, tool_timeout_s: float = 20.0) -> str:
    """Where each thread of a live process waits, for a worker about to be killed:
    py-spy's Python and native stacks, else gdb's native backtraces, where either is
    installed (a hung CUDA call shows its driver frames); then a row per thread from
    /proc (threads without Python, such as a proxy's, included)."""
    parts = []
    if shutil.which("py-spy"):
        parts.append(_stack_dump(["py-spy", "dump", "--native", "--pid", str(pid)], tool_timeout_s))
    elif shutil.which("gdb"):
        parts.append(
            _stack_dump(
                ["gdb", "-q", "-batch", "-p", str(pid), "-ex", "thread apply all bt 16"],
                tool_timeout_s,
                lambda ln: ln.startswith(("Thread", "#")),
            )
        )
    parts.append(_thread_rows(pid))
    return "\n".join(part for part in parts if part)


def launch_local(
    argv: list[str],
    world_size: int,
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
    grace_s: float = 10.0,
) -> list[WorkerResult]:
    """Run ``argv`` (``[sys.executable, ...]`` if it starts with a .py path) as
    ``world_size`` processes and return their results in rank order.

    Raises WorkersFailed, with every worker's output, when a worker exits
    non-zero (the others get ``grace_s`` seconds to finish, then are killed) or
    when the group is still running after ``timeout_s`` seconds (all are killed;
    ``mori.core.timeouts``' rules: NaN, 0 and negative raise InvalidArgumentError, inf
    means a year). A worker killed that way has its threads' stacks (py-spy or gdb) or
    wait channels appended to its output.
    """
    timeout_s = timeouts.seconds(timeout_s, "timeout_s")
    if world_size < 1:
        raise ValueError(f"world_size {world_size} must be >= 1")
    if argv and argv[0].endswith(".py"):
        argv = [sys.executable, *argv]
    master_port, mori_port = free_port(), free_port()
    procs = []
    # Output goes to files, not pipes: a worker printing more than a pipe holds would
    # otherwise block on write while we wait for it to exit.
    logs = [tempfile.TemporaryFile(mode="w+b") for _ in range(world_size)]
    for rank in range(world_size):
        wenv = dict(os.environ)
        wenv.update(env or {})
        wenv.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
            MORI_BOOTSTRAP_PORT=str(mori_port),
            PYTHONUNBUFFERED="1",
        )
        procs.append(subprocess.Popen(argv, env=wenv, stdout=logs[rank], stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    reason = ""
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if failed_at is not None and now - failed_at > grace_s:
            reason = f"a worker failed; killed the rest after {grace_s:.0f}s"
            break
        if now > deadline:
            reason = f"timed out after {timeout_s:.0f}s"
            break
        time.sleep(0.02)
    stacks = {}
    for rank, p in enumerate(procs):
        if p.poll() is None:
            if reason:
                stacks[rank] = _threads_of(p.pid)
            p.kill()
    results = []
    for rank, p in enumerate(procs):
        p.wait()
        logs[rank].seek(0)
        out = logs[rank].read().decode(errors="replace")
        logs[rank].close()
        if rank in stacks:
            out += f"\n(killed; its threads were at:)\n{stacks[rank]}"
        results.append(WorkerResult(rank, p.returncode, out))
    if reason or any(r.returncode != 0 for r in results):
        msg = reason or "worker(s) exited non-zero"
        raise WorkersFailed(f"{msg}: {' '.join(argv)}\n{_format(results)}", results)
    return results


def expect_raises(cls: type[BaseException], pattern: str, fn, *args, **kwargs) -> str:
    """Call ``fn(*args, **kwargs)`` and return the message of the ``cls`` it raises,
    which must contain ``pattern``; AssertionError when it raises nothing (a worker's
    check that one rank's bad input fails there, and its rejection on the others)."""
    try:
        fn(*args, **kwargs)
    except cls as e:
        assert pattern in str(e), f"{cls.__name__} message {str(e)!r} lacks {pattern!r}"
        return str(e)
    raise AssertionError(
        f"{getattr(fn, '__name__', fn)} did not raise {cls.__name__} ({pattern!r})"
    )
