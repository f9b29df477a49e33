# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""SubmissionLedger: admission boundary, wrap-around, out-of-order release, reuse."""

import random

import pytest

from mori.io import _C


@pytest.mark.parametrize("use_map", [False, True])
def test_admission_limit_is_capacity_minus_one(use_map):
    led = _C.SubmissionLedger(8, use_map)
    assert led.capacity == 8 and led.admission_limit == 7
    ids = [led.admit() for _ in range(7)]
    assert ids == list(range(7)) and led.live == 7
    assert led.admit() is None  # at the limit: refused, nothing changes
    assert led.live == 7
    assert led.release(ids[0])
    assert led.admit() == 7  # one freed, one admitted
    assert led.admit() is None


def test_capacity_rounds_up_to_a_power_of_two():
    assert _C.SubmissionLedger(5).capacity == 8
    assert _C.SubmissionLedger(1).capacity == 2


def test_out_of_order_release_keeps_the_window_until_the_oldest_retires():
    led = _C.SubmissionLedger(8)
    ids = [led.admit() for _ in range(7)]
    for i in ids[1:]:
        assert led.release(i)
    # Only record 0 is live, but the window still spans 7 ids: slot of id 7 would be
    # free, yet id 8 would alias live record 0, so admission is bounded by the window.
    assert led.live == 1 and led.window == 7
    assert led.admit() is None
    assert led.release(ids[0])
    assert led.window == 0
    assert [led.admit() for _ in range(7)] == list(range(7, 14))


def test_wrap_around_reuse_and_stale_ids():
    led = _C.SubmissionLedger(4)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    live: list[int] = []
    next_id = 0
    for _ in range(5000):
        if live and (len(live) == led.admission_limit or rng.random() < 0.5):
            rid = live.pop(rng.randrange(len(live)))
            assert led.release(rid)
            assert not led.is_live(rid)
            assert not led.release(rid)  # double release is refused
        else:
            rid = led.admit()
            if rid is None:
                assert led.window == led.admission_limit
                continue
            assert rid == next_id
            next_id += 1
            live.append(rid)
        for r in live:
            assert led.is_live(r)
        assert led.live == len(live) and led.window <= led.admission_limit
    assert next_id > 1000  # wrapped around the 4-slot ring many times
    # A stale id that maps onto a reused slot is not mistaken for the live one.
    for r in live:
        assert not led.is_live(r + 4 * 1000)


def test_concurrent_admit_and_release_never_refuse_below_the_limit():
    """Threads that each hold one record at a time never meet the admission limit: with
    fewer admissions in all than the window holds, none can be refused however the
    threads are scheduled, but a head read before a tail that moved past it looked like
    a full window (10-30 refusals in 800k admissions, two runs in three, before the
    fix)."""
    led = _C.SubmissionLedger(1 << 20)
    assert led.stress(threads=4, iters=250_000) == 0  # 1M admissions < 2^20 - 1
    assert led.live == 0 and led.window == 0
