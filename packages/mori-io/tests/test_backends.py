# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.io's extension: backend names and availability probing on this machine."""

from pathlib import Path

import pytest

import mori.core as mc
import mori.io
from mori.io import BackendType


def test_names_follow_mori_and_xgmi_is_p2p():
    assert set(BackendType.__members__) == {"Unknown", "TCP", "SHM", "P2P", "RDMA", "FABRIC"}
    assert mori.io.backend_from_name("xgmi") == BackendType.P2P
    assert mori.io.backend_from_name("rdma") == BackendType.RDMA
    with pytest.raises(mc.InvalidArgumentError, match="unknown backend 'NVME'"):
        mori.io.backend_from_name("NVME")


def test_availability_is_reported_with_a_reason():
    avail = mori.io.backend_availability()
    assert set(avail) == {"TCP", "SHM", "P2P", "RDMA", "FABRIC"}
    assert avail["TCP"][0] is True
    assert avail["FABRIC"][0] is False and "not implemented" in avail["FABRIC"][1]
    for ok, reason in avail.values():
        assert isinstance(ok, bool) and reason
    if mc.build_info()["cuda_device_count"] == 0:
        assert avail["P2P"] == (False, mc.build_info()["cuda_unavailable_reason"])
    if not Path("/sys/class/infiniband").exists():
        assert avail["RDMA"][0] is False


def test_rdma_build_is_reported_and_a_build_without_the_backend_says_why():
    build = mori.io._C.rdma_build
    assert build.startswith("mori-io RDMA backend: "), build
    ok, reason = mori.io.backend_availability()["RDMA"]
    if build.startswith("mori-io RDMA backend: compiled in"):
        assert "built without" not in reason, reason
    else:
        # Not the runtime library's state (libibverbs may well load here): the build's.
        assert (ok, reason) == (False, build)


def test_extension_was_built_against_this_mori_core():
    assert mori.io._C.__mori_core_version_compiled__ == mc.__version__
