# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ci/check_dist.py, the release check `nox -s build` runs, fails each defect it is
there for: small wheels are made here with the C compiler (shared objects whose
DT_NEEDED, RUNPATH, .nv_fatbin section and strings are chosen per test), one defect at
a time, beside one that passes. The fat binary reader is also checked against nvcc's
own output where nvcc is installed."""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_dist", ROOT / "ci" / "check_dist.py")
check_dist = importlib.util.module_from_spec(_spec)
sys.modules["check_dist"] = check_dist
_spec.loader.exec_module(check_dist)

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to make test objects")
IO_VERSION = check_dist.version_of("mori-io")
ARCHS = "90-real,100-real,100-virtual"
GOOD_TAG = "cp311-cp311-manylinux_2_34_x86_64"


def fatbin(*modules: list[tuple[str, int]]) -> bytes:
    """Fat binaries as nvcc lays them out: per module a 16-byte header (magic, version,
    header size, size of the entries), then entries of a 64-byte header (kind 1 = PTX,
    2 = machine code; the architecture at byte 28) and an 8-byte payload."""
    out = b""
    for entries in modules:
        body = b""
        for kind, arch in entries:
            header = struct.pack(
                "<HHIQIIII", {"ptx": 1, "elf": 2}[kind], 0x101, 64, 8, 0, 0, 0, arch
            )
            body += header.ljust(64, b"\0") + b"\0" * 8
        out += struct.pack("<IHHQ", check_dist.FATBIN_MAGIC, 1, 16, len(body)) + body
    return out


class Objects:
    """Shared objects made with the C compiler, in one directory."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        for stub in ("mori_core", "foo", "cudart"):
            self.compile(f"lib{stub}.so", "int mori_stub;", [])

    def compile(self, name: str, source: str, args: list[str]) -> Path:
        src, out = self.dir / (name + ".c"), self.dir / name
        src.write_text(source)
        subprocess.run(
            [CC, "-shared", "-fPIC", "-o", str(out), str(src), "-L", str(self.dir), *args],
            check=True,
            timeout=120,
        )
        return out

    def extension(
        self,
        fat: bytes = b"",
        text: str = "",
        libs: tuple[str, ...] = ("mori_core",),
        rpath: str = "$ORIGIN/../core/lib",
    ) -> bytes:
        array = ", ".join(str(b) for b in fat) or "0"
        source = (
            '__attribute__((section(".nv_fatbin"), used)) '
            f"static const unsigned char fatbin[] = {{{array}}};\n"
            * bool(fat)
            + f'__attribute__((used)) const char text[] = "{text}";\n'
        )
        args = ["-Wl,--no-as-needed", *(f"-l{lib}" for lib in libs)]
        args += [f"-Wl,-rpath,{rpath}", "-Wl,--enable-new-dtags"]
        return self.compile("ext.so", source, args).read_bytes()


@pytest.fixture
def objects(tmp_path: Path) -> Objects:
    return Objects(tmp_path)


def io_wheel(tmp: Path, ext: bytes, tag: str = GOOD_TAG, extra: dict | None = None) -> Path:
    wheel = tmp / f"mori_io-{IO_VERSION}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mori/io/__init__.py", "")
        z.writestr("mori/io/_C.cpython-311-x86_64-linux-gnu.so", ext)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return wheel


GOOD_FAT = fatbin([("elf", 90), ("elf", 100), ("ptx", 100)])
COMPILED_IN = check_dist.RDMA_COMPILED_IN.decode() + ", libibverbs.so.1 is loaded at run time"


def errors_of(tmp: Path, ext: bytes, without_rdma: bool = False, **kw) -> list[str]:
    return check_dist.wheel_errors("mori-io", io_wheel(tmp, ext, **kw), ARCHS, without_rdma)


@needs_cc
def test_a_release_wheel_passes(objects, tmp_path):
    assert errors_of(tmp_path, objects.extension(GOOD_FAT, COMPILED_IN)) == []


@needs_cc
def test_a_wheel_without_the_manylinux_tag_fails(objects, tmp_path):
    ext = objects.extension(GOOD_FAT, COMPILED_IN)
    errors = errors_of(tmp_path, ext, tag="cp311-cp311-linux_x86_64")
    assert len(errors) == 1 and "linux_x86_64 is not manylinux" in errors[0], errors


@needs_cc
@pytest.mark.parametrize("lib", ["foo", "cudart"])
def test_a_library_outside_the_allowed_set_fails_naming_it(objects, tmp_path, lib):
    ext = objects.extension(GOOD_FAT, COMPILED_IN, libs=("mori_core", lib))
    errors = errors_of(tmp_path, ext)
    assert len(errors) == 1 and f"needs ['lib{lib}.so'], outside the allowed set" in errors[0]


@needs_cc
def test_a_bundled_library_fails(objects, tmp_path):
    ext = objects.extension(GOOD_FAT, COMPILED_IN)
    bundled = (objects.dir / "libfoo.so").read_bytes()
    errors = errors_of(tmp_path, ext, extra={"mori_io.libs/libfoo-1a2b3c4d.so": bundled})
    assert any("bundles libraries in ['mori_io.libs']" in e for e in errors), errors


@needs_cc
def test_an_extension_that_misses_mori_cores_runpath_fails(objects, tmp_path):
    errors = errors_of(tmp_path, objects.extension(GOOD_FAT, COMPILED_IN, rpath="/usr/lib"))
    assert len(errors) == 1 and "lacks $ORIGIN/../core/lib" in errors[0], errors


@needs_cc
@pytest.mark.parametrize(
    ("modules", "named"),
    [
        ([[("elf", 90), ("ptx", 90)]], "sm_100 machine code, compute_100 PTX"),
        ([[("elf", 90), ("elf", 100)]], "compute_100 PTX"),
        ([[("elf", 90), ("elf", 100), ("ptx", 100)], [("elf", 90)]], "1 of its 2 fat binaries"),
        ([], "sm_90 machine code, sm_100 machine code, compute_100 PTX"),
    ],
)
def test_missing_cuda_architectures_fail_naming_them(objects, tmp_path, modules, named):
    errors = errors_of(tmp_path, objects.extension(fatbin(*modules), COMPILED_IN))
    assert len(errors) == 1 and named in errors[0], errors


@needs_cc
def test_a_wheel_built_without_rdma_headers_fails_unless_asked_for(objects, tmp_path):
    no_headers = "mori-io RDMA backend: built without ibverbs headers, libibverbs-dev was missing"
    errors = errors_of(tmp_path, objects.extension(GOOD_FAT, no_headers))
    assert len(errors) == 1 and "the RDMA backend is not compiled in" in errors[0], errors
    # The switch is not a way round a wheel that fails to say it was asked for.
    errors = errors_of(tmp_path, objects.extension(GOOD_FAT, no_headers), without_rdma=True)
    assert len(errors) == 1 and "built without RDMA on request" in errors[0], errors
    off = check_dist.RDMA_OFF_ON_REQUEST.decode() + " with MORI_IO_RDMA=off"
    assert errors_of(tmp_path, objects.extension(GOOD_FAT, off), without_rdma=True) == []


@needs_cc
def test_a_test_build_fails(objects, tmp_path):
    text = COMPILED_IN + " MORI_IO_RDMA_LOOPBACK"
    errors = errors_of(tmp_path, objects.extension(GOOD_FAT, text))
    assert len(errors) == 1 and "a test build's extension" in errors[0], errors


def test_release_notes_must_name_the_version():
    ok = "# mori-io changelog\n\n## 0.2.0 (unreleased)\n- x\n\n## 0.1.0\n- y\n"
    assert check_dist.release_notes_errors("mori-io", ok, "0.2.0") == []
    assert check_dist.release_notes_errors("mori-io", ok, "0.1.0") == []
    for version in ("0.3.0", "0.2"):
        (error,) = check_dist.release_notes_errors("mori-io", ok, version)
        assert f"no '## {version}' section" in error
    for pkg in check_dist.PACKAGES:  # the versions in this tree
        notes = (ROOT / "packages" / pkg / "CHANGELOG.md").read_text()
        assert check_dist.release_notes_errors(pkg, notes, check_dist.version_of(pkg)) == []


def test_cuda_architecture_lists_in_cmake_syntax():
    assert check_dist.expected_archs("90-real;100") == {"elf": {90, 100}, "ptx": {100}}
    assert check_dist.expected_archs("90,100-virtual") == {"elf": {90}, "ptx": {90, 100}}
    with pytest.raises(ValueError, match="'sm_90' in 'sm_90' is not a CUDA architecture"):
        check_dist.expected_archs("sm_90")
    text = (ROOT / "noxfile.py").read_text()
    (release,) = re.findall(r'^RELEASE_CUDA_ARCHS = "([^"]+)"', text, flags=re.M)
    want = check_dist.expected_archs(release)
    assert {90, 100} <= want["elf"] and want["ptx"], release


def test_the_rdma_sentences_are_the_ones_mori_io_writes():
    cmake = (ROOT / "packages" / "mori-io" / "CMakeLists.txt").read_text()
    assert check_dist.RDMA_COMPILED_IN.decode() in cmake
    assert check_dist.RDMA_OFF_ON_REQUEST.decode() in cmake
    io = pytest.importorskip("mori.io._C")
    if "built without ibverbs headers" not in io.rdma_build:
        assert io.rdma_build.encode().startswith(
            (check_dist.RDMA_COMPILED_IN, check_dist.RDMA_OFF_ON_REQUEST)
        )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_fat_binary_reader_agrees_with_nvcc(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void add(float* x) { x[threadIdx.x] += 1.0f; }\n")
    out = tmp_path / "k.so"
    subprocess.run(
        ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(src),
         "-gencode", "arch=compute_90,code=sm_90",
         "-gencode", "arch=compute_100,code=[sm_100,compute_100]"],
        check=True, timeout=300,
    )  # fmt: skip
    data = out.read_bytes()
    assert check_dist.fatbin_archs(data) == {"elf": {90, 100}, "ptx": {100}}
    assert check_dist.kernel_errors("k.so", data, "90-real,100") == []
    (error,) = check_dist.kernel_errors("k.so", data, "90,100,120-real")
    assert "sm_120 machine code, compute_90 PTX" in error
