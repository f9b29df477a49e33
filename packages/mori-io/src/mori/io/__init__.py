# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.io: point-to-point transfer engine for KV-cache blocks.

Backends: TCP (any two hosts), SHM (same host, host memory, CMA), P2P (same host,
GPU memory, CUDA IPC), RDMA (ibverbs). torch is optional.
"""

from __future__ import annotations

import mori.core  # noqa: F401  (loads libmori_core before the extension)

from . import _C
from ._version import __version__
from .descriptors import EngineDesc, MemoryDesc
from .engine import (
    BackendType,
    IOEngine,
    IOEngineConfig,
    IOEngineSession,
    MemoryLocationType,
    P2pBackendConfig,
    SharedHostBuffer,
    ShmBackendConfig,
    StatusCode,
    TcpBackendConfig,
    TransferStatus,
    XgmiBackendConfig,
    allocate_shared_host_memory,
    wait_all,
)
from .rdma import RdmaBackendConfig


def backend_availability() -> dict[str, tuple[bool, str]]:
    """For each backend name, (available, reason) on this machine."""
    return {name: _C.probe_backend(value) for name, value in BackendType.__members__.items()}


def backend_from_name(name: str) -> BackendType:
    """Backend by MORI name; "XGMI" (AMD's GPU link in MORI) is an alias of P2P."""
    key = name.upper()
    if key == "XGMI":
        key = "P2P"
    try:
        return BackendType.__members__[key]
    except KeyError:
        raise mori.core.InvalidArgumentError(
            f"unknown backend {name!r} (expected one of TCP, SHM, P2P, XGMI, RDMA)"
        ) from None


__all__ = [
    "BackendType",
    "EngineDesc",
    "IOEngine",
    "IOEngineConfig",
    "IOEngineSession",
    "MemoryDesc",
    "MemoryLocationType",
    "P2pBackendConfig",
    "RdmaBackendConfig",
    "SharedHostBuffer",
    "ShmBackendConfig",
    "StatusCode",
    "TcpBackendConfig",
    "TransferStatus",
    "XgmiBackendConfig",
    "__version__",
    "allocate_shared_host_memory",
    "backend_availability",
    "backend_from_name",
    "wait_all",
]
