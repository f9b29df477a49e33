# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ep.balanced.Buffer on CPU among real processes (host symmetric heap, gloo):
tests/workers/balanced_worker.py states what each scenario checks."""

from pathlib import Path

import pytest

from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "balanced_worker.py")


def _run(mode, world, S, H, K, epn, pad, timeout_s=240):
    argv = [WORKER, mode, str(new_seed()), *(str(v) for v in (S, H, K, epn, pad))]
    return run_ranks(argv, world, timeout_s=timeout_s)


# (world, S, H, K, epn, token_padding): every routing kind at each world size; world
# 8 once (8 processes share CI's 2 cores).
@pytest.mark.parametrize(
    ("world", "S", "H", "K", "epn", "pad"),
    [(2, 24, 32, 4, 3, 8), (2, 9, 12, 8, 1, 1), (4, 16, 32, 6, 2, 4), (8, 8, 16, 4, 2, 128)],
)
def test_data_paths(world, S, H, K, epn, pad):
    _run("paths", world, S, H, K, epn, pad)


@pytest.mark.parametrize("world", [2, 4])
def test_bad_input_is_refused_on_every_rank(world):
    _run("errors", world, 8, 16, 4, 2, 4)


def test_a_missing_rank_is_named_within_the_timeout():
    _run("timeout", 2, 8, 16, 2, 2, 4, timeout_s=120)


@pytest.mark.parametrize("mode", ["maxvio", "prefetch"])
def test_bench_runs_on_cpu(mode, tmp_path):
    # The bench end to end on a host heap (its numbers are not the product's): maxvio
    # asserts that every rank receives exactly S*K rows at every imbalance.
    import json
    import subprocess
    import sys

    out = tmp_path / "b.json"
    cmd = [sys.executable, "-m", "mori.ep.bench_balanced", mode, "--device", "cpu",
           "--world-size", "2", "--tokens", "16", "--iters", "1", "--json", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=300)
    doc = json.loads(out.read_text())
    assert doc["meta"]["ranks"] == 2
    if mode == "maxvio":
        assert [r["target"] for r in doc["records"]] == [0.2, 1.0, 10.0, 20.0]
        assert all(r["rows_balanced"] == 16 * 2 for r in doc["records"])
    else:
        assert len(doc["records"]) == 14
        assert all(r["worst_us"] > 0 for r in doc["records"])
