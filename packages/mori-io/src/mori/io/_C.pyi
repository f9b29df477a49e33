# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Type stubs for mori.io._C."""

import enum
from collections.abc import Sequence
from typing import Any, overload

__mori_core_version_compiled__: str

wire_version: int  # the control protocol's version

class BackendType(enum.IntEnum):
    Unknown = 0
    P2P = 1  # also BackendType.XGMI
    RDMA = 2
    TCP = 3
    FABRIC = 4
    SHM = 5

class StatusCode(enum.IntEnum):
    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_RDMA_OP = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15

class StatusDetail(enum.IntEnum):
    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_TRANSPORT = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15
    ERR_OUT_OF_BOUNDS = 21
    ERR_PEER_LOST = 22
    ERR_TIMEOUT = 23

class MemoryLocationType(enum.IntEnum):
    Unknown = 0
    CPU = 1
    GPU = 2

class TransferStatus:
    def __init__(self) -> None: ...
    def Code(self) -> StatusCode: ...
    def Detail(self) -> StatusDetail: ...
    def Message(self) -> str: ...
    def Init(self) -> bool: ...
    def InProgress(self) -> bool: ...
    def Succeeded(self) -> bool: ...
    def Failed(self) -> bool: ...
    def SetCode(self, code: StatusCode) -> None: ...
    def SetMessage(self, message: str) -> None: ...
    def Update(self, code: StatusCode, message: str) -> None: ...
    def Wait(self) -> None: ...
    def WaitFor(self, timeout_ms: float = -1) -> StatusCode: ...

class Session:
    def transfer(
        self, write: bool, local_offset: int, remote_offset: int, size: int, uid: int
    ) -> TransferStatus: ...
    def write(
        self, local_offset: int, remote_offset: int, size: int, transfer_uid: int
    ) -> TransferStatus: ...
    def read(
        self, local_offset: int, remote_offset: int, size: int, transfer_uid: int
    ) -> TransferStatus: ...
    def batch_transfer(
        self,
        write: bool,
        local_offsets: Sequence[int],
        remote_offsets: Sequence[int],
        sizes: Sequence[int],
        uid: int,
    ) -> TransferStatus: ...
    def alive(self) -> bool: ...
    def backend(self) -> tuple[str, str]: ...

class TcpBackendConfig:
    """The native TCP config; its defaults are mori.io.TcpBackendConfig's."""

    num_worker_threads: int
    qp_per_transfer: int
    enable_chunking: bool
    chunk_size: int
    peer_timeout_ms: int
    sock_buf_bytes: int
    transfer_timeout_ms: int
    idle_timeout_ms: int
    max_pending_hellos: int
    max_connections_per_peer: int
    max_inbound_statuses: int
    max_inbound_status_bytes: int
    enable_notification: bool
    def __init__(self) -> None: ...

class P2pBackendConfig:
    """The native P2P config; its defaults are mori.io.P2pBackendConfig's."""

    num_streams: int
    max_blocks: int
    kernel_min_spans: int
    kernel_max_mean_span: int
    def __init__(self) -> None: ...

class SharedHostBuffer:
    """Shared host memory (a memfd): 1-D writable uint8 bytes with the buffer protocol."""

    address: int
    size: int
    nbytes: int
    offset: int
    __array_interface__: dict[str, Any]
    def __init__(self, size: int) -> None: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> SharedHostBuffer: ...
    @overload
    def __setitem__(self, index: int, value: int) -> None: ...
    @overload
    def __setitem__(self, index: slice, value: Any) -> None: ...  # a C-contiguous buffer
    def fill(self, value: int) -> None: ...

class RemoteRegion:
    engine_key: str
    mem_id: int
    size: int
    loc: MemoryLocationType
    capability: int
    def __init__(
        self,
        engine_key: str,
        mem_id: int,
        size: int,
        loc: MemoryLocationType = ...,
        *,
        capability: int = ...,
    ) -> None: ...

class RemoteEngine:
    key: str
    host: str
    port: int
    host_id: str
    pid: int
    remote_shm: bool
    remote_p2p: bool
    remote_rdma: bool
    def __init__(
        self,
        key: str,
        host: str,
        port: int,
        *,
        host_id: str = "",
        pid: int = 0,
        remote_shm: bool = False,
        remote_p2p: bool = False,
        remote_rdma: bool = False,
        secret: bytes = b"",
    ) -> None: ...

class Engine:
    key: str
    host: str
    port: int
    has_tcp_backend: bool
    has_shm_backend: bool
    host_id: str
    secret: bytes
    hellos_refused: int
    hellos_dropped: int
    idle_connections_closed: int
    announcements_refused: int
    answers_read_by_waiters: int
    shm_split_copies: int
    hot_path_options: dict[str, bool | int]
    def __init__(self, key: str, host: str, port: int) -> None: ...
    def create_tcp_backend(self, config: TcpBackendConfig) -> None: ...
    def register_memory(
        self, addr: int, size: int, device_id: int, loc: MemoryLocationType
    ) -> tuple[int, int]: ...
    def deregister_memory(self, id: int) -> None: ...
    def create_shm_backend(self) -> None: ...
    def create_p2p_backend(self, config: P2pBackendConfig) -> None: ...
    @staticmethod
    def p2p_unavailable() -> str: ...
    def p2p_mapping_kind(self, remote_key: str, mem_id: int) -> int: ...
    def create_rdma_backend(self, config: Any) -> None: ...  # config: rdma.BackendConfig
    def set_backend_override(self, backend: str) -> None: ...
    def backend_for(
        self, local_loc: MemoryLocationType, remote: RemoteRegion
    ) -> tuple[str, str]: ...
    def register_remote_engine(self, remote: RemoteEngine) -> None: ...
    def deregister_remote_engine(self, key: str) -> None: ...
    def has_remote_engine(self, key: str) -> bool: ...
    def allocate_transfer_uid(self) -> int: ...
    def transfer(
        self,
        write: bool,
        local_mem: int,
        local_offset: int,
        remote: RemoteRegion,
        remote_offset: int,
        size: int,
        uid: int,
    ) -> TransferStatus: ...
    def batch_transfer(
        self,
        write: bool,
        local_mem: int,
        local_offsets: Sequence[int],
        remote: RemoteRegion,
        remote_offsets: Sequence[int],
        sizes: Sequence[int],
        uid: int,
    ) -> TransferStatus: ...
    def pop_inbound_transfer_status(self, remote_key: str, uid: int) -> TransferStatus | None: ...
    def create_session(self, local_mem: int, remote: RemoteRegion) -> Session: ...
    def ledger_stats(self) -> dict[str, int]: ...
    def inbound_stats(self) -> dict[str, int]: ...
    def grant_stats(self) -> dict[str, int]: ...

def probe_backend(backend: BackendType) -> tuple[bool, str]: ...
def numa_node_of(addr: int) -> int: ...
def cuda_ipc_handle(addr: int, device: int) -> bytes: ...
def raw_socket_stream(
    msg_size: int, count: int, ack_each: bool = False, sock_buf_bytes: int = 0
) -> dict[str, float]: ...
def memcpy_stream(size: int, count: int) -> dict[str, float]: ...
def cuda_copy_seconds(
    src_dev: int,
    dst_dev: int,
    size: int,
    batch: int,
    iters: int,
    sync_each: bool,
    per_transfer: bool = False,
) -> float: ...
def rdma_probe() -> tuple[bool, str, list[str]]: ...

# How the RDMA backend was built: compiled in, or compiled out and why (MORI_IO_RDMA).
rdma_build: str

# The RDMA backend's native config (BackendConfig, QpConfig, PollCqMode,
# mtu_enum_from_bytes) that mori.io.rdma builds: see csrc/rdma_py.cpp. A test build
# (MORI_IO_TESTING=ON) adds _testing (csrc/testing/), which no wheel carries.
rdma: Any
