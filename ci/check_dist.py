# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Checks a release before it leaves the build (run by `nox -s build`).

    check_dist.py notes PKG...        each package's CHANGELOG has a section for the
                                      version in its _version.py
    check_dist.py dist DIST [--packages a,b] [--cuda-archs LIST] [--without-rdma]
                                      the wheels and sdists in DIST

A wheel fails, with each reason named, when it:
- is not named with its package's version, or lacks a manylinux platform tag;
- breaks the package layout: mori-core alone ships mori/__init__.py (the top-level
  package with lazy submodules), mori/shmem/ and libmori_core.so (with its headers and
  CMake package config), mori-ep alone mori/ops/; each other extension needs
  libmori_core.so and finds it through $ORIGIN/../core/lib;
- carries test code (a _testing module, or the strings only a test build's extension
  holds: its test switches and test double);
- has an ELF file that needs a library outside ALLOWED_NEEDED, or bundles any library
  (a <wheel>.libs/ directory);
- lacks CUDA kernels (machine code or PTX, as --cuda-archs lists them in CMake's
  CUDA_ARCHITECTURES syntax) in libmori_core.so or an extension with CUDA sources;
- is mori-io without its RDMA backend compiled in (with --without-rdma: without the
  extension saying that the build asked for none).

The ELF files are read with the standard library alone (the dynamic section and the
.nv_fatbin section: cuobjdump --list-elf/--list-ptx's answer), so the check and its
tests need nothing installed.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
import tarfile
import zipfile
from pathlib import Path

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
# What a wheel's ELF files may need: mori-core's libmori_core.so and the C/C++ runtime
# every manylinux system has (libpthread/libdl/librt: glibc before 2.34 kept them
# apart). Never libcuda (driver entry points come through cudart), libcudart (linked
# statically, its symbols hidden), libibverbs or libnvidia-ml (dlopen'ed at run time),
# libtorch/libc10 (tensors cross as pointers), nor a library auditwheel bundled.
ALLOWED_NEEDED = frozenset(
    {
        "libmori_core.so",
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libm.so.6",
        "libc.so.6",
        "ld-linux-x86-64.so.2",
        "libpthread.so.0",
        "libdl.so.2",
        "librt.so.1",
    }
)
MANYLINUX_TAG = re.compile(r"^(manylinux_\d+_\d+|manylinux1|manylinux2010|manylinux2014)_\w+$")
# The ELF files of each wheel that carry CUDA kernels when the build has CUDA.
KERNEL_FILES = {
    "mori-core": re.compile(r"^mori/core/lib/libmori_core\.so$"),
    "mori-io": re.compile(r"^mori/io/_C\..*\.so$"),
    "mori-ep": re.compile(r"^mori/ep/_C\..*\.so$"),
    "mori-ccl": re.compile(r"^mori/ccl/_C\..*\.so$"),
}
# mori.io._C.rdma_build of a wheel with the RDMA backend, and of one built with
# MORI_IO_RDMA=off (packages/mori-io/CMakeLists.txt writes both).
RDMA_COMPILED_IN = b"mori-io RDMA backend: compiled in"
RDMA_OFF_ON_REQUEST = b"mori-io RDMA backend: built without RDMA, the build asked for none"


def version_of(pkg: str) -> str:
    path = ROOT / "packages" / pkg / "src" / "mori" / PACKAGES[pkg] / "_version.py"
    return re.search(r'__version__ = "([^"]+)"', path.read_text()).group(1)


def release_notes_errors(pkg: str, changelog: str, version: str) -> list[str]:
    """A CHANGELOG section (`## <version>`, a note in parentheses may follow) for the
    version about to be built."""
    if re.search(rf"^## {re.escape(version)}(\s|$)", changelog, flags=re.M):
        return []
    return [f"{pkg}: CHANGELOG.md has no '## {version}' section for the version in _version.py"]


# ---- ELF: the dynamic section and the CUDA fat binary ---------------------------------

DT_NEEDED, DT_RPATH, DT_RUNPATH = 1, 15, 29
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KINDS = {1: "ptx", 2: "elf"}


def _sections(data: bytes) -> list[tuple[str, int, int, int]]:
    """(name, offset, size, link) of each section of a little-endian ELF64 file, in
    section-index order."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize) for i in range(shnum)]
    names = raw[shstrndx][4]
    return [
        (data[names + name : data.index(b"\0", names + name)].decode(), offset, size, link)
        for name, _type, _flags, _addr, offset, size, link in raw
    ]


def _section(data: bytes, wanted: str) -> tuple[str, int, int, int] | None:
    return next((s for s in _sections(data) if s[0] == wanted), None)


def dynamic_tags(data: bytes) -> tuple[list[str], list[str]]:
    """(DT_NEEDED names, DT_RUNPATH/DT_RPATH values) of an ELF64 shared object."""
    sections = _sections(data)
    dynamic = next((s for s in sections if s[0] == ".dynamic"), None)
    if dynamic is None:
        return [], []
    _, offset, size, link = dynamic
    strtab = sections[link][1]

    def string(at: int) -> str:
        return data[strtab + at : data.index(b"\0", strtab + at)].decode()

    needed, runpath = [], []
    for i in range(0, size, 16):
        tag, value = struct.unpack_from("<qQ", data, offset + i)
        if tag == DT_NEEDED:
            needed.append(string(value))
        elif tag in (DT_RPATH, DT_RUNPATH):
            runpath.append(string(value))
    return needed, runpath


def fatbin_modules(data: bytes) -> list[dict[str, set[int]]]:
    """For each fat binary (one per compiled CUDA source) in an ELF file's .nv_fatbin
    section: {"elf": {90, ...}, "ptx": {100, ...}}, its machine code and PTX
    architectures (what cuobjdump --list-elf / --list-ptx name), read from the entry
    headers (a compressed entry keeps its header uncompressed)."""
    section = _section(data, ".nv_fatbin")
    if section is None:
        return []
    _, start, size, _ = section
    blob = data[start : start + size]
    modules, at = [], 0
    while at + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, at)
        if magic != FATBIN_MAGIC:
            at += 8  # fat binaries are 8-byte aligned, padding between them
            continue
        found: dict[str, set[int]] = {"elf": set(), "ptx": set()}
        entry, end = at + header_size, at + header_size + fat_size
        while entry + 32 <= end:
            kind, _ev, entry_header, payload = struct.unpack_from("<HHIQ", blob, entry)
            (arch,) = struct.unpack_from("<I", blob, entry + 28)
            if kind in FATBIN_KINDS:
                found[FATBIN_KINDS[kind]].add(arch)
            if entry_header == 0:
                break
            entry += entry_header + payload
        modules.append(found)
        at = end
    return modules


def fatbin_archs(data: bytes) -> dict[str, set[int]]:
    """The union of fatbin_modules: every architecture the file holds code for."""
    union: dict[str, set[int]] = {"elf": set(), "ptx": set()}
    for module in fatbin_modules(data):
        for kind in union:
            union[kind] |= module[kind]
    return union


def expected_archs(spec: str) -> dict[str, set[int]]:
    """CMake's CUDA_ARCHITECTURES ("90-real,100-real,100-virtual", ";" or "," between,
    "90" = both) as the machine code and PTX a fat binary must hold."""
    out: dict[str, set[int]] = {"elf": set(), "ptx": set()}
    for item in filter(None, re.split(r"[;,\s]+", spec)):
        m = re.fullmatch(r"(\d+)[af]?(?:-(real|virtual))?", item)
        if not m:
            raise ValueError(f"{item!r} in {spec!r} is not a CUDA architecture (90, 100-real)")
        arch, kind = int(m.group(1)), m.group(2)
        if kind in (None, "real"):
            out["elf"].add(arch)
        if kind in (None, "virtual"):
            out["ptx"].add(arch)
    return out


def kernel_errors(name: str, data: bytes, spec: str) -> list[str]:
    """The file holds PTX for each virtual architecture of `spec`, and each of its fat
    binaries machine code for each real one (a source compiled for fewer would fail to
    load its kernels on that GPU)."""
    want, modules = expected_archs(spec), fatbin_modules(data)
    have = fatbin_archs(data)
    missing = [f"sm_{a} machine code" for a in sorted(want["elf"] - have["elf"])]
    missing += [f"compute_{a} PTX" for a in sorted(want["ptx"] - have["ptx"])]
    errors = []
    if missing:
        errors.append(
            f"{name}: lacks CUDA {', '.join(missing)} (it holds machine code for "
            f"{sorted(have['elf'])}, PTX for {sorted(have['ptx'])})"
        )
    short = [sorted(m["elf"]) for m in modules if want["elf"] - m["elf"]]
    if short and not missing:
        errors.append(
            f"{name}: {len(short)} of its {len(modules)} fat binaries lack machine code for "
            f"some of {sorted(want['elf'])} (they hold {short})"
        )
    return errors


# ---- one wheel --------------------------------------------------------------------


def platform_tag_errors(wheel_name: str) -> list[str]:
    platforms = wheel_name[: -len(".whl")].split("-")[-1].split(".")
    if all(MANYLINUX_TAG.match(p) for p in platforms):
        return []
    return [
        f"{wheel_name}: platform tag {'.'.join(platforms)} is not manylinux (auditwheel repair)"
    ]


def wheel_errors(
    pkg: str, wheel: Path, cuda_archs: str = "", without_rdma: bool = False
) -> list[str]:
    """Every reason `wheel` (of `pkg`) cannot be released; [] when it can."""
    norm, sub, version = pkg.replace("-", "_"), PACKAGES[pkg], version_of(pkg)
    errors = []
    if not wheel.name.startswith(f"{norm}-{version}-"):
        errors.append(f"{wheel.name}: not named with {pkg}'s version {version}")
    errors += platform_tag_errors(wheel.name)
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
        bundled = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".libs")})
        if bundled:
            errors.append(f"{wheel.name}: bundles libraries in {bundled} (nothing may be)")
        elf_files = {n: z.read(n) for n in names if re.search(r"\.so(\.\d+)*$", n)}
        unreadable: set[str] = set()
        for name, data in elf_files.items():
            found = [t.decode() for t in TEST_BUILD_STRINGS.get(pkg, ()) if t in data]
            if found:
                errors.append(f"{name}: a test build's extension (it holds {found})")
            try:
                needed, _ = dynamic_tags(data)
            except (ValueError, struct.error) as e:
                errors.append(f"{name}: not a readable ELF64 shared object ({e})")
                unreadable.add(name)
                continue
            outside = [n for n in needed if n not in ALLOWED_NEEDED]
            if outside:
                errors.append(f"{name}: needs {outside}, outside the allowed set (ALLOWED_NEEDED)")
        strays = [n for n in names if n.startswith("mori/") and n.count("/") == 1 and n != "mori/"]
        if pkg != "mori-core" and strays:
            errors.append(f"{wheel.name}: files directly under mori/: {strays}")
        libs = [n for n in names if n.rsplit("/", 1)[-1].startswith("libmori_core")]
        exts = [n for n in names if re.match(rf"mori/{sub}/_C\..*\.so$", n)]
        if pkg == "mori-core":
            if len(exts) == 1 and exts[0] not in unreadable:
                _, runpath = dynamic_tags(elf_files[exts[0]])
                if not any("$ORIGIN/lib" in r for r in runpath):
                    errors.append(f"{exts[0]}: RUNPATH {runpath} lacks $ORIGIN/lib")
            if libs != ["mori/core/lib/libmori_core.so"]:
                errors.append(f"{wheel.name}: libmori_core.so copies {libs}")
            for needed_file in (
                "mori/core/lib/cmake/mori_core/mori_coreConfig.cmake",
                "mori/core/include/mori/core/error.hpp",
            ):
                if needed_file not in names:
                    errors.append(f"{wheel.name}: missing {needed_file}")
        else:
            if libs:
                errors.append(f"{wheel.name}: carries its own libmori_core: {libs}")
            if len(exts) != 1:
                errors.append(f"{wheel.name}: expected one mori/{sub}/_C extension, found {exts}")
            elif exts[0] not in unreadable:
                needed, runpath = dynamic_tags(elf_files[exts[0]])
                if "libmori_core.so" not in needed:
                    errors.append(f"{exts[0]}: does not need libmori_core.so ({needed})")
                if not any("$ORIGIN/../core/lib" in r for r in runpath):
                    errors.append(f"{exts[0]}: RUNPATH {runpath} lacks $ORIGIN/../core/lib")
        if cuda_archs:
            kernel_files = [
                n for n in elf_files if KERNEL_FILES[pkg].match(n) and n not in unreadable
            ]
            if not kernel_files:
                errors.append(f"{wheel.name}: no {KERNEL_FILES[pkg].pattern} to hold its kernels")
            for name in kernel_files:
                errors += kernel_errors(name, elf_files[name], cuda_archs)
        if pkg == "mori-io" and len(exts) == 1:
            data = elf_files[exts[0]]
            if without_rdma:
                if RDMA_OFF_ON_REQUEST not in data:
                    errors.append(
                        f"{exts[0]}: does not say it was built without RDMA on request "
                        f"(MORI_IO_RDMA=off), as a wheel built without RDMA must"
                    )
            elif RDMA_COMPILED_IN not in data:
                errors.append(
                    f"{exts[0]}: the RDMA backend is not compiled in (no "
                    f"{RDMA_COMPILED_IN.decode()!r}): rdma-core's headers were missing; "
                    f"build with them, or on purpose without RDMA (MORI_IO_RDMA=off)"
                )
    return errors


def sdist_errors(pkg: str, sdist: Path) -> list[str]:
    norm, version = pkg.replace("-", "_"), version_of(pkg)
    top = f"{norm}-{version}"
    errors = []
    if sdist.name != f"{top}.tar.gz":
        errors.append(f"{sdist.name}: not named with {pkg}'s version {version}")
    with tarfile.open(sdist) as t:
        members = t.getnames()
        for needed in ("pyproject.toml", "CMakeLists.txt", "LICENSE", "README.md"):
            if f"{top}/{needed}" not in members:
                errors.append(f"{sdist.name}: missing {needed}")
        if pkg == "mori-core" and f"{top}/shared_native/CMakeLists.txt" not in members:
            errors.append(f"{sdist.name}: lacks shared_native/ (cannot build on its own)")
    return errors


def check_dist(dist: Path, packages: list[str], cuda_archs: str, without_rdma: bool) -> int:
    print(
        f"CUDA architectures expected: {cuda_archs or 'none (a build without CUDA)'}; "
        f"mori-io RDMA: {'off on request' if without_rdma else 'compiled in'}; "
        f"DT_NEEDED allowed: {sorted(ALLOWED_NEEDED)}"
    )
    errors: list[str] = []
    for pkg in packages:
        norm = pkg.replace("-", "_")
        wheels = sorted(dist.glob(f"{norm}-*.whl"))
        sdists = sorted(dist.glob(f"{norm}-*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            errors.append(f"{pkg}: expected 1 wheel and 1 sdist, found {wheels} {sdists}")
            continue
        notes = (ROOT / "packages" / pkg / "CHANGELOG.md").read_text()
        found = release_notes_errors(pkg, notes, version_of(pkg))
        found += wheel_errors(pkg, wheels[0], cuda_archs, without_rdma)
        found += sdist_errors(pkg, sdists[0])
        checked = TEST_BUILD_STRINGS.get(pkg, ())
        note = f"  (test strings looked for: {[t.decode() for t in checked]})" if checked else ""
        print(f"{'BAD ' if found else 'ok  '}{wheels[0].name}  {sdists[0].name}{note}")
        errors += found
    for e in errors:
        print("ERROR", e)
    return 1 if errors else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    notes = sub.add_parser("notes", help="each package's CHANGELOG names its version")
    notes.add_argument("packages", nargs="*", default=list(PACKAGES))
    dist = sub.add_parser("dist", help="the wheels and sdists in a directory")
    dist.add_argument("dist", type=Path)
    dist.add_argument("--packages", default=",".join(PACKAGES))
    dist.add_argument("--cuda-archs", default="", help="CMake syntax; empty: no CUDA expected")
    dist.add_argument("--without-rdma", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "notes":
        errors = []
        for pkg in args.packages:
            changelog = (ROOT / "packages" / pkg / "CHANGELOG.md").read_text()
            found = release_notes_errors(pkg, changelog, version_of(pkg))
            print(f"{'BAD ' if found else 'ok  '}{pkg} {version_of(pkg)}: CHANGELOG section")
            errors += found
        for e in errors:
            print("ERROR", e)
        return 1 if errors else 0
    packages = [p for p in args.packages.split(",") if p]
    unknown = [p for p in packages if p not in PACKAGES]
    if unknown:
        parser.error(f"unknown packages {unknown}")
    return check_dist(args.dist, packages, args.cuda_archs, args.without_rdma)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
