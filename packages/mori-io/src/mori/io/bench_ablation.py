# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Hot-path ablation: ``python -m mori.io.bench --ablate``.

Each switch of the engine's ``HotPathOptions`` (``csrc/engine/io_engine.hpp``, read
once per engine from the environment) is turned off alone, then all of them together,
beside the defaults, on one point of each of MORI's three presets (``bench.PRESETS``:
their flags, with one message size instead of the sweep and fewer iterations,
``ABLATION_POINTS``), over TCP and over SHM (CMA: numpy buffers; mapped: shared host
memory). Every run is a fresh ``python -m mori.io.bench`` pair (so every engine reads
its switches anew), which verifies the bytes of every transfer as usual. Repetitions
are interleaved: each repetition runs every (backend, preset) cell's variants back to
back, their order rotated, so the default of a cell is measured next to each variant in
every repetition and drift of a shared machine hits them alike.

Per cell and variant the table gives transfers/s, the median latency of one iteration
(its whole batch) and CPU µs per transfer of the initiator and the target, each as the
median over repetitions with min–max; Δ is the median over repetitions of the paired
change against the default of the same repetition. A switch that cannot act on a
backend (``NULL_SWITCHES``: CMA grants on mapped memory, say) measures the noise of
that cell: the largest of those changes is the cell's noise floor.

The verdict per mechanism follows the bar MORI's maintainer set: keep it if, in at
least one cell, the defaults give ≥ 10 % more transfers/s than the run without it, or
≥ 20 % less CPU per transfer (initiator + target) with transfers/s within 10 %, and
in no cell ≥ 10 % fewer transfers/s; otherwise remove it. A cell counts only where the
switch can act, where the change also passes the cell's noise floor, and where at least
80 % of the repetitions agree in sign. RDMA is not run: the bench has no RDMA backend
flag, and it would need a NIC (``/sys/class/infiniband``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from mori.core import bench as scaffold
from mori.io.bench_presets import expand_preset

# (name, environment variable, value that turns the mechanism off)
# (The lock-free endpoint read, the epoch snapshot of sessions, the ledger ring and
# target batching were switches here and were removed after meeting the bar nowhere:
# BENCHMARKS.md, ablation.)
SWITCHES = [
    ("SHM mapping", "MORI_IO_SHM_MAP", "0"),
    ("notice ring", "MORI_IO_NOTICE_RING", "0"),
    ("CMA grant cache", "MORI_IO_CMA_CACHE", "0"),
    ("SHM copy in shares", "MORI_IO_SHM_SPLIT_BYTES", "0"),
    ("liveness word", "MORI_IO_SHM_LIVENESS_WORD", "0"),
    ("TCP waiter reads", "MORI_IO_TCP_WAITER_READS", "0"),
    ("TCP busy poll", "MORI_IO_TCP_BUSY_POLL_US", "0"),
]

# One point of each preset's regime: a size in place of the sweep, fewer iterations.
ABLATION_POINTS = {
    "mw-chunkoff": ["--buffer-size", "4K", "--iters", "128"],
    "mw-chunkon": ["--buffer-size", "2M", "--iters", "16", "--warmup", "2"],  # 2 parts each
    "hi-iops": ["--iters", "128"],
}
BACKENDS = {
    "tcp": ["--backend", "tcp"],
    "shm-cma": ["--backend", "shm", "--host-alloc", "numpy"],
    "shm-map": ["--backend", "shm", "--host-alloc", "shared"],
}
DEFAULT, ALL_OFF = "defaults", "all off"
METRICS = ("xfer_per_s", "p50_lat_us", "cpu_us_init", "cpu_us_target")


def preset_point(preset: str, iters: int | None = None) -> list[str]:
    """The preset's flags without its sweep, then the point's size and iterations
    (``iters`` overrides those)."""
    argv, out, i = expand_preset(preset), [], 0
    while i < len(argv):
        if argv[i] == "--all":
            i += 1
        elif argv[i] in ("--sweep-start-size", "--sweep-max-size", "--iters"):
            i += 2
        else:
            out.append(argv[i])
            i += 1
    point = list(ABLATION_POINTS[preset])
    if iters is not None:
        for flag in ("--iters", "--warmup"):
            if flag in point:
                j = point.index(flag)
                del point[j : j + 2]
        point += ["--iters", str(iters), "--warmup", "1"]
    return out + point


def variants(switch_vars: list[str] | None = None) -> list[tuple[str, dict[str, str]]]:
    """[(name, environment)]: the defaults, each chosen switch off alone, all of them off."""
    chosen = [s for s in SWITCHES if switch_vars is None or s[1] in switch_vars]
    out = [(DEFAULT, {})]
    out += [(f"{name} off", {var: off}) for name, var, off in chosen]
    out.append((ALL_OFF, {var: off for _, var, off in chosen}))
    return out


def run_one(argv: list[str], env_over: dict[str, str], timeout_s: float) -> dict:
    """One bench pair; its single row, or {"error": why}."""
    env = {k: v for k, v in os.environ.items() if k not in {s[1] for s in SWITCHES}}
    env.update(env_over)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "row.json")
        cmd = [sys.executable, "-m", "mori.io.bench", *argv, "--reps", "1", "--no-baseline",
               "--json", path, "--timeout-s", str(timeout_s)]  # fmt: skip
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s + 30)
        except subprocess.TimeoutExpired:
            return {"error": f"ran past {timeout_s + 30:.0f} s"}
        if p.returncode != 0 or not os.path.exists(path):
            lines = (p.stderr + p.stdout).strip().splitlines() or ["(no output)"]
            return {"error": f"exit {p.returncode}: {lines[-1][-300:]}"}
        with open(path) as f:
            return json.load(f)["rows"][0]


# Switches that cannot act in a backend's runs: TCP-only engines copy nothing on the
# same host, and numpy buffers cannot be mapped, mapped regions need no CMA grant, SHM
# transfers send no TCP request a waiter or a polling reactor would see. Their
# paired changes are the cell's noise floor.
NULL_SWITCHES = {
    "tcp": {"MORI_IO_SHM_MAP", "MORI_IO_NOTICE_RING", "MORI_IO_CMA_CACHE",
            "MORI_IO_SHM_LIVENESS_WORD", "MORI_IO_SHM_SPLIT_BYTES"},
    "shm-cma": {"MORI_IO_SHM_MAP", "MORI_IO_TCP_WAITER_READS", "MORI_IO_TCP_BUSY_POLL_US"},
    "shm-map": {"MORI_IO_CMA_CACHE", "MORI_IO_TCP_WAITER_READS", "MORI_IO_TCP_BUSY_POLL_US"},
}  # fmt: skip


def _cpu(row: dict) -> float:
    return row["cpu_us_init"] + row["cpu_us_target"]


def _paired(runs: list[dict], base: list[dict], value) -> list[float]:
    """value(run) / value(default of the same repetition) - 1, per repetition."""
    return [value(r) / value(b) - 1 for r, b in zip(runs, base, strict=True)
            if "error" not in r and "error" not in b and value(b) > 0]  # fmt: skip


def _null_vars(cell: str) -> set[str]:
    return NULL_SWITCHES.get(cell.split(" / ")[0], set())


def summarize(results: dict) -> dict:
    """{cell: {variant: {metric: (median, min, max), "d_<metric>": (median, min, max) of
    the paired changes, "d_<metric>_reps": [per repetition]}, "noise": float}}."""
    names = {f"{name} off": var for name, var, _ in SWITCHES}
    out = {}
    for cell, by_variant in results.items():
        base = by_variant[DEFAULT]
        out[cell] = {}
        noise = 0.0
        for name, runs in by_variant.items():
            ok = [r for r in runs if "error" not in r]
            s: dict = {"runs": len(runs), "failed": [r["error"] for r in runs if "error" in r]}
            for m in METRICS:
                vals = [r[m] for r in ok]
                if vals:
                    s[m] = (statistics.median(vals), min(vals), max(vals))
            if name != DEFAULT:
                for m, value in (
                    ("xfer_per_s", lambda r: r["xfer_per_s"]),
                    ("p50_lat_us", lambda r: r["p50_lat_us"]),
                    ("cpu_total", _cpu),
                ):
                    d = _paired(runs, base, value)
                    if d:
                        s["d_" + m] = (statistics.median(d), min(d), max(d))
                        s["d_" + m + "_reps"] = d
                if names.get(name) in _null_vars(cell) and "d_xfer_per_s" in s:
                    noise = max(noise, abs(s["d_xfer_per_s"][0]))
            out[cell][name] = s
        out[cell]["noise"] = noise
    return out


def _consistent(values: list[float], sign: int) -> bool:
    """At least 80 % of the repetitions on the side of ``sign`` (one of 5 may disagree)."""
    return bool(values) and sum(1 for v in values if v * sign > 0) >= 0.8 * len(values)


def verdicts(summary: dict, switch_vars: list[str] | None = None) -> list[dict]:
    """Per mechanism: keep or remove by the bar in the module docstring. A cell counts
    for or against a mechanism only where the switch can act, where the median paired
    change passes both the bar and the cell's noise floor (the largest change of a
    switch that cannot act there), and where at least 80 % of the repetitions agree in
    sign. Gains are what the mechanism gives (the defaults against it off)."""
    out = []
    for name, var, _ in SWITCHES:
        if switch_vars is not None and var not in switch_vars:
            continue
        key = f"{name} off"
        wins, losses, cells = [], [], []
        for cell, by_variant in summary.items():
            s = by_variant.get(key)
            if var in _null_vars(cell) or not s or "d_xfer_per_s" not in s:
                continue
            # off/on - 1 -> on/off - 1: what turning the mechanism on gives.
            gain = 1 / (1 + s["d_xfer_per_s"][0]) - 1
            cpu_less = 1 - 1 / (1 + s["d_cpu_total"][0]) if "d_cpu_total" in s else 0.0
            bar = max(0.10, by_variant["noise"])
            entry = {"cell": cell, "xfer_gain": gain, "cpu_less": cpu_less,
                     "noise": by_variant["noise"]}  # fmt: skip
            cells.append(entry)
            d_x, d_c = s["d_xfer_per_s_reps"], s.get("d_cpu_total_reps", [])
            if gain >= bar and _consistent(d_x, -1):
                wins.append(entry)
            elif cpu_less >= 0.20 and abs(gain) < bar and _consistent(d_c, +1):
                wins.append(entry)
            if gain <= -bar and _consistent(d_x, +1):
                losses.append(entry)
        best = max(cells, key=lambda e: e["xfer_gain"], default=None)
        verdict = "keep" if wins and not losses else ("mixed" if wins else "remove")
        out.append({"mechanism": name, "env": var, "verdict": verdict, "wins": wins,
                    "losses": losses, "best": best, "cells": cells})  # fmt: skip
    return out


def _fmt(t, fmt: str) -> str:
    return f"{t[0]:{fmt}} ({t[1]:{fmt}}–{t[2]:{fmt}})" if t else "–"


def _pct(t) -> str:
    return f"{t[0] * 100:+.0f} % ({t[1] * 100:+.0f}…{t[2] * 100:+.0f})" if t else ""


def format_tables(summary: dict, verdict_rows: list[dict]) -> str:
    lines = [
        "| backend / preset | variant | Xfer/s | Δ Xfer/s | P50 lat µs | Δ lat | CPU µs/xfer init "
        "| CPU µs/xfer target | Δ CPU init+target |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell, by_variant in summary.items():
        for name, s in by_variant.items():
            if name == "noise":
                continue
            if not any(m in s for m in METRICS):
                why = s["failed"][0] if s["failed"] else "no run"
                lines.append(f"| {cell} | {name} | failed: {why} | | | | | | |")
                continue
            fail = f" [{len(s['failed'])} failed]" if s["failed"] else ""
            lines.append(
                f"| {cell} | {name}{fail} | {_fmt(s.get('xfer_per_s'), ',.0f')} | "
                f"{_pct(s.get('d_xfer_per_s'))} | {_fmt(s.get('p50_lat_us'), '.1f')} | "
                f"{_pct(s.get('d_p50_lat_us'))} | {_fmt(s.get('cpu_us_init'), '.2f')} | "
                f"{_fmt(s.get('cpu_us_target'), '.2f')} | {_pct(s.get('d_cpu_total'))} |"
            )
    lines += ["", "| cell | noise floor (largest \\|Δ Xfer/s\\| of a switch that cannot act) |",
              "|---|---:|"]  # fmt: skip
    for cell, by_variant in summary.items():
        lines.append(f"| {cell} | {by_variant['noise'] * 100:.0f} % |")
    lines += ["", "| mechanism | switch | verdict | best cell: Xfer/s and CPU per transfer "
              "with it (vs off) | cells meeting the bar | cells where it costs |",
              "|---|---|---|---|---|---|"]  # fmt: skip

    def one(e: dict) -> str:
        return (f"{e['cell']} ({e['xfer_gain'] * 100:+.0f} % Xfer/s, "
                f"{-e['cpu_less'] * 100:+.0f} % CPU)")  # fmt: skip

    for v in verdict_rows:
        best = one(v["best"]) if v["best"] else "–"
        wins = ", ".join(one(w) for w in v["wins"]) or "none"
        losses = ", ".join(one(w) for w in v["losses"]) or "none"
        lines.append(f"| {v['mechanism']} | `{v['env']}` | **{v['verdict']}** | {best} | "
                     f"{wins} | {losses} |")  # fmt: skip
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ablation's flags, in their own group of ``python -m mori.io.bench``'s parser."""
    a = parser.add_argument_group("hot-path ablation (mori.io.bench_ablation)")
    a.add_argument("--ablate", action="store_true", help="run the ablation instead")
    a.add_argument("--ablate-reps", type=int, default=5, help="interleaved repetitions")
    a.add_argument("--ablate-backends", default="tcp,shm-cma,shm-map", help="comma-separated")
    a.add_argument(
        "--ablate-presets", default="mw-chunkoff,mw-chunkon,hi-iops", help="comma-separated"
    )
    a.add_argument(
        "--ablate-switches", help="environment variables to ablate (default: all switches)"
    )
    a.add_argument("--ablate-iters", type=int, help="timed iterations per run (default: per point)")
    a.add_argument(
        "--ablate-deadline-s", type=float, default=0.0,
        help="start no repetition that would end past this many seconds (0: no limit)",
    )  # fmt: skip


def main(args) -> int:
    """Run the ablation for ``mori.io.bench.parse_args``'s namespace (``--ablate``)."""
    if args.ablate_reps < 1:
        raise SystemExit("--ablate-reps must be >= 1")
    backends = args.ablate_backends.split(",")
    presets = args.ablate_presets.split(",")
    for b in backends:
        if b not in BACKENDS:
            raise SystemExit(f"--ablate-backends: unknown {b!r}; known: {', '.join(BACKENDS)}")
    for p in presets:
        if p not in ABLATION_POINTS:
            raise SystemExit(
                f"--ablate-presets: unknown {p!r}; known: {', '.join(ABLATION_POINTS)}"
            )
    switch_vars = args.ablate_switches.split(",") if args.ablate_switches else None
    known = {s[1] for s in SWITCHES}
    for v in switch_vars or []:
        if v not in known:
            raise SystemExit(f"--ablate-switches: unknown {v!r}; known: {', '.join(sorted(known))}")
    vs = variants(switch_vars)
    cells = [(b, p) for b in backends for p in presets]
    results: dict = {f"{b} / {p}": {name: [] for name, _ in vs} for b, p in cells}
    argvs = {f"{b} / {p}": BACKENDS[b] + preset_point(p, args.ablate_iters) for b, p in cells}
    m = scaffold.machine()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rdma = os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")
    print(f"mori.io.bench --ablate: {len(cells)} cells x {len(vs)} variants x "
          f"{args.ablate_reps} repetitions, interleaved; {m['cpu']}, {m['cores']} cores, "
          f"load {os.getloadavg()[0]:.2f}, {started}", flush=True)  # fmt: skip
    print("RDMA: not run (" + ("the bench has no RDMA backend flag" if rdma else
          "no RDMA NIC here: /sys/class/infiniband is empty or absent") + ")", flush=True)  # fmt: skip
    t0, reps_done = time.monotonic(), 0
    for rep in range(args.ablate_reps):
        # Only whole repetitions count (each pairs every variant with the defaults of
        # its own repetition): stop before one that would end past the deadline.
        per_rep = (time.monotonic() - t0) / rep if rep else 0.0
        if args.ablate_deadline_s and time.monotonic() - t0 + per_rep > args.ablate_deadline_s:
            print(f"stopping after {rep} repetition(s): another would end past "
                  f"--ablate-deadline-s {args.ablate_deadline_s:g}", flush=True)  # fmt: skip
            break
        for ci, (b, p) in enumerate(cells):
            cell = f"{b} / {p}"
            k = (rep + ci) % len(vs)
            for name, env in vs[k:] + vs[:k]:
                row = run_one(argvs[cell], env, args.timeout_s)
                results[cell][name].append(row)
                if "error" in row:
                    print(f"rep {rep + 1} {cell} {name}: FAILED {row['error']}", flush=True)
        reps_done = rep + 1
        print(f"repetition {rep + 1}/{args.ablate_reps} done, load {os.getloadavg()[0]:.2f}, "
              f"compiler processes {scaffold.compilers_running()}", flush=True)  # fmt: skip
    summary = summarize(results)
    verdict_rows = verdicts(summary, switch_vars)
    print()
    for cell, argv in argvs.items():
        print(f"{cell}: python -m mori.io.bench {' '.join(argv)} --reps 1 --no-baseline")
    print()
    print(format_tables(summary, verdict_rows))
    if args.json:
        doc = {"benchmark": "mori.io.bench --ablate", "started": started,
               "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": m, "argv": argvs, "variants": vs, "reps": args.ablate_reps,
               "reps_done": reps_done, "results": results, "verdicts": verdict_rows}  # fmt: skip
        scaffold.write_json(args.json, doc, note="json written to {}")
    failed = sum(1 for c in results.values() for runs in c.values() for r in runs if "error" in r)
    return 1 if failed else 0
