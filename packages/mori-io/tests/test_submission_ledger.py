# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""SubmissionLedger: admission boundary, out-of-order release, ids never reused,
concurrent admission and release."""

import random

import pytest

from mori.io import _C

T = getattr(_C, "_testing", None)  # test builds only; conftest skips io_testing tests without
pytestmark = pytest.mark.io_testing


def test_admission_limit_bounds_the_live_records():
    led = T.SubmissionLedger(7)
    assert led.admission_limit == 7
    ids = [led.admit() for _ in range(7)]
    assert ids == list(range(7)) and led.live == 7
    assert led.admit() is None  # at the limit: refused, nothing changes
    assert led.live == 7
    assert led.release(ids[3])  # any record frees a place, not only the oldest
    assert led.admit() == 7  # one freed, one admitted
    assert led.admit() is None


def test_out_of_order_release_reuse_and_stale_ids():
    led = T.SubmissionLedger(4)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    live: list[int] = []
    released: list[int] = []
    next_id = 0
    for _ in range(5000):
        if live and (len(live) == led.admission_limit or rng.random() < 0.5):
            rid = live.pop(rng.randrange(len(live)))
            assert led.release(rid)
            assert not led.is_live(rid)
            assert not led.release(rid)  # double release is refused
            released.append(rid)
        else:
            rid = led.admit()
            assert rid is not None, "refused below the admission limit"
            assert rid == next_id  # increasing, never reused
            next_id += 1
            live.append(rid)
        for r in live:
            assert led.is_live(r)
        assert led.live == len(live) <= led.admission_limit
    assert next_id > 1000
    # Released and never-admitted ids are not live.
    for r in released[-100:] + [next_id, next_id + 1000]:
        assert not led.is_live(r)


def test_concurrent_admit_and_release_never_refuse_below_the_limit():
    """Threads that each hold one record at a time never meet a limit of one record per
    thread, however they are scheduled: a refusal would mean the live count or the
    records were corrupted by a race."""
    led = T.SubmissionLedger(4)
    assert led.stress(threads=4, iters=50_000) == 0
    assert led.live == 0
