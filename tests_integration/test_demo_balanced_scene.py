# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The demo's balanced MoE scene (examples/demo.py --scene balanced): under a router
skewed towards two experts of rank 0, every rank computes exactly S*K rows with
mori.ep.balanced, and the layer's output agrees with one process's dense layer."""

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def test_balanced_scene_matches_the_dense_layer():
    out = subprocess.run(
        [sys.executable, str(DEMO), "--scene", "balanced"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1] in ("0", "1")]
    assert len(rows) == 2, out.stdout
    assert [int(r[2]) for r in rows] == [64 * 4, 64 * 4], out.stdout  # balanced: S*K each
    assert int(rows[0][1]) > 64 * 4, out.stdout  # the hot rank would get more without it
    assert all(float(r[4]) < 2e-2 for r in rows), out.stdout
