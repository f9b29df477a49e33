# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Scaffolding shared by mori's benchmarks (``python -m mori.core.bench_shmem``,
``mori.io.bench``, ``mori.ep.bench``, ``mori.ccl.bench``).

Command line: ``parse_size`` ("4K", "1M", "2GiB"), ``comma_list``,
``add_output_args`` (``--json``, and ``--plot``/``--replot`` where the bench draws).
Output: ``table`` (tabulate, one float format), ``format_size``, ``machine``
(the host's CPU, cores, kernel, name), ``compilers_running`` (other builds skew a
shared machine's runs), ``write_json``, ``pyplot`` (matplotlib's, or None with a
note) and ``replot`` (``--replot JSON --plot PATH``: draw an earlier run, no run).
Ranks: ``is_rank`` (are we one of the ranks, or the launcher?), ``rank_env``,
``pick_device``, ``default_world_size``, ``launch_ranks`` (start ``python -m <bench>``
as local ranks with NVLink multicast off, bounded in time, and print rank 0's output)
and ``run_or_launch`` (a bench's ``main``: the worker in a rank, the ranks otherwise).

Nothing here imports torch, numpy or matplotlib at import time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence

from mori.core import env
from mori.core.errors import InvalidArgumentError
from mori.core.launch import NO_MULTICAST_ENV, WorkersFailed, launch_local

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

# -- command line -------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Bytes from "4096", "4K", "1.5M", "2G", "4KB" or "1MiB" (binary units)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    if t and t[-1] in _UNITS:
        return int(float(t[:-1]) * _UNITS[t[-1]])
    return int(t)


def format_size(n: int) -> str:
    """ "4K", "1M", "2G" where ``n`` is a whole number of them, else the bytes."""
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def comma_list(text: str) -> list[str]:
    """The non-empty, stripped items of a comma-separated argument."""
    return [v.strip() for v in text.split(",") if v.strip()]


def add_output_args(
    parser: argparse.ArgumentParser,
    json_help: str = "write the results here (rank 0)",
    plot_help: str | None = None,
) -> None:
    """``--json PATH``; with ``plot_help`` also ``--plot PATH`` and ``--replot JSON`` (no
    run: draw ``--plot`` from an earlier ``--json``; ``replot`` handles it)."""
    parser.add_argument("--json", help=json_help)
    if plot_help is not None:
        parser.add_argument("--plot", help=plot_help)
        parser.add_argument(
            "--replot", metavar="JSON",
            help="no run: draw --plot from a --json file of an earlier run (e.g. from a GPU host)",
        )  # fmt: skip


# -- output -------------------------------------------------------------------------------


def table(rows: Sequence[Sequence], headers: Sequence[str], **tabulate_kwargs) -> str:
    """``rows`` under ``headers`` as tabulate draws them (floats with one decimal unless
    ``floatfmt`` says otherwise; other tabulate options pass through)."""
    from tabulate import tabulate

    tabulate_kwargs.setdefault("floatfmt", ".1f")
    return tabulate(rows, headers=headers, **tabulate_kwargs)


def machine() -> dict:
    """The host a run measured: CPU model, cores, kernel release, host name."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "host": platform.node()}  # fmt: skip


def compilers_running() -> int:
    """Compiler processes running now (other builds on a shared machine skew the runs)."""
    try:
        p = subprocess.run(["pgrep", "-c", "-f", "cc1plus|nvcc|cicc|ptxas"],
                           capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return int(p.stdout.strip() or 0)


def write_json(path: str, doc, indent: int = 2, note: str | None = "wrote {}") -> None:
    """Write ``doc`` to ``path`` as JSON; print ``note`` (with the path) unless None."""
    with open(path, "w") as f:
        json.dump(doc, f, indent=indent)
    if note is not None:
        print(note.format(path))


def pyplot(path: str):
    """matplotlib.pyplot on the Agg backend, or None (saying that no plot is written to
    ``path``) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed; no plot written")
        return None
    return plt


def replot(args: argparse.Namespace, draw: Callable[[dict, str], None]) -> bool:
    """With ``--replot JSON``: ``draw(the JSON document, --plot path)`` and True (the
    bench runs nothing); SystemExit without ``--plot``. False without ``--replot``."""
    if not getattr(args, "replot", None):
        return False
    if not args.plot:
        raise SystemExit("--replot needs --plot PATH")
    with open(args.replot) as f:
        draw(json.load(f), args.plot)
    return True


# -- ranks --------------------------------------------------------------------------------


def is_rank() -> bool:
    """True in a rank (under torchrun or ``launch_ranks``), False in the launcher."""
    return "RANK" in os.environ


def rank_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment."""
    rank = env.get_int("RANK", -1, 0, 1 << 30)
    world = env.get_int("WORLD_SIZE", -1, 1, 1 << 30)
    if rank < 0 or world < 0:
        raise InvalidArgumentError("bench: RANK and WORLD_SIZE must be set (torchrun's variables)")
    return rank, world, env.get_int("LOCAL_RANK", rank, 0, 1 << 30)


def pick_device(device: str, local_rank: int, ext=None) -> tuple[bool, int | None, int]:
    """(cuda, CUDA device or None, visible GPUs) for ``--device auto|cuda|cpu``.

    CUDA where torch sees a GPU, libmori_core and the package's extension ``ext`` were
    built with CUDA, and ``device`` is not "cpu"; the rank then takes GPU
    ``local_rank % gpus`` (and makes it current). ``--device cuda`` without CUDA is a
    SystemExit."""
    import torch

    import mori.core as mc

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ok = gpus > 0 and bool(mc.build_info().get("with_cuda"))
    ok = ok and (ext is None or bool(getattr(ext, "with_cuda", False)))
    if device == "cuda" and not ok:
        raise SystemExit("--device cuda: no CUDA GPU, or mori built without CUDA")
    cuda = ok and device != "cpu"
    dev = local_rank % gpus if cuda else None
    if cuda:
        torch.cuda.set_device(dev)
    return cuda, dev, gpus


def default_world_size(device: str) -> int:
    """Ranks to start: one per visible GPU, 2 to 8 (2 on CPU or without torch)."""
    if device == "cpu":
        return 2
    try:
        import torch
    except ImportError:
        return 2
    return max(2, min(8, torch.cuda.device_count()))


def heap_bytes(n: int) -> int:
    """``n`` rounded up to whole 2 MiB (a symmetric heap's granule)."""
    return (n + (2 << 20) - 1) // (2 << 20) * (2 << 20)


def launch_ranks(
    module: str,
    argv: Sequence[str],
    world_size: int,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> int:
    """Run ``python -m module argv`` as ``world_size`` local ranks (environment: NVLink
    multicast off, then ``env``), bounded by ``timeout_s``; print rank 0's output and
    return 0, or print every rank's output to stderr and return 1."""
    try:
        results = launch_local(
            [sys.executable, "-m", module, *argv], world_size, timeout_s=timeout_s,
            env={**NO_MULTICAST_ENV, **(env or {})},
        )  # fmt: skip
    except WorkersFailed as e:
        print(e, file=sys.stderr)
        return 1
    print(results[0].output, end="")
    return 0


def run_or_launch(
    module: str, argv: Sequence[str], args, worker, world_size: int | None = None
) -> int:
    """The ``main`` of a bench whose ranks run ``worker(args)``: in a rank, run it and
    return 0; in the launcher, start ``python -m module argv`` as ``world_size`` ranks
    (default: ``--world-size``, else ``default_world_size(--device)``) with
    ``launch_ranks`` and return its code."""
    if is_rank():
        worker(args)
        return 0
    if world_size is None:
        world_size = getattr(args, "world_size", None)
    if world_size is None:
        world_size = default_world_size(getattr(args, "device", "auto"))
    return launch_ranks(module, argv, world_size, args.timeout_s)
