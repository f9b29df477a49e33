# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""python -m mori.ccl.bench end to end: on CPU (host heap beside gloo, a check of the
bench, not a measurement) and, where a CUDA GPU is visible, 2 processes on it (a smoke
run; NCCL refuses two ranks on one GPU and is reported as skipped there)."""

import json
import subprocess
import sys

import pytest

from mori.ccl.bench import bus_factor, parse_args


def _bench(tmp_path, *extra) -> dict:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "mori.ccl.bench", "--world-size", "2", "--iters", "2"]
    proc = subprocess.run(
        [*cmd, *extra, "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(proc.stdout)
    return json.loads(out.read_text())


def test_cpu_rows_match_gloo(tmp_path):
    doc = _bench(tmp_path, "--device", "cpu", "--max-size", "8K")
    rows = doc["records"]
    impls = {(r["op"], r["impl"]) for r in rows}
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert (op, "gloo") in impls, impls
    assert ("all_reduce", "mori:one_shot") in impls and ("all_reduce", "mori:two_shot") in impls
    for r in rows:
        assert r["check"] == ("exact" if r["impl"] == "gloo" else "=gloo"), r
        assert r["time_us"] > 0 and r["busbw"] == pytest.approx(r["algbw"] * bus_factor(r["op"], 2))
    assert {r["size"] for r in rows if r["op"] == "all_reduce"} == {1024, 8192}


def test_gpu_smoke_two_processes(tmp_path, cuda_gpus):
    # Two processes on one GPU: NCCL is tried (and reported skipped), SymmetricMemory not.
    extra = ["--no-symm"] if cuda_gpus < 2 else []
    doc = _bench(tmp_path, "--max-size", "1M", "--sizes", "1K,8K,1M", *extra)
    rows = doc["records"]
    mori = [r for r in rows if r["impl"].startswith("mori:")]
    assert {r["mode"] for r in mori} == {"graph", "eager"}, rows
    assert all(r["check"] in ("exact", "=nccl") for r in mori), mori
    assert {"mori:one_shot", "mori:two_shot", "mori:one_shot_ll"} <= {r["impl"] for r in mori}
    assert {"mori:copy_engine", "mori:sm"} <= {r["impl"] for r in mori if r["op"] == "all_gather"}
    # The same calls on symmetric inputs, read in place.
    assert {"mori:one_shot+zc", "mori:two_shot+zc", "mori:sm+zc"} <= {r["impl"] for r in mori}


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 4) == bus_factor("all_to_all", 4) == 3 / 4
    assert parse_args(["--max-size", "64K"]).sizes == [1024, 8192, 65536]
