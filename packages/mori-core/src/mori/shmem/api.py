# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's host shmem functions, over :mod:`mori.core.shmem`.

Names, parameters, defaults and return types are ROCm/mori's, so ported code keeps
its calls. Two differences are deliberate: failures raise mori's exceptions
(:class:`mori.core.MoriError` subclasses, naming the values) instead of returning a
non-zero status or a null address, and :func:`shmem_finalize` refuses, on every pe,
while any pe still holds allocations (ROCm/mori tears the heap down under them).
Where ROCm/mori returns a status code, success is ``0``.

Nothing here imports torch until a function that needs it is called.
"""

from __future__ import annotations

import socket
import struct

from mori.core import _C, env
from mori.core import shmem as _shmem
from mori.core.errors import InvalidArgumentError, InvalidStateError, NotSupportedError

# shmem_init_attr flags, ROCm/mori's values.
MORI_SHMEM_INIT_WITH_MPI_COMM = 0
MORI_SHMEM_INIT_WITH_UNIQUEID = 1

# A unique id is rank 0's bootstrap address, padded to ROCm/mori's 128 bytes:
# magic, version, port, then the host as NUL-padded UTF-8.
UNIQUE_ID_BYTES = 128
_UID_MAGIC = b"MORIUID"
_UID_VERSION = 1
_UID_HEADER = struct.Struct("<7sBH")
_UID_HOST_BYTES = UNIQUE_ID_BYTES - _UID_HEADER.size


def _resolve_group(group_name: str):
    try:
        import torch.distributed as dist
    except ImportError:
        raise NotSupportedError(
            "shmem_torch_process_group_init needs torch; without it use "
            "shmem_get_unique_id() / shmem_init_attr()"
        ) from None
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidStateError(
            "shmem_torch_process_group_init: torch.distributed is not initialized; call "
            "torch.distributed.init_process_group() first, or use shmem_init_attr()"
        )
    try:
        return dist.distributed_c10d._resolve_process_group(group_name)
    except RuntimeError:
        known = sorted(set(dist.distributed_c10d._world.pg_names.values()))
        raise InvalidArgumentError(
            f"no process group is registered under the name {group_name!r} (groups by "
            f"their own names: {known}); register one with "
            f"torch._C._distributed_c10d._register_process_group({group_name!r}, group)"
        ) from None


def shmem_torch_process_group_init(group_name: str) -> int:
    """Collective over the torch process group registered as ``group_name``: create
    the symmetric heap, on the current CUDA device when torch sees one, else on the
    host. The heap size per pe is MORI_SHMEM_HEAP_SIZE (default 1 GiB).

    ``group_name`` is a name given with
    ``torch._C._distributed_c10d._register_process_group(name, group)`` (ROCm/mori's
    examples register the world group as ``"default"``) or a group's own
    ``group_name``. Returns 0; raises InvalidArgumentError for an unknown name and
    InvalidStateError when torch.distributed is not initialized or the heap exists.
    """
    _shmem.init(group=_resolve_group(group_name))
    return 0


def _route_address() -> str:
    """This host's address as other hosts see it: MORI_BOOTSTRAP_HOST if set, else
    the source address of the route towards MASTER_ADDR (or any outside address),
    else loopback."""
    host = env.get("MORI_BOOTSTRAP_HOST")
    if host:
        return host
    target = env.get("MASTER_ADDR") or "192.0.2.1"  # TEST-NET-1: a route lookup only
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))  # UDP connect sends nothing; it picks the source address
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]


def shmem_get_unique_id() -> bytes:
    """A 128-byte id for :func:`shmem_init_attr`: the address (host and a free TCP
    port) where the process that becomes rank 0 will run mori's TCP bootstrap.

    Call it on the host of rank 0 and hand the bytes to every rank by any channel
    (a file, a key-value store, an MPI broadcast). The host is MORI_BOOTSTRAP_HOST
    when set, else this host's address on the route to MASTER_ADDR (or to the
    outside), else 127.0.0.1. The port was free when the id was made.
    """
    host = _route_address()
    encoded = host.encode()
    if len(encoded) > _UID_HOST_BYTES:
        raise InvalidArgumentError(
            f"bootstrap host {host!r} is {len(encoded)} bytes; a unique id holds {_UID_HOST_BYTES}"
        )
    port = _free_port(host)
    header = _UID_HEADER.pack(_UID_MAGIC, _UID_VERSION, port)
    return header + encoded.ljust(_UID_HOST_BYTES, b"\0")


def _decode_unique_id(unique_id: bytes) -> tuple[str, int]:
    data = bytes(unique_id)
    if len(data) != UNIQUE_ID_BYTES:
        raise InvalidArgumentError(
            f"unique_id is {len(data)} bytes, expected {UNIQUE_ID_BYTES} "
            "(use the bytes shmem_get_unique_id() returned)"
        )
    magic, version, port = _UID_HEADER.unpack_from(data)
    if magic != _UID_MAGIC or version != _UID_VERSION:
        raise InvalidArgumentError(
            f"unique_id does not come from mori's shmem_get_unique_id() "
            f"(header {data[: _UID_HEADER.size]!r})"
        )
    host = data[_UID_HEADER.size :].rstrip(b"\0").decode()
    return host, port


def shmem_init_attr(flags: int, rank: int, nranks: int, unique_id: bytes) -> int:
    """Collective over ``nranks`` processes: create the symmetric heap (current CUDA
    device when torch sees one, else host; size MORI_SHMEM_HEAP_SIZE), bootstrapped
    over mori's TCP rendezvous at the address ``unique_id`` carries (see
    :func:`shmem_get_unique_id`). No torch.distributed needed.

    Args:
        flags: MORI_SHMEM_INIT_WITH_UNIQUEID (MORI_SHMEM_INIT_WITH_MPI_COMM is not
            supported: mori has no MPI bootstrap).
        rank: this process's pe, in [0, nranks).
        nranks: number of pes.
        unique_id: the same 128 bytes on every rank.

    Returns 0. Rank 0 listens at the id's address; the others connect to it; every
    wait is bounded by MORI_BOOTSTRAP_TIMEOUT_S (default 120 s).
    """
    if flags != MORI_SHMEM_INIT_WITH_UNIQUEID:
        if flags == MORI_SHMEM_INIT_WITH_MPI_COMM:
            raise NotSupportedError(
                "shmem_init_attr: MORI_SHMEM_INIT_WITH_MPI_COMM is not supported (mori has no "
                "MPI bootstrap); use MORI_SHMEM_INIT_WITH_UNIQUEID or "
                "shmem_torch_process_group_init"
            )
        raise InvalidArgumentError(
            f"shmem_init_attr: unknown flags {flags} (MORI_SHMEM_INIT_WITH_UNIQUEID is "
            f"{MORI_SHMEM_INIT_WITH_UNIQUEID})"
        )
    host, port = _decode_unique_id(unique_id)
    timeout_s = env.get_int("MORI_BOOTSTRAP_TIMEOUT_S", 120, 1, 1 << 30)
    boot = _C.TcpBootstrap(int(rank), int(nranks), host, port, timeout_s)
    _shmem.init(bootstrap=boot, timeout_s=timeout_s)
    return 0


def shmem_mpi_init() -> int:
    """Not supported: mori has no MPI bootstrap. Use
    :func:`shmem_torch_process_group_init` or :func:`shmem_init_attr`."""
    raise NotSupportedError(
        "shmem_mpi_init: mori has no MPI bootstrap; use shmem_torch_process_group_init(name) "
        "or shmem_get_unique_id() + shmem_init_attr()"
    )


def shmem_finalize() -> int:
    """Collective: destroy the heap. Returns 0. Raises InvalidStateError on every pe
    while any pe holds allocations (free them, or drop the tensors, first)."""
    _shmem.finalize()
    return 0


def shmem_mype() -> int:
    """This process's pe, in [0, shmem_npes())."""
    return _shmem.my_pe()


def shmem_npes() -> int:
    """Number of pes."""
    return _shmem.n_pes()


def shmem_barrier_all() -> None:
    """Host barrier over all pes; orders heap accesses before and after it."""
    _shmem.barrier_all()


def shmem_barrier_on_stream(stream=None) -> None:
    """Enqueue a device barrier over all pes on ``stream``: None or 0 for the legacy
    default stream (ROCm/mori's default), a raw ``cudaStream_t`` int, or a
    torch.cuda.Stream. CUDA heaps only."""
    _shmem.barrier_on_stream(0 if stream is None else stream)


def shmem_malloc(size: int) -> int:
    """Collective: ``size`` bytes of symmetric memory, 256-byte aligned; returns the
    address as an int. Every pe passes the same sizes in the same order; a mismatch
    or an exhausted heap raises (InvalidArgumentError / OutOfMemoryError) on every pe."""
    return _shmem.malloc(size)


def shmem_malloc_align(alignment: int, size: int) -> int:
    """Collective: like :func:`shmem_malloc` with ``alignment`` (a power of two,
    bytes); note ROCm/mori's order, alignment first. Returns the address as an int."""
    return _shmem.malloc(size, alignment)


def shmem_free(ptr: int) -> None:
    """Release a block from :func:`shmem_malloc` (its int address)."""
    _shmem.free(ptr)


def shmem_ptr_p2p(dest_ptr: int, my_pe: int, dest_pe: int) -> int:
    """``dest_pe``'s address of this pe's symmetric address ``dest_ptr``, to load and
    store through; ``dest_ptr`` itself when ``dest_pe == my_pe``; 0 when ``dest_pe``
    is not load/store reachable (another node). ``my_pe`` must be
    :func:`shmem_mype`."""
    me = _shmem.my_pe()
    if my_pe != me:
        raise InvalidArgumentError(f"shmem_ptr_p2p: my_pe {my_pe} is not this process's pe {me}")
    if dest_pe == me:
        return int(dest_ptr)
    npes = _shmem.n_pes()
    if not 0 <= dest_pe < npes:
        raise InvalidArgumentError(f"shmem_ptr_p2p: dest_pe {dest_pe} out of range [0, {npes})")
    return _shmem.ptr(int(dest_ptr), dest_pe)


def shmem_num_qp_per_pe() -> int:
    """Not supported: mori's symmetric heap reaches peers by load/store (host shared
    memory, CUDA IPC), not through RDMA queue pairs; RDMA lives in mori.io."""
    raise NotSupportedError(
        "shmem_num_qp_per_pe: mori's shmem has no RDMA queue pairs (peers are reached by "
        "load/store); mori.io's RDMA backend takes qp_per_transfer in its config"
    )


__all__ = [
    "MORI_SHMEM_INIT_WITH_MPI_COMM",
    "MORI_SHMEM_INIT_WITH_UNIQUEID",
    "shmem_barrier_all",
    "shmem_barrier_on_stream",
    "shmem_finalize",
    "shmem_free",
    "shmem_get_unique_id",
    "shmem_init_attr",
    "shmem_malloc",
    "shmem_malloc_align",
    "shmem_mpi_init",
    "shmem_mype",
    "shmem_npes",
    "shmem_num_qp_per_pe",
    "shmem_ptr_p2p",
    "shmem_torch_process_group_init",
]
