# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.io: point-to-point transfer engine for KV-cache blocks.

Backends: TCP (any two hosts), SHM (same host, host memory, CMA), P2P (same host,
GPU memory, CUDA IPC), RDMA (ibverbs). torch is optional.
"""

from __future__ import annotations

import mori.core  # loads libmori_core before the extension

from . import _C
from ._version import __version__
from .descriptors import EngineDesc, MemoryDesc
from .engine import (
    BackendType,
    FabricBackendConfig,
    IOEngine,
    IOEngineConfig,
    IOEngineSession,
    MemoryLocationType,
    P2pBackendConfig,
    SharedHostBuffer,
    ShmBackendConfig,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
    TransferStatus,
    XgmiBackendConfig,
    allocate_shared_host_memory,
    fabric_alloc,
    fabric_free,
    wait_all,
)
from .rdma import PollCqMode, RdmaBackendConfig

_MORI_LEVELS = {"warning": "warn", "critical": "error", "err": "error"}


def set_log_level(level: str) -> None:
    """MORI's ``set_log_level``: the threshold of the io logger ("trace", "debug",
    "info", "warn"/"warning", "error"/"critical", "off"); mori.core.log.set_log_level
    sets any module's."""
    name = str(level).lower()
    mori.core.log.set_log_level(_MORI_LEVELS.get(name, name), "io")


def backend_availability() -> dict[str, tuple[bool, str]]:
    """For each backend name, (available, reason) on this machine."""
    return {
        name: _C.probe_backend(value)
        for name, value in BackendType.__members__.items()
        if name != "Unknown"
    }


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
    "FabricBackendConfig",
    "IOEngine",
    "IOEngineConfig",
    "IOEngineSession",
    "MemoryDesc",
    "MemoryLocationType",
    "P2pBackendConfig",
    "PollCqMode",
    "RdmaBackendConfig",
    "SharedHostBuffer",
    "ShmBackendConfig",
    "StatusCode",
    "StatusDetail",
    "TcpBackendConfig",
    "TransferStatus",
    "XgmiBackendConfig",
    "__version__",
    "allocate_shared_host_memory",
    "backend_availability",
    "backend_from_name",
    "fabric_alloc",
    "fabric_free",
    "set_log_level",
    "wait_all",
]
