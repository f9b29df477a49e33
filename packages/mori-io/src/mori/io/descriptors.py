# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""EngineDesc and MemoryDesc: what one engine tells another, as compact bytes.

``pack()`` gives a msgpack array ``[tag, version, fields...]``; ``unpack()`` checks
the tag, the version and every field's type, and raises
``mori.core.InvalidArgumentError`` for anything else (never pickle: a peer's bytes
are data, not code).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

import mori.core

from . import _C

# MemoryDesc; 2 added device_bus_id, numa_node, ipc_handle (MORI's), 3 capability
FORMAT_VERSION = 3
# EngineDesc; 2 added host_id (same-host SHM), 3 node_id (MORI's), 4 secret (trust model)
ENGINE_DESC_VERSION = 4
SECRET_BYTES = 16  # an engine's secret (wire::kSecretBytes)
IPC_HANDLE_BYTES = 64  # MORI's ipc_handle width
_ENGINE_TAG = "mori.io.EngineDesc"
_MEMORY_TAG = "mori.io.MemoryDesc"
_MAX_BYTES = 1 << 16


def _decode(data: Any, tag: str, fields: list[tuple[str, type]], version: int) -> list[Any]:
    what = tag.rsplit(".", 1)[-1]
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise mori.core.InvalidArgumentError(
            f"{what}.unpack expects bytes, got {type(data).__name__}"
        )
    if len(data) > _MAX_BYTES:
        raise mori.core.InvalidArgumentError(
            f"{what}.unpack: {len(data)} bytes exceed the {_MAX_BYTES}-byte limit"
        )
    try:
        obj = msgpack.unpackb(bytes(data), raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise mori.core.InvalidArgumentError(
            f"{what}.unpack: {len(data)} bytes are not a packed {what} ({e})"
        ) from None
    if not isinstance(obj, list) or len(obj) < 2 or obj[0] != tag:
        raise mori.core.InvalidArgumentError(f"{what}.unpack: bytes are not a packed {what}")
    if obj[1] != version:
        older = isinstance(obj[1], int) and not isinstance(obj[1], bool) and obj[1] < version
        hint = " (packed by an older mori-io: upgrade the peer)" if older else ""
        raise mori.core.InvalidArgumentError(
            f"{what}.unpack: format version {obj[1]!r}, this mori-io reads {version}{hint}"
        )
    values = obj[2:]
    if len(values) != len(fields):
        raise mori.core.InvalidArgumentError(
            f"{what}.unpack: {len(values)} fields, expected {len(fields)}"
        )
    for (name, typ), value in zip(fields, values, strict=True):
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise mori.core.InvalidArgumentError(
                f"{what}.unpack: field {name} is {type(value).__name__}, expected {typ.__name__}"
            )
    return values


@dataclasses.dataclass(frozen=True)
class EngineDesc:
    """How to reach an engine: its unique key, listening address and backends.

    ``host_id`` ("<hostname>/<boot_id>/pidns:<inode>") and ``pid`` let a peer on the same
    host (equal host_id) reach the engine's memory with CMA (the SHM backend).
    ``node_id`` is MORI's: ``MORI_NODE_ID`` if set, else the kernel's boot id, else the
    hostname (informative here; mori decides "same host" by host_id).
    ``secret`` (16 random bytes, or empty) is what a connecting engine presents: the
    engine refuses connections without it (README "Trust model"). Hand an EngineDesc only
    to peers you trust; it is left out of repr()."""

    key: str
    host: str
    port: int
    hostname: str = ""
    pid: int = 0
    backends: tuple[str, ...] = ()
    host_id: str = ""
    node_id: str = ""
    secret: bytes = dataclasses.field(default=b"", repr=False)

    _FIELDS = [("key", str), ("host", str), ("port", int), ("hostname", str), ("pid", int),
               ("backends", list), ("host_id", str), ("node_id", str),
               ("secret", bytes)]  # fmt: skip

    def pack(self) -> bytes:
        """Compact versioned bytes (msgpack) for another process."""
        return msgpack.packb(
            [
                _ENGINE_TAG,
                ENGINE_DESC_VERSION,
                self.key,
                self.host,
                self.port,
                self.hostname,
                self.pid,
                list(self.backends),
                self.host_id,
                self.node_id,
                bytes(self.secret),
            ]  # fmt: skip
        )

    @classmethod
    def unpack(cls, data: bytes) -> EngineDesc:
        """Inverse of pack(); raises InvalidArgumentError on anything else."""
        key, host, port, hostname, pid, backends, host_id, node_id, secret = _decode(
            data, _ENGINE_TAG, cls._FIELDS, ENGINE_DESC_VERSION
        )
        if (
            not key
            or not (0 < port < 65536)
            or not (0 <= pid < (1 << 31))
            or not all(isinstance(b, str) for b in backends)
            or len(secret) not in (0, SECRET_BYTES)
        ):
            raise mori.core.InvalidArgumentError(
                f"EngineDesc.unpack: invalid key {key!r}, port {port}, pid {pid}, "
                f"backends {backends!r} or secret of {len(secret)} bytes (expected "
                f"{SECRET_BYTES})"
            )
        return cls(key, host, port, hostname, pid, tuple(backends), host_id, node_id, secret)


@dataclasses.dataclass(frozen=True)
class MemoryDesc:
    """A registered memory region of an engine. ``data`` is the owner's address and is
    informative only: a remote engine names the region by (engine_key, id), and the
    owner checks every access against its own registry.

    MORI's extra fields: ``device_bus_id`` (the GPU's PCI bus id, lower case, for GPU
    memory; else ""), ``numa_node`` (host memory: the NUMA node of its first page; else
    -1) and ``ipc_handle`` (64 bytes: for GPU memory registered by an engine with a P2P
    backend, MORI's XGMI, the cudaIpcMemHandle_t of the cudaMalloc allocation holding it,
    as MORI fills it; zeros otherwise, and for cuMem memory such as torch's expandable
    segments. mori's own P2P transfers do not use it: they get their handles over the
    control channel, from the owner, after its checks). ``MemoryDesc()`` is an empty
    descriptor, as MORI's default constructor gives.

    ``capability`` (64 random bits drawn at registration, left out of repr) must travel
    with the id: the owner refuses every request for the region without it, as for an id
    it never registered (README "Trust model")."""

    engine_key: str = ""
    id: int = 0
    device_id: int = -1
    data: int = 0
    size: int = 0
    loc: _C.MemoryLocationType = _C.MemoryLocationType.Unknown
    device_bus_id: str = ""
    numa_node: int = -1
    ipc_handle: bytes = bytes(IPC_HANDLE_BYTES)
    capability: int = dataclasses.field(default=0, repr=False)

    _FIELDS = [("engine_key", str), ("id", int), ("device_id", int), ("data", int),
               ("size", int), ("loc", int), ("device_bus_id", str), ("numa_node", int),
               ("ipc_handle", bytes), ("capability", int)]  # fmt: skip

    @property
    def length(self) -> int:
        """MORI's name for size (bytes)."""
        return self.size

    def pack(self) -> bytes:
        """Compact versioned bytes (msgpack) for another process."""
        return msgpack.packb(
            [
                _MEMORY_TAG,
                FORMAT_VERSION,
                self.engine_key,
                self.id,
                self.device_id,
                self.data,
                self.size,
                int(self.loc),
                self.device_bus_id,
                self.numa_node,
                # all zeros (mori never fills it) packs as b"": compact descriptors
                bytes(self.ipc_handle) if any(self.ipc_handle) else b"",
                self.capability,
            ]  # fmt: skip
        )

    @classmethod
    def unpack(cls, data: bytes) -> MemoryDesc:
        """Inverse of pack(); raises InvalidArgumentError on anything else."""
        key, mid, dev, addr, size, loc, bus, numa, handle, cap = _decode(
            data, _MEMORY_TAG, cls._FIELDS, FORMAT_VERSION
        )
        locs = {int(v): v for v in _C.MemoryLocationType.__members__.values()}
        if (
            not key
            or mid <= 0
            or size < 0
            or addr < 0
            or loc not in locs
            or numa < -1
            or len(handle) not in (0, IPC_HANDLE_BYTES)
            or not 0 <= cap < 1 << 64
        ):
            raise mori.core.InvalidArgumentError(
                f"MemoryDesc.unpack: invalid engine key {key!r}, id {mid}, size {size}, "
                f"address {addr}, location {loc}, numa node {numa}, ipc handle of "
                f"{len(handle)} bytes (expected {IPC_HANDLE_BYTES}, or 0 for zeros) or a "
                "capability outside 64 bits"
            )
        return cls(
            key, mid, dev, addr, size, locs[loc], bus, numa, handle or bytes(IPC_HANDLE_BYTES), cap
        )
