# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Helpers shared by the tests of every mori package (``packages/*/tests``,
``tests_integration``, their ``conftest.py`` files and worker scripts).

GPU skips
    ``cuda_skip_reason(ext, min_gpus)`` says why CUDA tests cannot run here (None when
    they can): torch missing, libmori_core or the package's extension ``ext`` built
    without CUDA, no GPU visible to torch, no CUDA device seen by mori, fewer than
    ``min_gpus``. ``require_cuda`` skips the calling test with that reason (pytest's
    ``-ra`` summary prints it) and returns the GPU count; ``needs_cuda`` is the same
    as a ``skipif`` marker. ``visible_gpus`` is torch's count alone (0 without torch).

Ranks
    ``new_seed`` draws a seed and prints it (a failing run can be replayed);
    ``run_ranks`` starts a worker as N local processes through
    ``mori.core.launch.launch_local`` (NVLink multicast off, every wait bounded: a rank
    that fails or hangs fails the test, with every rank's output), prints each rank's
    output and checks that each ended with "rank N ok" (or "pe N ok"). In a worker,
    ``start_rank(placement, heap_size, timeout_s)`` joins the group and makes the heap
    (placements "cpu", "shared", "per_gpu"). ``wait_for_path`` waits, bounded, for a
    file a peer process publishes.

Device traps
    A trap worker runs one case on two ranks and reports how each ended:
    ``trap_case(rank, case, call)`` in the worker, ``trap_outcomes(worker, case, gpus)``
    and ``seconds_of(outcome)`` in the test. A trapped CUDA context is unusable, so the
    worker leaves with ``os._exit`` after printing its outcome.

pytest and torch are imported where they are used: workers import this module without
pytest, and the GPU checks answer "torch is not installed" instead of failing.
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from mori.core import timeouts
from mori.core.launch import NO_MULTICAST_ENV, WorkerResult, WorkersFailed, launch_local

# -- GPU skips ---------------------------------------------------------------------------


def visible_gpus() -> int:
    """CUDA GPUs torch sees (0 without torch or without a GPU)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_skip_reason(ext=None, min_gpus: int = 1) -> str | None:
    """Why CUDA tests cannot run here, or None when they can.

    ``ext``: the package's extension module (``mori.ep._C``, ``mori.ccl._C``), whose
    ``with_cuda`` says whether its kernels were built; ``min_gpus``: GPUs the test needs.
    """
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    import mori.core as mc

    info = mc.build_info()
    if not info.get("with_cuda"):
        return "libmori_core was built without CUDA"
    if ext is not None and not getattr(ext, "with_cuda", False):
        return f"{ext.__name__.removesuffix('._C')} was built without CUDA kernels"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    n = info.get("cuda_device_count", 0)
    if n == 0:
        return f"no CUDA device: {info.get('cuda_unavailable_reason')}"
    if n < min_gpus:
        return f"needs {min_gpus} GPUs, {n} visible"
    return None


def require_cuda(ext=None, min_gpus: int = 1) -> int:
    """The CUDA GPU count; skips the calling test (naming why) when CUDA tests cannot run
    here (``cuda_skip_reason``)."""
    import pytest

    reason = cuda_skip_reason(ext, min_gpus)
    if reason is not None:
        pytest.skip(reason)
    import mori.core as mc

    return int(mc.build_info().get("cuda_device_count", 0))


def needs_cuda(ext=None, min_gpus: int = 1):
    """A ``pytest.mark.skipif`` marker: skip, naming why, where ``cuda_skip_reason`` has
    a reason."""
    import pytest

    reason = cuda_skip_reason(ext, min_gpus)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


# -- ranks ------------------------------------------------------------------------------


def new_seed() -> int:
    """A fresh random seed, printed (pytest shows it when the test fails)."""
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    return seed


def run_ranks(
    argv: list[str],
    world_size: int,
    *,
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
    who: str = "rank",
) -> list[WorkerResult]:
    """Run ``argv`` (a worker's .py path and its arguments) as ``world_size`` local
    ranks and return their results in rank order.

    Every rank gets NVLink multicast off (``NO_MULTICAST_ENV``) plus ``env``. A rank
    that exits non-zero, or a group still running after ``timeout_s`` seconds, raises
    ``WorkersFailed`` with every rank's output; each rank's output is printed, and
    each must end with "``who`` N ok" (AssertionError otherwise)."""
    results = launch_local(
        [str(a) for a in argv], world_size, timeout_s=timeout_s,
        env={**NO_MULTICAST_ENV, **(env or {})},
    )  # fmt: skip
    for r in results:
        print(f"----- {who} {r.rank} -----\n{r.output}")
    for r in results:
        assert r.output.strip().endswith(f"{who} {r.rank} ok"), r.output
    return results


def start_rank(placement: str, heap_size: str | int, timeout_s: float):
    """A worker rank's start: (rank, world size, torch.device) from the launcher's
    environment, a gloo process group, and mori's symmetric heap of ``heap_size`` on
    that device: placement "cpu" is a host heap, "shared" puts every rank on GPU 0,
    "per_gpu" rank r on GPU r (made the current device)."""
    import torch
    import torch.distributed as dist

    from mori.core import shmem
    from mori.core.bench import rank_env

    rank, world, _ = rank_env()
    if placement == "cpu":
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", 0 if placement == "shared" else rank)
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method="env://")
    shmem.init(device=device.index if device.type == "cuda" else "cpu", heap_size=heap_size,
               timeout_s=timeout_s)  # fmt: skip
    return rank, world, device


def wait_for_path(path: str | Path, proc=None, timeout_s: float = 30.0, what: str = "") -> None:
    """Wait until ``path`` exists (a peer process publishing its descriptors), failing
    the test after ``timeout_s`` seconds or as soon as ``proc`` (a ``subprocess.Popen``)
    has exited; ``what`` names the wait in the failure."""
    path = Path(path)
    deadline = time.monotonic() + timeouts.seconds(timeout_s, "timeout_s")
    while not path.exists():
        exited = proc is not None and proc.poll() is not None
        if exited or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if exited else f"not there after {timeout_s:g}s"
            raise AssertionError(f"{what or 'waiting'}: {path.name} {why}")
        time.sleep(0.01)


# -- device traps ------------------------------------------------------------------------


def trap_report(rank: int, outcome: str) -> NoReturn:
    """Print this rank's outcome and "rank N ok", and leave the process at once (no
    teardown touches a CUDA context a trap has made unusable)."""
    print(f"rank {rank} outcome: {outcome}", flush=True)
    print(f"rank {rank} ok", flush=True)
    sys.stdout.flush()
    os._exit(0)


def trap_case(
    rank: int,
    case: str,
    call: Callable[[], None],
    *,
    completed: str = "call completed",
    absent_s: float = 8.0,
    stack_dump_s: float = 45.0,
) -> NoReturn:
    """Run one case of a device-trap worker on this rank and report how it ended.

    Case ``absent_peer`` (or a case ending in ``_absent_peer``): rank 1 stays away for ``absent_s`` seconds (longer than the
    op's timeout, so rank 0 must not wait for it) and reports "stayed away". Otherwise
    ``call()`` runs and the device is synchronized; the outcome is "InvalidArgumentError
    after S s: message" (the host refused the input; the rejection it posted for the
    peers is left to reach the GPU first), "CUDA error after S s: first line" (the
    kernel trapped), or ``completed``. A rank still in the case after ``stack_dump_s``
    seconds prints every thread's Python stack to stderr (and again each
    ``stack_dump_s``), so a host that never sees its kernel's trap shows where it waits
    in the output the test reports."""
    import faulthandler

    import torch

    import mori.core as mc

    faulthandler.dump_traceback_later(stack_dump_s, repeat=True)

    if (case == "absent_peer" or case.endswith("_absent_peer")) and rank == 1:
        time.sleep(absent_s)
        trap_report(rank, "stayed away")
    t0 = time.monotonic()
    try:
        call()
        torch.cuda.synchronize()
    except mc.InvalidArgumentError as e:
        torch.cuda.synchronize()
        trap_report(rank, f"InvalidArgumentError after {time.monotonic() - t0:.1f}s: {e}")
    except RuntimeError as e:  # torch.AcceleratorError: the kernel trapped
        first = str(e).splitlines()[0]
        trap_report(rank, f"CUDA error after {time.monotonic() - t0:.1f}s: {first}")
    trap_report(rank, completed)


def trap_outcomes(
    worker: str | Path,
    case: str,
    gpus: int,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    *,
    args: tuple[str, ...] = (),
    expected: dict[int, str] | None = None,
) -> list[tuple[str, str]]:
    """Run trap worker ``worker`` on ``case`` with 2 ranks (argv: case, ``args``,
    placement; one GPU per rank where there are 2, else both on GPU 0); [(outcome,
    output)] per rank: the outcome ``trap_report`` printed and the rank's whole output.
    ``expected`` ({rank: message}, for cases where both ranks trap): a group that hung
    only because the driver never reported a printed trap to one rank
    (``lost_trap_on_shared_gpu``) ends the test as xfail naming it."""
    import pytest

    placement = "per_gpu" if gpus >= 2 else "shared"
    try:
        results = run_ranks([worker, case, *args, placement], 2, timeout_s=timeout_s, env=env)
    except WorkersFailed as e:
        if expected and lost_trap_on_shared_gpu(e, expected):
            pytest.xfail(SHARED_GPU_LOST_TRAP)
        raise
    return [(outcome_of(r), r.output) for r in results]


def outcome_of(result: WorkerResult) -> str:
    """The outcome a trap worker's rank printed (``trap_report``: "rank N outcome: ...")."""
    m = re.search(rf"rank {result.rank} outcome: (.*)\n", result.output)
    assert m, result.output
    return m.group(1)


def seconds_of(outcome: str) -> float:
    """The seconds in a trap outcome ("... after 3.1s: ...")."""
    m = re.search(r"after ([0-9.]+)s", outcome)
    assert m, outcome
    return float(m.group(1))


# -- type stubs --------------------------------------------------------------------------


def parse_stub(path: str | Path) -> tuple[set[str], dict[str, dict]]:
    """A ``_C.pyi``'s public surface, for tests that keep a stub equal to its module:
    (top-level names, {class: {member: its ast.FunctionDef, or None for a field}})."""
    import ast

    names: set[str] = set()
    classes: dict[str, dict] = {}
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            members: dict = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
            members.update({n.target.id: None for n in node.body if isinstance(n, ast.AnnAssign)})
            classes[node.name] = members
    return names, classes


# Seen on 1 x H200 (driver 580.159.04): when two processes sharing a GPU trap within
# about half a second of each other, the one that trapped first may never see its
# launch fail — its cudaDeviceSynchronize spins for good — while the other sees it
# at once. A bare trap kernel does it (tests/test_trap_gpu.py in mori-core), so it is
# below mori; trapping again later does not help.
SHARED_GPU_LOST_TRAP = (
    "the CUDA driver never reported a trap to a rank whose kernel printed it while "
    "another process on the same GPU trapped too (known on 1 x H200, driver 580; "
    "mori-core's test_trap_gpu.py reproduces it with a bare trap kernel)"
)


def lost_trap_on_shared_gpu(err: BaseException, expected: dict[int, str]) -> bool:
    """Whether ``err`` (from ``run_ranks``/``launch_local``) is the driver's lost trap
    (SHARED_GPU_LOST_TRAP) and nothing else: the group timed out, every rank printed
    its ``expected`` message, and each rank still running was in a CUDA synchronize
    (its faulthandler or py-spy stack says ``synchronize``) after printing it."""
    results = getattr(err, "results", None)
    if results is None or "timed out" not in str(err):
        return False
    killed = 0
    for r in results:
        want = expected.get(r.rank)
        if want is not None and want not in r.output:
            return False
        if r.returncode != 0:
            killed += 1
            if r.returncode > 0 or re.search(r"\bsynchronize\b", r.output) is None:
                return False
    return killed > 0
