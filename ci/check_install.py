# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Checks on an installed environment (run by `nox -s dist_check`).

io-only  mori-core + mori-io installed alone: `import mori` then mori.io and
         mori.shmem resolve and work without importing torch; mori.ep, mori.ops
         and mori.ccl are absent, and mori.ops says which wheel to install; torch
         was not installed.
linked   mori.io's extension needs libmori_core.so and, once imported, the
         process maps exactly one libmori_core.so: mori-core's.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def io_only() -> None:
    import mori

    assert Path(mori.__file__).parent.name == "mori", mori.__file__  # mori-core's __init__
    avail = mori.io.backend_availability()  # lazy: no `import mori.io`
    assert avail["TCP"][0], avail
    print("mori.io", mori.io.__version__, "backends:", avail)
    assert mori.io.IOEngine is importlib.import_module("mori.io").IOEngine
    uid = mori.shmem.shmem_get_unique_id()
    assert len(uid) == 128, len(uid)
    print("mori.shmem: unique id of", len(uid), "bytes")
    assert "torch" not in sys.modules, "import mori / mori.io / mori.shmem imported torch"
    for missing in ("mori.ep", "mori.ops", "mori.ccl"):
        try:
            importlib.import_module(missing)
        except ModuleNotFoundError as e:
            print(f"{missing}: ModuleNotFoundError ({e})")
        else:
            raise AssertionError(f"{missing} imported but was not installed")
    try:
        _ = mori.ops
    except ModuleNotFoundError as e:
        assert "pip install mori-ep" in str(e), str(e)
        print(f"mori.ops: {e}")
    else:
        raise AssertionError("mori.ops resolved but mori-ep was not installed")
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
