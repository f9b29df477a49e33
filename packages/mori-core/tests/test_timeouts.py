# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.core.timeouts: the Python face of the one timeout conversion every package
uses (mori/core/timeout.hpp)."""

import math

import pytest

import mori.core as mc
from mori.core import timeouts

YEAR_S = 365 * 24 * 3600


def test_the_bound_is_a_year():
    assert timeouts.MAX_TIMEOUT_S == YEAR_S


@pytest.mark.parametrize("huge", [math.inf, 1e300, 1e10, 10**400])
def test_inf_and_huge_seconds_saturate(huge):
    assert timeouts.seconds(huge) == YEAR_S
    # As milliseconds 1e10 is 116 days: under a year, over the int32 fields' bound.
    year_ms = YEAR_S * 1000
    assert timeouts.wait_milliseconds(huge) == min(huge, year_ms)
    assert timeouts.milliseconds(huge, "f") == (1 << 31) - 1
    assert timeouts.milliseconds(huge, "f", max_ms=1 << 62) == min(huge, year_ms)


def test_ordinary_values_pass_through():
    assert timeouts.seconds(2.5) == 2.5
    assert timeouts.seconds(3) == 3.0
    assert timeouts.milliseconds(0.2, "f") == 1  # rounded up to one unit
    assert timeouts.milliseconds(0, "f", zero_means_never=True) == 0
    assert timeouts.wait_milliseconds(-7) == -1  # MORI's "no limit"
    assert timeouts.wait_milliseconds(0) == 0  # poll once
    assert timeouts.wait_milliseconds(1.5) == 2


@pytest.mark.parametrize(
    ("bad", "text"), [(math.nan, "nan"), (0, "0"), (-1, "-1"), (-math.inf, "-inf")]
)
def test_nan_zero_and_negative_are_refused_naming_value_and_argument(bad, text):
    with pytest.raises(mc.InvalidArgumentError, match=f"^timeout_s {text} must be > 0"):
        timeouts.seconds(bad)
    with pytest.raises(mc.InvalidArgumentError, match=f"^Config.peer_ms {text} must be > 0"):
        timeouts.milliseconds(bad, "Config.peer_ms")
    if bad != bad:
        with pytest.raises(mc.InvalidArgumentError, match="^timeout_ms nan"):
            timeouts.wait_milliseconds(bad)


@pytest.mark.parametrize("bad", ["5", None, True, 1j])
def test_non_numbers_are_refused_naming_them(bad):
    with pytest.raises(mc.InvalidArgumentError, match=f"^timeout_s {bad!r} must be a number"):
        timeouts.seconds(bad)


@pytest.mark.parametrize(("bad", "text"), [(math.nan, "nan"), (0, "0"), (-1, "-1")])
def test_the_launcher_refuses_bad_timeouts(bad, text):
    # NaN never expired (now > nan is false): a hung group was waited for forever.
    from mori.core.launch import launch_local

    with pytest.raises(mc.InvalidArgumentError, match=f"^timeout_s {text} must be > 0"):
        launch_local(["-c", "pass"], 1, timeout_s=bad)
