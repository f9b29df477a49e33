# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The demo's tensor-parallel scene (examples/demo.py --scene tp): mori.ccl's
all-reduce of a row-parallel layer's partial products on 2 processes agrees with
the whole layer computed in one process, within the fp32 reordering bound, on
every rank, and the run prints its timings beside torch.distributed's."""

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def test_tp_scene_matches_the_single_process_layer():
    out = subprocess.run(
        [sys.executable, str(DEMO), "--scene", "tp"], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Warning" not in out.stderr and "Warning" not in out.stdout, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1] in ("0", "1")]
    assert len(rows) == 2, out.stdout
    for row in rows:
        assert row[3] == "yes", out.stdout  # within the fp32 bound
        assert float(row[4]) > 0 and float(row[5]) > 0, out.stdout  # both timed
