# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Across packages: all extensions share one libmori_core and one error hierarchy."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mori.ccl
import mori.core as mc
import mori.ep
import mori.io


def test_all_extensions_use_the_one_libmori_core():
    exts = [mori.core._C, mori.io._C, mori.ep._C, mori.ccl._C]
    for ext in exts:
        assert ext.__mori_core_version_compiled__ == mc.__version__, ext.__name__
    maps = {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.rstrip().endswith("libmori_core.so")
    }
    assert maps == {str(Path(mc.library_path()).resolve())}


def test_errors_from_every_extension_share_classes():
    with pytest.raises(mc.InvalidArgumentError):
        mori.ep.get_dispatch_layout(torch.tensor([[999]], dtype=torch.int32), 8, 2)
    with pytest.raises(mc.InvalidArgumentError):
        mori.ccl._C.reduce_sum_cpu("nope", 0, [0], 0)
    with pytest.raises(mc.InvalidArgumentError):
        mc._C.throw_error(mc._C.ErrorCode.InvalidArgument, "x")


def test_log_level_set_through_core_is_seen_by_other_extensions():
    # The io probe logs at debug on the io logger; it shows only once the level is
    # lowered through mori.core, proving the loggers are shared process state.
    code = (
        "import mori.core as mc, mori.io as io\n"
        "io.backend_availability()\n"
        "print('---', flush=True)\n"
        "mc.set_log_level('debug', 'io')\n"
        "print(len(io.backend_availability()), flush=True)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    backends = int(p.stdout.split("---")[1])
    assert backends >= 4 and p.stderr.count(" io DEBUG ") == backends, p.stderr
