# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""IOEngine: MORI's mori.io API over the native engine.

Backends: TCP (any two hosts; GPU memory staged through pinned host buffers), SHM (same
host, host memory: CMA, or memcpy into shared host memory), P2P (same host, GPU memory,
CUDA IPC) and RDMA (ibverbs; tested only against an in-process loopback double). Regions
may be host or GPU memory; the backend is chosen per (local, remote) region pair.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Any

import mori.core
from mori.core import env, timeouts

from . import _C
from .descriptors import IPC_HANDLE_BYTES, EngineDesc, MemoryDesc

BackendType = _C.BackendType
MemoryLocationType = _C.MemoryLocationType
StatusCode = _C.StatusCode
StatusDetail = _C.StatusDetail
TransferStatus = _C.TransferStatus


@dataclasses.dataclass
class IOEngineConfig:
    """Where the engine listens. ``port=0`` binds a free port (see get_engine_desc)."""

    host: str = "127.0.0.1"
    port: int = 0
    #: Per-pair backend override: "auto" (same host + host memory -> SHM, else TCP),
    #: "tcp" or "shm" (SHM where it can work, TCP elsewhere). None: MORI_IO_BACKEND,
    #: else auto.
    backend: str | None = None


def _native(native_type: Any, config: Any) -> Any:
    """``native_type()`` with every field of the dataclass ``config`` copied onto it."""
    c = native_type()
    for f in dataclasses.fields(config):
        setattr(c, f.name, getattr(config, f.name))
    return c


# The defaults of the config dataclasses are read from the native configs' default
# constructors, so a backend created implicitly in C++ (TCP under SHM, P2P or RDMA)
# behaves as one created here with defaults.
_TCP = _C.TcpBackendConfig()
_P2P = _C.P2pBackendConfig()


@dataclasses.dataclass
class TcpBackendConfig:
    """TCP backend settings.

    num_worker_threads: epoll reactor threads; qp_per_transfer: TCP connections per
    remote engine (MORI's name); chunk_size: bytes per part of a large transfer when
    enable_chunking; peer_timeout_ms: connect timeout and the bound on noticing a silent
    peer (TCP keepalive / TCP_USER_TIMEOUT); sock_buf_bytes: SO_SNDBUF/SO_RCVBUF, 0 keeps
    the kernel's autotuning.

    transfer_timeout_ms: a connection with requests outstanding that sends and receives
    nothing for this long belongs to a peer that is alive but stuck (stopped, hung): it
    is closed within about this bound plus 200 ms, its transfers fail with
    ERR_TIMEOUT, and later transfers to that peer fail at once (ERR_PEER_LOST) until it
    is registered again, even if it resumes. idle_timeout_ms: an authenticated inbound
    connection that carried nothing for this long is closed by the target (within about
    this bound plus 200 ms); its initiator connects again on its next transfer, which
    then succeeds as before (only a transfer submitted while the close crosses fails,
    ERR_PEER_LOST). Connections of initiators holding a grant of this engine (SHM, P2P),
    a notice ring, or any on an engine with RDMA are not closed as idle; 0: never.
    max_inbound_statuses: inbound transfer
    statuses kept for pop_inbound_transfer_status; past it the oldest is dropped (with
    a debug log), so a target that never pops keeps bounded memory.
    max_inbound_status_bytes: the same bound in bytes (each initiator's key once while
    it has statuses held, plus about 150 bytes per status; at least 65536): past it the
    oldest is dropped too.
    enable_notification (MORI's name): False keeps no inbound statuses at all, so
    pop_inbound_transfer_status always returns None on this engine.

    max_pending_hellos: inbound connections still in their hello at a time (each costs
    a descriptor and a few KiB); past it the oldest is closed and counted
    (``_engine.hellos_dropped``). max_connections_per_peer: open inbound connections per
    initiator key; a hello past it is refused (its initiator connects again on its next
    transfer) and counted in ``_engine.hellos_refused``. Every phase of an inbound
    connection has a deadline: the hello peer_timeout_ms, a header transfer_timeout_ms,
    a payload 1 MiB/s after transfer_timeout_ms, unread answers transfer_timeout_ms.

    Defaults are the native config's (``_C.TcpBackendConfig()``).
    """

    num_worker_threads: int = _TCP.num_worker_threads
    qp_per_transfer: int = _TCP.qp_per_transfer
    enable_chunking: bool = _TCP.enable_chunking
    chunk_size: int = _TCP.chunk_size
    peer_timeout_ms: int = _TCP.peer_timeout_ms
    sock_buf_bytes: int = _TCP.sock_buf_bytes
    transfer_timeout_ms: int = _TCP.transfer_timeout_ms
    idle_timeout_ms: int = _TCP.idle_timeout_ms
    max_inbound_statuses: int = _TCP.max_inbound_statuses
    max_inbound_status_bytes: int = _TCP.max_inbound_status_bytes
    enable_notification: bool = _TCP.enable_notification
    max_pending_hellos: int = _TCP.max_pending_hellos
    max_connections_per_peer: int = _TCP.max_connections_per_peer

    def to_native(self) -> Any:
        """The native config (``_C.TcpBackendConfig``), validated by the engine. The
        timeouts follow mori.core.timeouts: NaN, 0 (but idle_timeout_ms=0: never) and
        negative values raise InvalidArgumentError naming the field; inf and values
        beyond the native int fields (about 24.8 days) saturate to that bound."""
        fields = dataclasses.replace(self)
        for name in ("peer_timeout_ms", "transfer_timeout_ms", "idle_timeout_ms"):
            value = timeouts.milliseconds(
                getattr(self, name),
                f"TcpBackendConfig.{name}",
                zero_means_never=name == "idle_timeout_ms",
            )
            setattr(fields, name, value)
        return _native(_C.TcpBackendConfig, fields)


@dataclasses.dataclass
class ShmBackendConfig:
    """SHM backend settings (none yet). SHM moves host memory between processes of one
    host with CMA (process_vm_readv/writev), one copy; its requests and grants ride on
    the TCP backend's connections (created with defaults if TCP was not)."""


@dataclasses.dataclass
class P2pBackendConfig:
    """P2P backend settings (MORI's XGMI backend; same host, GPU memory, CUDA IPC).

    num_streams: copy streams per GPU, used round robin by transfers. max_blocks: SMs
    (blocks of 512 threads) one gather/scatter kernel may occupy. A transfer of at least
    kernel_min_spans spans whose mean span is at most kernel_max_mean_span bytes is moved
    by one kernel launch; others by one cudaMemcpyAsync per span (copy engines).
    Defaults are the native config's (``_C.P2pBackendConfig()``)."""

    num_streams: int = _P2P.num_streams
    max_blocks: int = _P2P.max_blocks
    kernel_min_spans: int = _P2P.kernel_min_spans
    kernel_max_mean_span: int = _P2P.kernel_max_mean_span

    def to_native(self) -> Any:
        """The native config (``_C.P2pBackendConfig``)."""
        return _native(_C.P2pBackendConfig, self)


@dataclasses.dataclass
class XgmiBackendConfig:
    """MORI's XgmiBackendConfig(num_streams, num_events) for the same-host GPU backend
    (P2P here; MORI's XGMI). num_streams: copy streams per GPU (1..64); num_events:
    MORI's event-pool size, validated (>= 1) but not a bound here: mori's P2P backend
    grows its event pool on demand. The other fields are P2pBackendConfig's."""

    num_streams: int = 64
    num_events: int = 64
    max_blocks: int = _P2P.max_blocks
    kernel_min_spans: int = _P2P.kernel_min_spans
    kernel_max_mean_span: int = _P2P.kernel_max_mean_span

    def to_native(self) -> Any:
        """The native config (``_C.P2pBackendConfig``)."""
        if isinstance(self.num_events, bool) or not isinstance(self.num_events, int):
            raise mori.core.InvalidArgumentError(
                f"XgmiBackendConfig.num_events={self.num_events!r}: must be an int"
            )
        if self.num_events < 1:
            raise mori.core.InvalidArgumentError(
                f"XgmiBackendConfig.num_events={self.num_events}: must be >= 1"
            )
        return P2pBackendConfig(
            self.num_streams, self.max_blocks, self.kernel_min_spans, self.kernel_max_mean_span
        ).to_native()


@dataclasses.dataclass
class FabricBackendConfig:
    """MORI's FabricBackendConfig(num_streams, num_events), accepted so that MORI code
    imports; creating the FABRIC backend raises NotSupportedError (not implemented)."""

    num_streams: int = 64
    num_events: int = 64


def fabric_alloc(size: int, device: int) -> int:
    """MORI's allocator of fabric-exportable GPU memory: not implemented in mori."""
    raise mori.core.NotSupportedError(
        f"fabric_alloc(size={size}, device={device}): the FABRIC backend is not implemented"
    )


def fabric_free(ptr: int) -> None:
    """MORI's counterpart of fabric_alloc: not implemented in mori."""
    raise mori.core.NotSupportedError(
        f"fabric_free(ptr={ptr:#x}): the FABRIC backend is not implemented"
    )


def _node_id(hostname: str) -> str:
    """MORI's node id: MORI_NODE_ID if set, else the kernel boot id, else the hostname."""
    node = env.get("MORI_NODE_ID")
    if node:
        return node
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = ""
    return boot_id or hostname


_BUS_IDS: dict[int, str] = {}


def _gpu_bus_id(device_id: int) -> str:
    """The PCI bus id ("0000:19:00.0", lower case) of CUDA device ``device_id`` from
    mori.core.topology; "" where it is not known (no such GPU, CPU-only build)."""
    if device_id < 0:
        return ""
    if not _BUS_IDS:
        from mori.core import topology

        for gpu in topology.get_topology().gpus:
            _BUS_IDS[gpu.index] = gpu.pci_bus_id.lower()
    return _BUS_IDS.get(device_id, "")


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype_code", ctypes.c_uint8),
        ("dtype_bits", ctypes.c_uint8),
        ("dtype_lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _dlpack_region(obj: Any) -> tuple[int, int, int, Any]:
    """(address, bytes, device_id, location) of a contiguous __dlpack__ object."""
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = t.dtype_bits * t.dtype_lanes // 8
    n = 1
    for d in shape:
        n *= d
    if t.strides:
        expected = itemsize
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] * itemsize != expected:
                raise mori.core.InvalidArgumentError("register: the array must be C-contiguous")
            expected *= shape[i]
    # kDLCPU = 1, kDLCUDAHost = 3 (host memory); kDLCUDA = 2.
    if t.device_type in (1, 3):
        loc, dev = MemoryLocationType.CPU, -1
    elif t.device_type == 2:
        loc, dev = MemoryLocationType.GPU, t.device_id
    else:
        raise mori.core.InvalidArgumentError(f"register: DLPack device type {t.device_type}")
    return (t.data or 0) + t.byte_offset, n * itemsize, dev, loc


def _array_interface_region(array: Any) -> tuple[int, int]:
    """(address, bytes) of a C-contiguous array with ``__array_interface__`` and
    ``nbytes`` (numpy arrays, SharedHostBuffer)."""
    iface = array.__array_interface__
    shape, strides = iface["shape"], iface.get("strides")
    if strides is not None:  # None means C-contiguous
        expected = array.nbytes // max(1, math.prod(shape))  # the item size
        for i in reversed(range(len(shape))):
            if shape[i] != 1 and strides[i] != expected:
                raise mori.core.InvalidArgumentError("register_array: array must be C-contiguous")
            expected *= shape[i]
    return iface["data"][0], array.nbytes


class IOEngineSession:
    """Transfers between one local and one remote region, with the regions' lookups done
    once. Several threads may share a session (each operation looks the remote engine
    up, so it follows a re-registered or replaced peer)."""

    def __init__(self, native: Any, engine: Any):
        self._sess = native
        self._engine = engine  # the native engine, for transfer uids
        # The native methods of the same signature shadow read/write below (documented
        # there): a small single transfer then pays no Python frame (BENCHMARKS.md).
        self.read = native.read
        self.write = native.write
        self.allocate_transfer_uid = engine.allocate_transfer_uid

    def allocate_transfer_uid(self) -> int:
        """A transfer id unique within the engine this session belongs to."""
        return self._engine.allocate_transfer_uid()

    def read(self, local_offset: int, remote_offset: int, size: int, transfer_uid: int):
        """Read ``size`` bytes at remote_offset into local_offset. -> TransferStatus"""
        return self._sess.transfer(False, local_offset, remote_offset, size, transfer_uid)

    def backend(self) -> tuple[str, str]:
        """(backend name, reason) this session's transfers use, e.g. ("SHM", "same host...")."""
        return self._sess.backend()

    def write(self, local_offset: int, remote_offset: int, size: int, transfer_uid: int):
        """Write ``size`` bytes at local_offset to remote_offset. -> TransferStatus"""
        return self._sess.transfer(True, local_offset, remote_offset, size, transfer_uid)

    def batch_read(self, local_offsets, remote_offsets, sizes, transfer_uid: int):
        """Many reads as one transfer (one status). Offsets and sizes in bytes:
        int sequences or 1-D integer arrays (numpy arrays are read in place)."""
        return self._sess.batch_transfer(False, local_offsets, remote_offsets, sizes, transfer_uid)

    def batch_write(self, local_offsets, remote_offsets, sizes, transfer_uid: int):
        """Many writes as one transfer (one status). Offsets and sizes in bytes:
        int sequences or 1-D integer arrays (numpy arrays are read in place)."""
        return self._sess.batch_transfer(True, local_offsets, remote_offsets, sizes, transfer_uid)

    def alive(self) -> bool:
        """Whether the remote engine is registered and its connections are up."""
        return self._sess.alive()


class IOEngine:
    """A point-to-point transfer engine named by a unique ``key``.

    One-sided: a read is served by the remote engine from memory registered with it; a
    write completes when the bytes are in place there. A remote engine can only touch
    memory registered here, within bounds.
    """

    def __init__(self, key: str, config: IOEngineConfig | None = None):
        config = config or IOEngineConfig()
        self._key = key
        self._engine = _C.Engine(key, config.host, config.port)
        # The native method shadows allocate_transfer_uid below (documented there): one
        # Python frame fewer per transfer.
        self.allocate_transfer_uid = self._engine.allocate_transfer_uid
        if config.backend is not None:
            self._engine.set_backend_override(config.backend)
        self._backends: list[str] = []
        self._keep: dict[int, Any] = {}  # mem id -> object that owns the memory
        # id(MemoryDesc) -> (that descriptor, its native RemoteRegion): descriptors are
        # immutable and held here, so an id names the same one while cached; a transfer
        # then passes one native object instead of converting four fields.
        self._remotes: dict[int, tuple[MemoryDesc, _C.RemoteRegion]] = {}
        # The backends this engine was registered with itself under (None: not yet).
        self._self_peer: tuple[str, ...] | None = None

    # -- engine ----------------------------------------------------------------------
    def create_backend(self, type: BackendType, config: Any = None) -> None:
        """Start a backend: BackendType.TCP (TcpBackendConfig), BackendType.SHM
        (ShmBackendConfig), BackendType.P2P (P2pBackendConfig; raises
        NotSupportedError without CUDA or a GPU) or BackendType.RDMA (RdmaBackendConfig
        from mori.io.rdma; raises NotSupportedError naming why where libibverbs or an
        active RDMA port is missing). Create TCP first to configure the connections the
        other backends send their control messages on. A backend this engine already
        has is kept and the call only logs a warning (MORI's behaviour; e.g. P2P after
        RDMA created it with ``MORI_DISABLE_AUTO_XGMI=0``)."""
        if isinstance(type, BackendType) and type.name in self._backends:
            mori.core.log.log(
                "io", "warn", f"engine {self._key!r} already has a {type.name} backend: kept"
            )
            return
        if type == BackendType.SHM:
            self._engine.create_shm_backend()
            self._backends.append(type.name)
            return
        if type == BackendType.FABRIC:
            raise mori.core.NotSupportedError(
                "create_backend(BackendType.FABRIC): the FABRIC backend (a scale-up fabric "
                "across nodes) is not implemented in mori"
            )
        if type == BackendType.P2P:
            self._engine.create_p2p_backend((config or P2pBackendConfig()).to_native())
            self._backends.append(type.name)
            return
        if type == BackendType.RDMA:
            self._create_rdma_backend(config)
            return
        if type != BackendType.TCP:
            raise mori.core.InvalidArgumentError(f"unknown backend {type!r}")
        self._engine.create_tcp_backend((config or TcpBackendConfig()).to_native())
        self._backends.append(type.name)

    def _create_rdma_backend(self, config: Any) -> None:
        """RDMA, and MORI's opt-in XGMI companion: with ``MORI_DISABLE_AUTO_XGMI=0`` a
        P2P (MORI's XGMI) backend is created beside RDMA where a GPU is usable (its
        failure only logged), and on a host without an RDMA device P2P alone (MORI's
        XGMI-only fallback; NotSupportedError naming both reasons without a GPU
        either). Unset or on: RDMA alone, as MORI's default; any other value is refused
        (docs/configuration.md)."""
        from .rdma import RdmaBackendConfig

        auto_p2p = not env.get_bool("MORI_DISABLE_AUTO_XGMI", True)
        native = (config or RdmaBackendConfig()).to_native()  # a refused config raises here
        try:
            self._engine.create_rdma_backend(native)
        except mori.core.NotSupportedError as e:
            if not auto_p2p:
                raise mori.core.NotSupportedError(
                    f"{e}; set MORI_DISABLE_AUTO_XGMI=0 to fall back to the P2P (XGMI) "
                    "backend for GPU memory on this host"
                ) from None
            if "P2P" in self._backends:
                return
            try:
                self._engine.create_p2p_backend(P2pBackendConfig().to_native())
            except mori.core.NotSupportedError as p2p_error:
                raise mori.core.NotSupportedError(
                    f"create_backend(RDMA) with MORI_DISABLE_AUTO_XGMI=0: no RDMA ({e}) and "
                    f"no P2P fallback ({p2p_error})"
                ) from None
            mori.core.log.log("io", "warn", f"no RDMA ({e}): P2P (XGMI) backend only")
            self._backends.append("P2P")
            return
        self._backends.append(BackendType.RDMA.name)
        if auto_p2p and "P2P" not in self._backends:
            try:
                self._engine.create_p2p_backend(P2pBackendConfig().to_native())
                self._backends.append("P2P")
            except mori.core.MoriError as e:
                mori.core.log.log("io", "info", f"no P2P (XGMI) backend beside RDMA: {e}")

    def get_engine_desc(self) -> EngineDesc:
        """This engine's EngineDesc (pack() it for other processes)."""
        hostname = socket.gethostname()
        return EngineDesc(
            self._key, self._engine.host, self._engine.port, hostname, os.getpid(),
            tuple(self._backends), self._engine.host_id, _node_id(hostname),
            self._engine.secret,
        )  # fmt: skip

    def register_remote_engine(self, engine_desc: EngineDesc) -> None:
        """Make a remote engine reachable; registering again reconnects (after a failure)."""
        backends = engine_desc.backends
        self._engine.register_remote_engine(
            _C.RemoteEngine(
                engine_desc.key, engine_desc.host, engine_desc.port,
                host_id=engine_desc.host_id, pid=engine_desc.pid,
                remote_shm="SHM" in backends, remote_p2p="P2P" in backends,
                remote_rdma="RDMA" in backends, secret=bytes(engine_desc.secret),
            )
        )  # fmt: skip

    def backend_for(self, local_mem: MemoryDesc, remote_mem: MemoryDesc) -> tuple[str, str]:
        """(backend name, reason) that transfers between these two regions use: P2P for
        GPU memory of two engines on one host when both created P2P; SHM for host
        memory of two engines on one host when both created SHM and CMA works (probed
        against the peer on first use, connecting if needed); else TCP. An SHM reason
        names the copy: "SHM: mapped memcpy (...)" where the remote region lies in the
        peer's shared host memory (allocate_shared_host_memory; asked for on first use),
        else "SHM: CMA process_vm_readv/writev (...)" and why it is not mapped."""
        self._check_local(local_mem)
        self._reach_self(remote_mem)
        return self._engine.backend_for(local_mem.loc, self._remote(remote_mem))

    def deregister_remote_engine(self, engine_desc: EngineDesc) -> None:
        """Forget a remote engine; its in-flight transfers fail."""
        self._engine.deregister_remote_engine(engine_desc.key)
        if engine_desc.key == self._key:
            self._self_peer = None  # the next transfer to this engine registers it again

    # -- memory ----------------------------------------------------------------------
    def register_memory(
        self,
        ptr: int,
        size: int,
        device_id: int = -1,
        mem_loc: MemoryLocationType = None,
        *,
        loc: MemoryLocationType = None,
    ) -> MemoryDesc:
        """Register ``size`` bytes at address ``ptr`` (the caller keeps them alive).

        MORI's signature, ``register_memory(ptr, size, device_id, mem_loc)``; ``mem_loc``
        defaults to CPU here (``loc=`` is accepted as an older spelling). The MemoryDesc
        carries the GPU's PCI bus id (GPU memory) or the NUMA node of the first page
        (host memory), as MORI's does."""
        if loc is not None and mem_loc is not None and loc != mem_loc:
            raise mori.core.InvalidArgumentError(
                f"register_memory: mem_loc={mem_loc!r} and loc={loc!r} disagree"
            )
        mem_loc = mem_loc if mem_loc is not None else loc
        mem_loc = MemoryLocationType.CPU if mem_loc is None else MemoryLocationType(mem_loc)
        ptr, size, device_id = int(ptr), int(size), int(device_id)
        mid, capability = self._engine.register_memory(ptr, size, device_id, mem_loc)
        bus_id, numa, handle = "", -1, b""
        if mem_loc == MemoryLocationType.GPU:
            bus_id = _gpu_bus_id(device_id)
            if "P2P" in self._backends:  # MORI fills it where its XGMI backend exists
                handle = _C.cuda_ipc_handle(ptr, device_id)
        elif ptr != 0 and size > 0:
            numa = _C.numa_node_of(ptr)
        return MemoryDesc(
            self._key, mid, device_id, ptr, size, mem_loc, device_bus_id=bus_id, numa_node=numa,
            ipc_handle=handle or bytes(IPC_HANDLE_BYTES), capability=capability,
        )  # fmt: skip

    def register_torch_tensor(self, tensor: Any) -> MemoryDesc:
        """Register a contiguous torch tensor's storage (kept alive until deregistered)."""
        if not tensor.is_contiguous():
            raise mori.core.InvalidArgumentError("register_torch_tensor: tensor must be contiguous")
        if tensor.device.type == "cuda":
            loc, dev = MemoryLocationType.GPU, tensor.device.index
        else:
            loc, dev = MemoryLocationType.CPU, -1
        desc = self.register_memory(
            tensor.data_ptr(), tensor.numel() * tensor.element_size(), dev, loc
        )
        self._keep[desc.id] = tensor
        return desc

    def register_array(self, array: Any) -> MemoryDesc:
        """Register a C-contiguous numpy array, a SharedHostBuffer or any ``__dlpack__``
        object (kept alive until deregistered)."""
        if hasattr(array, "__array_interface__"):
            addr, nbytes = _array_interface_region(array)
            desc = self.register_memory(addr, nbytes, -1, MemoryLocationType.CPU)
        elif hasattr(array, "__dlpack__"):
            addr, nbytes, dev, loc = _dlpack_region(array)
            desc = self.register_memory(addr, nbytes, dev, loc)
        else:
            raise mori.core.InvalidArgumentError(
                f"register_array: {type(array).__name__} has neither __array_interface__ "
                "nor __dlpack__; use register_memory(ptr, size, ...)"
            )
        self._keep[desc.id] = array
        return desc

    def deregister_memory(self, mem_desc: MemoryDesc) -> None:
        """Withdraw a region: later remote accesses to it are refused.

        Raises InvalidStateError (naming the count) while transfers still use it: this
        engine's transfers from or into it, or remote reads and writes being served from
        it. Once this returns, no byte moves into or out of the region over TCP."""
        self._check_local(mem_desc)
        self._engine.deregister_memory(mem_desc.id)
        self._keep.pop(mem_desc.id, None)

    def allocate_transfer_uid(self) -> int:
        """A transfer id unique within this engine (names a transfer to the target)."""
        return self._engine.allocate_transfer_uid()

    def _check_local(self, mem: MemoryDesc) -> None:
        if mem.engine_key != self._key:
            raise mori.core.InvalidArgumentError(
                f"memory {mem.id} belongs to engine {mem.engine_key!r}, not {self._key!r}"
            )

    def _reach_self(self, remote: MemoryDesc) -> None:
        """As in MORI, a region of this engine is a valid remote without
        register_remote_engine: the engine registers itself as a peer on first use (again
        after a new backend, so the route sees it). Without a backend nothing is
        registered and the transfer fails as any other would."""
        if remote.engine_key != self._key or not self._backends:
            return
        if self._self_peer != tuple(self._backends):
            self.register_remote_engine(self.get_engine_desc())
            self._self_peer = tuple(self._backends)

    # -- transfers -------------------------------------------------------------------
    def _remote(self, desc: MemoryDesc) -> _C.RemoteRegion:
        """The native engine's name for a remote region (key, id, size, location)."""
        hit = self._remotes.get(id(desc))
        if hit is not None and hit[0] is desc:
            return hit[1]
        if len(self._remotes) >= 4096:
            self._remotes.clear()
        region = _C.RemoteRegion(
            desc.engine_key, desc.id, desc.size, desc.loc, capability=desc.capability
        )
        self._remotes[id(desc)] = (desc, region)
        return region

    def _one(self, write, local, local_offset, remote, remote_offset, size, uid):
        self._check_local(local)
        self._reach_self(remote)
        return self._engine.transfer(
            write, local.id, local_offset, self._remote(remote), remote_offset, size, uid
        )

    def _batch(self, write, local, local_offsets, remote, remote_offsets, sizes, uid):
        self._check_local(local)
        self._reach_self(remote)
        return self._engine.batch_transfer(
            write, local.id, local_offsets, self._remote(remote), remote_offsets, sizes, uid
        )

    def read(self, local_dest_mem_desc, local_offset, remote_src_mem_desc, remote_offset, size,
             transfer_uid) -> TransferStatus:  # fmt: skip
        """Read ``size`` bytes from the remote region into the local one. -> TransferStatus"""
        return self._one(False, local_dest_mem_desc, local_offset, remote_src_mem_desc,
                         remote_offset, size, transfer_uid)  # fmt: skip

    def write(self, local_src_mem_desc, local_offset, remote_dest_mem_desc, remote_offset, size,
              transfer_uid) -> TransferStatus:  # fmt: skip
        """Write ``size`` local bytes into the remote region. -> TransferStatus"""
        return self._one(True, local_src_mem_desc, local_offset, remote_dest_mem_desc,
                         remote_offset, size, transfer_uid)  # fmt: skip

    def _batches(self, write, local, local_offsets, remote, remote_offsets, sizes, uids):
        n = len(local)
        lengths = {"remote": len(remote), "local_offsets": len(local_offsets),
                   "remote_offsets": len(remote_offsets), "sizes": len(sizes),
                   "transfer_uids": len(uids)}  # fmt: skip
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise mori.core.InvalidArgumentError(
                f"batch: {n} local descriptors but {bad} (one entry per descriptor pair)"
            )
        return [
            self._batch(write, local[i], local_offsets[i], remote[i], remote_offsets[i],
                        sizes[i], uids[i])
            for i in range(n)
        ]  # fmt: skip

    def batch_read(self, local_dest_mem_desc, local_offsets, remote_src_mem_desc, remote_offsets,
                   sizes, transfer_uid):  # fmt: skip
        """Many reads. MORI's form: lists of local descriptors, of offset lists, of remote
        descriptors, of offset lists, of size lists and of uids, one entry per descriptor
        pair -> a list with one TransferStatus per pair. With one MemoryDesc each side
        (mori's form): one batch between two regions -> one TransferStatus."""
        if isinstance(local_dest_mem_desc, MemoryDesc):
            return self._batch(False, local_dest_mem_desc, local_offsets, remote_src_mem_desc,
                               remote_offsets, sizes, transfer_uid)  # fmt: skip
        return self._batches(False, local_dest_mem_desc, local_offsets, remote_src_mem_desc,
                             remote_offsets, sizes, transfer_uid)  # fmt: skip

    def batch_write(self, local_src_mem_desc, local_offsets, remote_dest_mem_desc, remote_offsets,
                    sizes, transfer_uid):  # fmt: skip
        """Many writes; the forms of batch_read (MORI's lists -> one status per pair, or one
        MemoryDesc each side -> one status)."""
        if isinstance(local_src_mem_desc, MemoryDesc):
            return self._batch(True, local_src_mem_desc, local_offsets, remote_dest_mem_desc,
                               remote_offsets, sizes, transfer_uid)  # fmt: skip
        return self._batches(True, local_src_mem_desc, local_offsets, remote_dest_mem_desc,
                             remote_offsets, sizes, transfer_uid)  # fmt: skip

    def wait_all(self, statuses, timeout_ms: int = -1) -> StatusCode:
        """MORI's wait: every status, failure wins. -> StatusCode

        timeout_ms < 0 waits for all (each transfer is bounded by its peer's timeouts) and
        returns the first failure in list order, else SUCCESS; 0 polls once: the first
        failure seen, else IN_PROGRESS if any is unfinished, else SUCCESS; > 0 waits up
        to the deadline and returns IN_PROGRESS if it passed first (a failure seen
        before wins). None entries are skipped; an empty list is SUCCESS. inf or more
        than a year waits a year; NaN raises InvalidArgumentError (mori.core.timeouts)."""
        return _wait_all(statuses, timeouts.wait_milliseconds(timeout_ms, "timeout_ms"))

    def create_session(
        self, local_mem: MemoryDesc, remote_mem: MemoryDesc
    ) -> IOEngineSession | None:
        """A session bound to (local_mem, remote_mem): the fast path for repeated transfers.

        None, as in MORI, when no backend can serve the pair: this engine has created no
        backend, or the remote engine is not registered (a region of this engine needs no
        registration)."""
        self._check_local(local_mem)
        self._reach_self(remote_mem)
        if not self._backends or not self._engine.has_remote_engine(remote_mem.engine_key):
            return None
        return IOEngineSession(
            self._engine.create_session(local_mem.id, self._remote(remote_mem)),
            self._engine,
        )  # fmt: skip

    def pop_inbound_transfer_status(self, remote_key: str, transfer_uid: int):
        """Status of transfer ``transfer_uid`` that ``remote_key`` made into this engine,
        once all its data is in place; None before that (or if unknown). Popped once."""
        return self._engine.pop_inbound_transfer_status(remote_key, transfer_uid)

    def close(self) -> None:
        """Stop the reactors and close every connection; pending transfers fail."""
        # The shadowing native method (see __init__) holds the native engine too.
        self.__dict__.pop("allocate_transfer_uid", None)
        self._engine = None
        self._keep.clear()
        self._remotes.clear()

    def __enter__(self) -> IOEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Shared host memory, what allocate_shared_host_memory returns (see its docstring).
SharedHostBuffer = _C.SharedHostBuffer


def allocate_shared_host_memory(nbytes: int) -> SharedHostBuffer:
    """``nbytes`` bytes of zeroed host memory (a memfd) that same-host peers can map: an
    SHM transfer into or out of a region registered inside it is one ``memcpy`` by the
    initiator instead of a CMA copy (which pins pages on every call).

    Returns a :class:`SharedHostBuffer` whatever else is installed: 1-D, writable,
    C-contiguous uint8 bytes with the buffer protocol and ``__array_interface__``, so
    ``memoryview(buf)``, ``np.asarray(buf)`` / ``np.frombuffer(buf, np.uint8)`` and
    ``torch.frombuffer(buf, dtype=torch.uint8)`` view it without a copy. ``len(buf)``,
    ``buf.nbytes``, ``buf[i]``, ``buf[a:b]`` (a SharedHostBuffer over the same bytes),
    ``buf[a:b] = <bytes-like of b - a bytes>`` and ``buf.fill(byte)`` work as for a
    memoryview. The memory stays mapped while the buffer, a slice of it or any view
    made from them lives. Register it (or a slice, or a numpy view of it) with
    ``register_array``, or ``register_memory(buf.address, buf.nbytes)``."""
    return _C.SharedHostBuffer(int(nbytes))


def _wait_all(statuses: Iterable[TransferStatus | None], timeout_ms: int) -> StatusCode:
    statuses = [s for s in statuses if s is not None]
    first_error = None
    if timeout_ms == 0:
        pending = False
        for s in statuses:
            code = s.WaitFor(0)
            if code == StatusCode.IN_PROGRESS:
                pending = True
            elif code != StatusCode.SUCCESS:
                return code
        return StatusCode.IN_PROGRESS if pending else StatusCode.SUCCESS
    deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
    for s in statuses:
        if deadline is None:
            code = s.WaitFor(-1)
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return first_error if first_error is not None else StatusCode.IN_PROGRESS
            code = s.WaitFor(max(1, math.ceil(left * 1000)))
            if code == StatusCode.IN_PROGRESS:
                return first_error if first_error is not None else StatusCode.IN_PROGRESS
        if code != StatusCode.SUCCESS and first_error is None:
            first_error = code
    return first_error if first_error is not None else StatusCode.SUCCESS


def wait_all(statuses: Iterable[TransferStatus], timeout_ms: int | None = None) -> bool:
    """Wait for every status; True when all finished within ``timeout_ms`` (None: no limit,
    still bounded by the peers' timeouts; inf or more than a year: a year; a negative
    one polls once; NaN raises InvalidArgumentError)."""
    deadline = None
    if timeout_ms is not None:
        ms = max(0, timeouts.wait_milliseconds(timeout_ms, "timeout_ms"))
        deadline = time.monotonic() + ms / 1000
    for s in statuses:
        if deadline is None:
            s.Wait()
        elif s.WaitFor(max(0, int((deadline - time.monotonic()) * 1000))) == StatusCode.IN_PROGRESS:
            return False
    return True


__all__: Sequence[str] = [
    "BackendType", "EngineDesc", "IOEngine", "IOEngineConfig", "IOEngineSession",
    "FabricBackendConfig", "MemoryDesc", "MemoryLocationType", "P2pBackendConfig",
    "SharedHostBuffer", "fabric_alloc", "fabric_free",
    "ShmBackendConfig", "StatusCode", "StatusDetail",
    "TcpBackendConfig", "XgmiBackendConfig", "allocate_shared_host_memory",
    "TransferStatus",
    "wait_all",
]  # fmt: skip
