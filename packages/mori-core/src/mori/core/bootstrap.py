# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Collective exchange of byte blobs among processes (handles, addresses, sizes).

Two implementations share one protocol — ``rank``, ``world_size``,
``all_gather(bytes) -> list[bytes]``, ``broadcast(bytes | None, root) -> bytes``,
``barrier()`` — and both can be handed to native code, which drives them through
``mori::bootstrap::Bootstrap``:

* :class:`TorchBootstrap` over a torch.distributed ProcessGroup, moving uint8
  tensors with ``all_gather_single``/``broadcast`` (never pickled objects);
* :class:`TcpBootstrap`, native TCP through rank 0, for processes without torch
  (``TcpBootstrap.from_env()`` reads torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Any

from . import _C
from .dist_compat import all_gather_single
from .errors import InvalidStateError

TcpBootstrap = _C.TcpBootstrap

# TorchBootstrap's frame, the fields of TcpBootstrap's (tcp_bootstrap.cpp): magic,
# collective, sequence number, payload bytes, root, sender. Every collective first
# all-gathers one frame per rank, so ranks in different collectives (or sizes) all
# raise instead of handing each other's payloads to torch with mismatched sizes.
_FRAME = struct.Struct("<IIQQii")
_FRAME_MAGIC = 0x4D4F5246  # "MORF"
_ALL_GATHER, _BROADCAST, _BARRIER = 1, 2, 3
_OP_NAMES = {_ALL_GATHER: "AllGather", _BROADCAST: "Broadcast", _BARRIER: "Barrier"}


def _tensor_bytes(t) -> bytes:
    """The bytes of a contiguous tensor, copied to host (no numpy needed)."""
    t = t.contiguous().cpu()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


class TorchBootstrap:
    """Bootstrap over a torch.distributed ProcessGroup (the default group if None).

    Blobs travel as uint8 tensors on the group's device: CPU for gloo, the current
    CUDA device for nccl. The group's own timeout bounds every call.
    """

    def __init__(self, group: Any = None) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "TorchBootstrap needs torch.distributed.init_process_group() to have run"
            )
        self._torch = torch
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        if "nccl" in backend:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self._seq = 0

    def _tensor(self, data: bytes):
        t = self._torch.frombuffer(bytearray(data), dtype=self._torch.uint8)
        return t.to(self.device)

    def _gather(self, data: bytes) -> bytes:
        out = self._torch.empty(
            len(data) * self.world_size, dtype=self._torch.uint8, device=self.device
        )
        all_gather_single(out, self._tensor(data), group=self.group)
        return _tensor_bytes(out)

    def _agree(self, op: int, nbytes: int, root: int) -> None:
        """Exchange frames; raise InvalidStateError on every rank unless all ranks
        are in the same collective with the same size and root."""
        seq = self._seq
        self._seq += 1
        frames = self._gather(_FRAME.pack(_FRAME_MAGIC, op, seq, nbytes, root, self.rank))
        want = (op, seq, nbytes, root)
        for r in range(self.world_size):
            magic, *got, _ = _FRAME.unpack_from(frames, r * _FRAME.size)
            if magic != _FRAME_MAGIC:
                raise InvalidStateError(f"bootstrap: corrupt frame from rank {r}")
            if tuple(got) != want:
                raise InvalidStateError(
                    f"bootstrap: collective mismatch: rank {self.rank} is in {_OP_NAMES[op]} "
                    f"#{seq} ({nbytes} bytes, root {root}) but rank {r} is in "
                    f"{_OP_NAMES.get(got[0], 'unknown')} #{got[1]} ({got[2]} bytes, root {got[3]})"
                )

    def all_gather_fixed(self, data: bytes) -> bytes:
        """All-gather equal-size blobs; returns their concatenation in rank order.
        Raises InvalidStateError on every rank when the ranks' calls differ."""
        n = len(data)
        self._agree(_ALL_GATHER, n, 0)
        return self._gather(data) if n else b""

    def broadcast_fixed(self, data: bytes, root: int = 0) -> bytes:
        """Broadcast a blob whose size every rank knows from group rank ``root``."""
        if not 0 <= root < self.world_size:
            raise ValueError(f"broadcast root {root} out of range [0, {self.world_size})")
        self._agree(_BROADCAST, len(data), root)
        if len(data) == 0:
            return b""
        t = self._tensor(data)
        src = root if self.group is None else self._dist.get_global_rank(self.group, root)
        self._dist.broadcast(t, src=src, group=self.group)
        return _tensor_bytes(t)

    def barrier(self) -> None:
        """Return once every rank of the group has entered the barrier."""
        self._agree(_BARRIER, 0, 0)

    def all_gather(self, data: bytes) -> list[bytes]:
        """Gather one blob (any size) from every rank; element r is rank r's blob."""
        return _C.bootstrap_all_gather(self, bytes(data))

    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        """Return root's blob on every rank (non-root ranks may pass None)."""
        return _C.bootstrap_broadcast(self, None if data is None else bytes(data), root)


def from_torchrun_env() -> TcpBootstrap:
    """Native TCP bootstrap from torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.

    The port used is MORI_BOOTSTRAP_PORT if set, else MASTER_PORT + 1 (torch's
    TCPStore holds MASTER_PORT itself). MORI_BOOTSTRAP_TIMEOUT_S bounds each wait.
    """
    return TcpBootstrap.from_env()


def default_bootstrap(group: Any = None):
    """TorchBootstrap when torch.distributed is initialized, else from torchrun's env."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return TorchBootstrap(group)
    except ImportError:
        pass
    if group is not None:
        raise RuntimeError("a ProcessGroup was given but torch.distributed is not initialized")
    if "RANK" not in os.environ:
        raise RuntimeError(
            "no bootstrap: torch.distributed is not initialized and RANK/WORLD_SIZE/"
            "MASTER_ADDR/MASTER_PORT are not set (launch with torchrun, or build a "
            "TcpBootstrap explicitly)"
        )
    return from_torchrun_env()


__all__ = ["TcpBootstrap", "TorchBootstrap", "default_bootstrap", "from_torchrun_env"]
