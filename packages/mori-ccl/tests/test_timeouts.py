# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ccl's timeouts on a host heap among real processes: the rules of
mori.core.timeouts (inf and huge values mean "practically forever"; NaN, zero and
negative values are refused naming the value), and a timed-out call failing on every
rank, also on one that arrives after the others gave up."""

import math
from pathlib import Path

import pytest

import mori.ccl as ccl
import mori.core as mc
from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "timeouts_worker.py")
ENV = {"MORI_SHMEM_HEAP_SIZE": "16M", "CUDA_VISIBLE_DEVICES": ""}
BAD = [(math.nan, "nan"), (0.0, "0"), (-1.0, "-1"), (-math.inf, "-inf")]


@pytest.mark.parametrize("huge", ["inf", "1e300", "1e10"])
def test_huge_timeouts_wait_for_a_late_rank(huge):
    # Converted by hand before, inf expired at once ("within -9223372036854775808 ms")
    # and the late rank's call succeeded while the other's failed.
    run_ranks([WORKER, "huge", str(new_seed()), huge], 2, timeout_s=120, env=ENV)


def test_a_rank_that_comes_after_a_timeout_fails_the_call_too():
    run_ranks([WORKER, "late", str(new_seed())], 2, timeout_s=120, env=ENV)


@pytest.mark.parametrize(("bad", "text"), BAD)
def test_bad_timeouts_are_refused_naming_the_value(bad, text):
    with pytest.raises(mc.InvalidArgumentError, match=f"timeout_s {text} must be > 0"):
        ccl.Communicator(timeout_s=bad)
    # The binding applies the same rule before the constructor sees its block.
    with pytest.raises(mc.InvalidArgumentError, match=f"timeout_s {text} must be > 0"):
        ccl._C.CommunicatorCpu(0, 1, bad)
