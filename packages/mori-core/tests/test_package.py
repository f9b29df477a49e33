# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Layout of the installed mori-core: native library, headers, CMake config (the
top-level mori package: test_mori_namespace.py)."""

import shutil
import subprocess
from pathlib import Path

import pytest

import mori.core as mc


def test_native_library_headers_and_cmake_config_are_installed():
    assert Path(mc.library_path()).is_file()
    assert (Path(mc.cmake_dir()) / "mori_coreConfig.cmake").is_file()
    assert (Path(mc.cmake_dir()) / "mori_coreConfigVersion.cmake").is_file()
    assert (Path(mc.include_dir()) / "mori" / "core" / "version.hpp").is_file()
    assert (Path(mc.include_dir()) / "mori" / "python" / "extension.hpp").is_file()


def test_build_info_matches_package_version():
    info = mc.build_info()
    assert info["version"] == mc.__version__
    assert mc._C.__mori_core_version_compiled__ == mc.__version__
    if not info["with_cuda"]:
        assert info["cuda_device_count"] == 0
    if info["cuda_device_count"] == 0:
        assert info["cuda_unavailable_reason"]


def test_exactly_one_libmori_core_is_mapped():
    maps = {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.rstrip().endswith("libmori_core.so")
    }
    assert maps == {str(Path(mc.library_path()).resolve())}


@pytest.mark.skipif(shutil.which("ldd") is None, reason="ldd not available")
def test_libstdcxx_is_linked_dynamically():
    # A statically linked libstdc++ inside libmori_core or an extension gives the
    # process two C++ runtimes once torch loads the shared one: exceptions and
    # locales then cross between them and crash (seen with the H200 image's /opt/gcc).
    for path in (mc.library_path(), mc._C.__file__):
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30).stdout
        assert "libstdc++.so" in out, f"{path} does not link libstdc++.so:\n{out}"
