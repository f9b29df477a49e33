# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Module loggers (levels from the environment and from Python) and scoped timers."""

import os
import subprocess
import sys

import pytest

import mori.core as mc
from mori.core import _C, telemetry


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MORI_")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=60
    )


def test_levels_from_environment():
    code = "import mori.core as m; print(*[m.get_log_level(x) for x in ('core','io','ep')])"
    assert _run(code).stdout.split() == ["warn", "warn", "warn"]
    assert _run(code, MORI_LOG_LEVEL="info").stdout.split() == ["info", "info", "info"]
    out = _run(code, MORI_LOG_LEVEL="error", MORI_LOG_LEVEL_IO="debug").stdout.split()
    assert out == ["error", "debug", "error"]


def test_bad_environment_level_is_reported_not_fatal():
    p = _run("import mori.core as m; print(m.get_log_level('io'))", MORI_LOG_LEVEL_IO="chatty")
    assert p.returncode == 0
    assert p.stdout.strip() == "warn"
    assert "MORI_LOG_LEVEL_IO" in p.stderr and "'chatty'" in p.stderr


def test_log_line_format_and_filtering():
    code = (
        "from mori.core import log; log.log('io','debug','hidden'); "
        "log.log('io','info','shown 42'); log.log('ccl','info','ccl quiet')"
    )
    p = _run(code, MORI_LOG_LEVEL_IO="info")
    assert "hidden" not in p.stderr
    assert "ccl quiet" not in p.stderr
    lines = [line for line in p.stderr.splitlines() if "shown 42" in line]
    assert len(lines) == 1 and " io INFO " in lines[0] and lines[0].startswith("[mori ")


def test_set_level_from_python():
    saved = mc.get_log_level("shmem")
    try:
        mc.set_log_level("trace", "shmem")
        assert mc.get_log_level("shmem") == "trace"
        mc.set_log_level("off")
        assert {mc.get_log_level(m) for m in ("core", "io", "ep", "ccl")} == {"off"}
    finally:
        mc.set_log_level("warn")
        mc.set_log_level(saved, "shmem")
    with pytest.raises(mc.InvalidArgumentError, match="unknown log level 'loud'"):
        mc.set_log_level("loud", "io")
    with pytest.raises(mc.InvalidArgumentError, match="unknown log module 'gpu'"):
        mc.set_log_level("info", "gpu")


def _count(name: str) -> int:
    return sum(s["count"] for s in telemetry.stats() if s["name"] == name)


def test_scoped_timer_counts_only_when_enabled():
    telemetry.disable("core")
    before = _count("core._timed_noop")
    _C._timed_noop(1000)
    assert _count("core._timed_noop") == before
    telemetry.enable("core")
    try:
        telemetry.reset()
        _C._timed_noop(1000)
        (site,) = [s for s in telemetry.stats() if s["name"] == "core._timed_noop"]
        assert site["count"] == 1000 and site["module"] == "core"
        assert 0 <= site["min_ns"] <= site["mean_ns"] <= site["max_ns"]
    finally:
        telemetry.disable("core")


def test_telemetry_from_environment():
    code = "from mori.core import telemetry as t; print(t.enabled('io'), t.enabled('ep'))"
    assert _run(code, MORI_TELEMETRY="io").stdout.split() == ["True", "False"]
    assert _run(code, MORI_TELEMETRY="all").stdout.split() == ["True", "True"]
