# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The proxy over a host symmetric heap, for CPU producers (tests, benchmarks, the
CPU implementations of inter-node protocols).

A proxy thread per process drains command queues and moves bytes between the
symmetric heaps of pes with a transport chosen per pe: ``"mapped"`` (the pe's heap is
mapped here: same node), ``"cma"`` (another emulated node on this host:
process_vm_writev), ``"tcp"`` (anything else; one in-order stream per pair), or
``"verbs"`` when asked for (ibverbs RDMA, one RC queue pair per pair; never run on a
NIC).
Targets are byte offsets in the heaps (:func:`heap_offset`). Ordering: on one queue,
an add to pe is applied after every earlier write of that queue to pe has landed.
A lost peer fails the proxy: every later wait raises ``TransportError`` naming the pe
and its node. docs/design.md ("Proxy") has the design; kernels push with the C++
header ``mori/proxy/queue_device.cuh``.

    from mori.core import proxy, shmem
    shmem.init(device="cpu", heap_size="64M", bootstrap=boot)
    p = proxy.Proxy(boot)                  # collective, after shmem.init
    p.write(pe, dst_offset, src_offset, nbytes)
    p.atomic_add(pe, signal_offset, 1)     # applied after the write above
    p.quiet()
    p.close()                              # collective
"""

from __future__ import annotations

from typing import Any

from . import _C


def heap_offset(ptr: Any, nbytes: int = 1) -> int:
    """Byte offset of a symmetric address (an int or a tensor) in this pe's heap: the
    same offset names the same allocation on every pe. Raises InvalidArgumentError
    outside the heap."""
    if hasattr(ptr, "data_ptr"):
        ptr = ptr.data_ptr()
    return _C.proxy_heap_offset(int(ptr), nbytes)


class Proxy:
    """A proxy thread and its command queues; collective construction and close.
    Close it (or drop it) before ``shmem.finalize``: its threads use the heap.

    Args:
        bootstrap: the bootstrap ``shmem.init`` used (its ranks are the pes).
        num_queues: independent command queues (ordering holds within one).
        queue_capacity: slots per queue; 0 reads MORI_PROXY_QUEUE_CAPACITY (1024).
            A full queue makes pushes wait, bounded by ``timeout_s``.
        transport: ``"auto"`` (mapped / cma / tcp per pe), ``"tcp"`` (every pe of
            another node over TCP) or ``"verbs"`` (every pe of another node over
            ibverbs RDMA; every pe must choose it; it has not run on a NIC and fails
            on every pe, naming why, where a pe cannot open an RDMA port);
            ``"auto"`` reads MORI_PROXY_TRANSPORT.
        advertise_host: the address other hosts reach this process at; "" reads
            MORI_PROXY_HOST, else this host's name.
        timeout_s: bound on setup, every wait, and a peer's silence.
        producer: ``"host"`` (CPU threads push: the methods below) or ``"cuda"``
            (kernels push through ``mori/proxy/queue_device.cuh``; the host can only
            :meth:`wait_retired`; needs a CUDA build).
    """

    def __init__(
        self,
        bootstrap: Any,
        num_queues: int = 1,
        queue_capacity: int = 0,
        transport: str = "auto",
        advertise_host: str = "",
        timeout_s: float = 120.0,
        producer: str = "host",
    ) -> None:
        self._p = _C.Proxy(
            bootstrap, num_queues, queue_capacity, transport, advertise_host, timeout_s, producer
        )

    @property
    def my_pe(self) -> int:
        return self._p.my_pe

    @property
    def n_pes(self) -> int:
        return self._p.n_pes

    @property
    def num_queues(self) -> int:
        return self._p.num_queues

    def write(self, pe: int, dst_offset: int, src_offset: int, nbytes: int, queue: int = 0) -> int:
        """Copy ``nbytes`` of this pe's heap at ``src_offset`` to ``pe``'s heap at
        ``dst_offset``. Returns the command's index in the queue."""
        return self._p.push("write", pe, dst_offset, src_offset, nbytes, 0, 0, queue)

    def atomic_add(self, pe: int, signal_offset: int, value: int, queue: int = 0) -> int:
        """Atomically add ``value`` to the uint64 at ``signal_offset`` (8-aligned) in
        ``pe``'s heap, after every earlier write of this queue to ``pe`` landed."""
        return self._p.push("atomic_add", pe, 0, 0, 0, signal_offset, value, queue)

    def write_add(
        self,
        pe: int,
        dst_offset: int,
        src_offset: int,
        nbytes: int,
        signal_offset: int,
        value: int,
        queue: int = 0,
    ) -> int:
        """:meth:`write` then :meth:`atomic_add` to the same pe, as one command."""
        return self._p.push(
            "write_add", pe, dst_offset, src_offset, nbytes, signal_offset, value, queue
        )

    def quiet(self, queue: int = 0) -> None:
        """Return once every earlier command of ``queue`` completed at its target."""
        self._p.quiet(queue)

    def barrier(self, queue: int = 0) -> None:
        """Collective over every pe's proxy: on return, everything each pe pushed to
        this pe before its barrier (on that queue) has landed here."""
        self._p.barrier(queue)

    def wait_retired(self, upto: int, queue: int = 0) -> None:
        """Wait until the commands with index < ``upto`` have retired (either producer
        kind: a host thread may wait for what a kernel pushed)."""
        self._p.wait_retired(upto, queue)

    def check_health(self) -> None:
        """Raise the proxy's error (TransportError naming the lost pe) if it failed."""
        self._p.check_health()

    def path_to(self, pe: int) -> str:
        """``"mapped"``, ``"cma"``, ``"tcp"`` or ``"verbs"``: how commands to ``pe``
        travel."""
        return self._p.path_to(pe)

    def node_of(self, pe: int) -> str:
        """``pe``'s node key (hostname/boot_id, or ``env:<MORI_SHMEM_NODE_ID>``)."""
        return self._p.node_of(pe)

    def stats(self) -> dict:
        """commands (popped), bytes_to_pe (list), bytes_by_path (dict), lane_waits
        (CUDA heaps: how often the proxy's threads waited for their own CUDA streams,
        i.e. for staging copies and adds; 0 on host heaps)."""
        return self._p.stats()

    def close(self) -> None:
        """Collective: a final proxy barrier, then an orderly shutdown."""
        self._p.close()


__all__ = ["Proxy", "heap_offset"]
