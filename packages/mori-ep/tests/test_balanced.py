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
    [(2, 24, 32, 4, 3, 8), (2, 9, 16, 8, 1, 1), (4, 16, 32, 6, 2, 4), (8, 8, 16, 4, 2, 128)],
)
def test_data_paths(world, S, H, K, epn, pad):
    _run("paths", world, S, H, K, epn, pad)


@pytest.mark.parametrize("world", [2, 4])
def test_bad_input_is_refused_on_every_rank(world):
    _run("errors", world, 8, 16, 4, 2, 4)
