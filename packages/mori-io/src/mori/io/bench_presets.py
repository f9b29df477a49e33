# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MORI's three regimes for ``python -m mori.io.bench --preset`` (and the ablation's
points, ``mori.io.bench_ablation``): their argument vectors."""

from __future__ import annotations

_MORI_COMMON = ["--op-type", "write", "--enable-sess", "--enable-batch-transfer"]
_SWEEP_1K_16M = ["--all", "--sweep-start-size", "1K", "--sweep-max-size", "16M"]
PRESETS: dict[str, list[str]] = {
    # MORI's three regimes for judging CPU-overhead changes, as the argument vectors its
    # profile-guided hot-path change ran its benchmark with. They go before the command
    # line, so a flag given there wins over the preset's value.
    "mw-chunkoff": [*_MORI_COMMON, "--disable-chunking", "--transfer-batch-size", "64",
                    *_SWEEP_1K_16M, "--iters", "128",
                    "--num-worker-threads", "2", "--num-qp-per-transfer", "4"],
    "mw-chunkon": [*_MORI_COMMON, "--transfer-batch-size", "64",
                   *_SWEEP_1K_16M, "--iters", "256",
                   "--num-worker-threads", "4", "--num-qp-per-transfer", "4"],
    "hi-iops": [*_MORI_COMMON, "--disable-chunking", "--buffer-size", "512",
                "--transfer-batch-size", "256", "--iters", "512",
                "--num-worker-threads", "8", "--num-qp-per-transfer", "8",
                "--num-initiator-dev", "8", "--num-target-dev", "8"],
}  # fmt: skip


def expand_preset(name: str | None) -> list[str]:
    """The arguments preset ``name`` stands for (none for None); they are parsed before
    the command line, so an explicit flag overrides the preset's value."""
    return list(PRESETS[name]) if name else []
