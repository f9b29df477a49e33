# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori-io's timeouts follow mori.core.timeouts: a wait of inf or a huge number of
milliseconds waits (a year at most) instead of expiring at once or overflowing, NaN is
refused naming the argument, and the TCP backend's timeout fields refuse NaN, 0 and
negative values naming the field and saturate inf."""

import math
import threading
import time

import pytest

import mori.core as mc
from mori.io import _C, BackendType, IOEngine, IOEngineConfig, StatusCode, TcpBackendConfig
from mori.io.engine import wait_all

LATE_S = 0.3
HUGE = [math.inf, 1e300, 2**62]


def _finishing_late() -> _C.TransferStatus:
    s = _C.TransferStatus()
    s.SetCode(StatusCode.IN_PROGRESS)
    threading.Timer(LATE_S, lambda: s.SetCode(StatusCode.SUCCESS)).start()
    return s


@pytest.mark.parametrize("huge", HUGE)
def test_a_huge_wait_waits_for_the_transfer(huge):
    # Before: 2**62 ms overflowed the deadline and returned IN_PROGRESS at once;
    # inf and 1e300 were refused as not an int.
    for wait in (
        lambda s: s.WaitFor(huge),
        lambda s: IOEngine.wait_all(None, [s], huge),
        lambda s: StatusCode.SUCCESS if wait_all([s], huge) else StatusCode.IN_PROGRESS,
    ):
        s = _finishing_late()
        start = time.monotonic()
        assert wait(s) == StatusCode.SUCCESS
        assert time.monotonic() - start >= LATE_S / 2


def test_negative_and_zero_waits_keep_their_meaning():
    s = _finishing_late()
    assert s.WaitFor(0) == StatusCode.IN_PROGRESS  # polls once
    assert s.WaitFor(-1) == StatusCode.SUCCESS  # no limit
    assert IOEngine.wait_all(None, [_finishing_late()], -5) == StatusCode.SUCCESS


def test_a_nan_wait_is_refused_naming_it():
    s = _finishing_late()
    with pytest.raises(mc.InvalidArgumentError, match="timeout_ms nan"):
        s.WaitFor(math.nan)
    with pytest.raises(mc.InvalidArgumentError, match="timeout_ms nan"):
        IOEngine.wait_all(None, [s], math.nan)
    with pytest.raises(mc.InvalidArgumentError, match="timeout_ms nan"):
        wait_all([s], math.nan)
    s.Wait()


@pytest.mark.parametrize("field", ["peer_timeout_ms", "transfer_timeout_ms", "idle_timeout_ms"])
@pytest.mark.parametrize(("bad", "text"), [(math.nan, "nan"), (0, "0"), (-1, "-1")])
def test_bad_tcp_timeouts_are_refused_naming_the_field(field, bad, text):
    if field == "idle_timeout_ms" and bad == 0:
        assert TcpBackendConfig(idle_timeout_ms=0).to_native().idle_timeout_ms == 0  # never
        return
    with pytest.raises(mc.InvalidArgumentError, match=f"TcpBackendConfig.{field} {text} must be"):
        TcpBackendConfig(**{field: bad}).to_native()
    if bad == bad:  # the engine checks the native config with the same rule
        native = _C.TcpBackendConfig()
        setattr(native, field, int(bad))
        e = IOEngine("timeouts", IOEngineConfig("127.0.0.1", 0))
        try:
            with pytest.raises(mc.InvalidArgumentError, match=f"{field} {text} must be"):
                e._engine.create_tcp_backend(native)
        finally:
            e.close()


@pytest.mark.parametrize("huge", [*HUGE, 10**400])
def test_huge_tcp_timeouts_saturate(huge):
    native = TcpBackendConfig(
        peer_timeout_ms=huge, transfer_timeout_ms=huge, idle_timeout_ms=huge
    ).to_native()
    top = (1 << 31) - 1  # the native fields are ints
    assert (native.peer_timeout_ms, native.transfer_timeout_ms, native.idle_timeout_ms) == (
        top,
        top,
        top,
    )
    e = IOEngine("huge-timeouts", IOEngineConfig("127.0.0.1", 0))
    try:
        e.create_backend(BackendType.TCP, TcpBackendConfig(peer_timeout_ms=huge))
    finally:
        e.close()
