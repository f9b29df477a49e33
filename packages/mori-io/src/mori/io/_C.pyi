# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Type stubs for mori.io._C."""

import enum

__mori_core_version_compiled__: str

class BackendType(enum.IntEnum):
    TCP = 0
    SHM = 1
    P2P = 2
    RDMA = 3

def probe_backend(backend: BackendType) -> tuple[bool, str]: ...
