# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Checks dist/ after `nox -s build`: one wheel and one sdist per package, each named
with its package's own version; mori-core alone ships mori/__init__.py (the top-level
package with lazy submodules) and mori/shmem/, mori-ep alone mori/ops/; only mori-core
carries libmori_core.so; each other extension needs libmori_core.so and finds it
through $ORIGIN/../core/lib; no wheel carries test code (a _testing module, or the
strings only a test build's extension holds: its test switches and test double)."""

from __future__ import annotations

import io
import re
import sys
import tarfile
import zipfile
from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"mori-core": "core", "mori-io": "io", "mori-ep": "ep", "mori-ccl": "ccl"}
# ROCm/mori's module names: the one wheel that ships each.
OWNED_MODULES = {"mori/shmem/__init__.py": "mori-core", "mori/ops/__init__.py": "mori-ep"}
# What only a test build contains (mori-io: -C cmake.define.MORI_IO_TESTING=ON, as
# `nox -s tests` builds it): its _testing submodule, the environment switches of its
# test double and fault injection, and the double's own description.
TEST_BUILD_STRINGS = {
    "mori-io": (
        b"_testing",
        b"MORI_IO_RDMA_LOOPBACK",
        b"MORI_IO_TEST_CMA_REFUSE",
        b"loopback RDMA test double",
    ),
}
TEST_MODULE = re.compile(r"(^|/)_testing(/|\.|$)")


def version_of(pkg: str, sub: str) -> str:
    text = (ROOT / "packages" / pkg / "src" / "mori" / sub / "_version.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


def dynamic_tags(data: bytes) -> tuple[list[str], list[str]]:
    elf = ELFFile(io.BytesIO(data))
    needed, runpath = [], []
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(tag.needed)
                elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                    runpath.append(getattr(tag, "runpath", None) or tag.rpath)
    return needed, runpath


def main(dist: Path) -> int:
    errors: list[str] = []
    for pkg, sub in PACKAGES.items():
        norm = pkg.replace("-", "_")
        version = version_of(pkg, sub)
        wheels = sorted(dist.glob(f"{norm}-*.whl"))
        sdists = sorted(dist.glob(f"{norm}-*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            errors.append(f"{pkg}: expected 1 wheel and 1 sdist, found {wheels} {sdists}")
            continue
        wheel, sdist = wheels[0], sdists[0]
        errors_before = len(errors)
        for f in (wheel, sdist):
            if (
                not f.name.startswith(f"{norm}-{version}-")
                and not f.name == f"{norm}-{version}.tar.gz"
            ):
                errors.append(f"{f.name}: not named with {pkg}'s version {version}")
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            ships_init = "mori/__init__.py" in names
            if pkg == "mori-core" and not ships_init:
                errors.append(f"{wheel.name}: lacks mori/__init__.py (mori-core owns it)")
            if pkg != "mori-core" and ships_init:
                errors.append(f"{wheel.name}: ships mori/__init__.py (only mori-core may)")
            for module, owner in OWNED_MODULES.items():
                if (module in names) != (pkg == owner):
                    errors.append(
                        f"{wheel.name}: {module} {'present' if module in names else 'missing'} "
                        f"(it belongs to {owner})"
                    )
            test_modules = [n for n in names if TEST_MODULE.search(n)]
            if test_modules:
                errors.append(f"{wheel.name}: carries test modules {test_modules}")
            for name in names:
                if not name.endswith(".so") or pkg not in TEST_BUILD_STRINGS:
                    continue
                data = z.read(name)
                found = [t.decode() for t in TEST_BUILD_STRINGS[pkg] if t in data]
                if found:
                    errors.append(f"{name}: a test build's extension (it holds {found})")
            strays = [n for n in names if n.startswith("mori/") and n.count("/") == 1]
            if pkg != "mori-core" and strays:
                errors.append(f"{wheel.name}: files directly under mori/: {strays}")
            libs = [n for n in names if n.rsplit("/", 1)[-1].startswith("libmori_core")]
            if pkg == "mori-core":
                if libs != ["mori/core/lib/libmori_core.so"]:
                    errors.append(f"{wheel.name}: libmori_core.so copies {libs}")
                for needed in (
                    "mori/core/lib/cmake/mori_core/mori_coreConfig.cmake",
                    "mori/core/include/mori/core/error.hpp",
                ):
                    if needed not in names:
                        errors.append(f"{wheel.name}: missing {needed}")
            else:
                if libs:
                    errors.append(f"{wheel.name}: carries its own libmori_core: {libs}")
                exts = [n for n in names if re.match(rf"mori/{sub}/_C\..*\.so$", n)]
                if len(exts) != 1:
                    errors.append(
                        f"{wheel.name}: expected one mori/{sub}/_C extension, found {exts}"
                    )
                else:
                    needed, runpath = dynamic_tags(z.read(exts[0]))
                    if "libmori_core.so" not in needed:
                        errors.append(f"{exts[0]}: does not need libmori_core.so ({needed})")
                    if not any("$ORIGIN/../core/lib" in r for r in runpath):
                        errors.append(f"{exts[0]}: RUNPATH {runpath} lacks $ORIGIN/../core/lib")
        with tarfile.open(sdist) as t:
            members = t.getnames()
            top = f"{norm}-{version}"
            for needed in ("pyproject.toml", "CMakeLists.txt", "LICENSE", "README.md"):
                if f"{top}/{needed}" not in members:
                    errors.append(f"{sdist.name}: missing {needed}")
            if pkg == "mori-core" and f"{top}/shared_native/CMakeLists.txt" not in members:
                errors.append(f"{sdist.name}: lacks shared_native/ (cannot build on its own)")
        checked = TEST_BUILD_STRINGS.get(pkg, ())
        note = f"  (test strings looked for: {[t.decode() for t in checked]})" if checked else ""
        status = "ok  " if len(errors) == errors_before else "BAD "
        print(f"{status}{wheel.name}  {sdist.name}{note}")
    for e in errors:
        print("ERROR", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
