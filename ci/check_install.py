# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Checks on an installed environment (run by `nox -s dist_check`).

io-only  mori-core + mori-io installed alone: mori.io imports and works,
         mori.ep is absent, torch was not installed.
linked   mori.io's extension needs libmori_core.so and, once imported, the
         process maps exactly one libmori_core.so: mori-core's.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def io_only() -> None:
    import mori.io

    avail = mori.io.backend_availability()
    assert avail["TCP"][0], avail
    print("mori.io", mori.io.__version__, "backends:", avail)
    for missing in ("mori.ep", "mori.ccl"):
        try:
            importlib.import_module(missing)
        except ModuleNotFoundError as e:
            print(f"{missing}: ModuleNotFoundError ({e})")
        else:
            raise AssertionError(f"{missing} imported but was not installed")
    assert importlib.util.find_spec("torch") is None, "torch was installed by mori-core/mori-io"
    print("torch: not installed")


def linked() -> None:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    import mori.core
    import mori.io._C as ext

    with open(ext.__file__, "rb") as f:
        needed = [
            t.needed
            for s in ELFFile(f).iter_sections()
            if isinstance(s, DynamicSection)
            for t in s.iter_tags()
            if t.entry.d_tag == "DT_NEEDED"
        ]
    assert "libmori_core.so" in needed, needed
    io_dir = Path(ext.__file__).parent
    copies = list(io_dir.rglob("libmori_core*"))
    assert not copies, f"mori-io carries a copy of libmori_core: {copies}"
    maps = {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.rstrip().endswith("libmori_core.so")
    }
    expected = str(Path(mori.core.library_path()).resolve())
    assert maps == {expected}, f"mapped {maps}, expected only {expected}"
    print(f"{ext.__file__}\n  NEEDED {needed}\n  libmori_core mapped from {expected}")


if __name__ == "__main__":
    {"io-only": io_only, "linked": linked}[sys.argv[1]]()
