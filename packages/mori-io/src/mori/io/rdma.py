# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""RDMA backend configuration and probing.

The backend uses ibverbs RC queue pairs: one-sided RDMA READ/WRITE between registered
regions, WRITE_WITH_IMM to tell the target a transfer landed, the NIC nearest the GPU
chosen from mori.core's topology. libibverbs is loaded with dlopen, so this module
imports everywhere; :func:`probe` says whether the backend can run here. It has not
yet run on a NIC (none on the machines it was built on).
"""

from __future__ import annotations

import dataclasses
import enum

import mori.core

from . import _C


class PollCqMode(enum.IntEnum):
    """How the poll threads wait for completions (MORI's names)."""

    POLLING = 0  #: busy-poll the CQ (lowest latency, one core per worker thread)
    EVENT = 1  #: sleep on the completion channel until the CQ has entries


_MTUS = (0, 256, 512, 1024, 2048, 4096)
_MTU_ENUM_MAX = 5  # IBV_MTU_4096: as an upper bound, "whatever both ports allow"


def _path_mtu_bytes(mtu_enum: int) -> int:
    """path_mtu in bytes for a native max_path_mtu (enum ibv_mtu); 0 for the maximum."""
    return 0 if mtu_enum == _MTU_ENUM_MAX else 128 << mtu_enum


# Field defaults come from the native config's default constructor (one copy of each).
_RDMA = _C.rdma.BackendConfig()


def _bad(field: str, value: object, why: str) -> mori.core.InvalidArgumentError:
    return mori.core.InvalidArgumentError(f"RdmaBackendConfig.{field}={value!r}: {why}")


def _or_default(value: int, default: int) -> int:
    """MORI's convention: a value <= 0 selects the default."""
    return value if value > 0 else default


@dataclasses.dataclass
class RdmaBackendConfig:
    """RDMA backend settings. The first thirteen fields are MORI's, in MORI's positional
    order and with its defaults; where MORI takes 0 or -1 for "the default", so does this.

    qp_per_transfer: RC QPs per remote engine; a transfer's work requests are spread
    over them (1..127). post_batch_size: work requests per ibv_post_send, <= 0 for
    min(32, max_send_wr). num_worker_threads: completion queues, each polled by its
    own thread (1..64; <= 0: one). poll_cq_mode: PollCqMode.POLLING or EVENT.
    enable_notification: end each QP's part of a transfer with RDMA WRITE_WITH_IMM so
    that the target learns it completed (pop_inbound_transfer_status). notif_per_qp:
    receives kept posted per QP for those notifications (the QP's max_recv_wr).
    enable_transfer_chunking / chunk_bytes: when on, no work request carries more than
    chunk_bytes. max_chunks_per_transfer (>= 1) is accepted and validated; mori's
    planner bounds work requests by max_send_wr instead. num_nics_per_transfer: 1 (one
    NIC per engine; a larger value is kept, and create_backend raises NotSupportedError).
    max_send_wr (send-queue depth per QP), max_cqe_num (entries per CQ), max_msg_sge
    (SGEs per work request): <= 0 keeps
    mori's default (max_send_wr 1024, cq_depth 4096, the device's SGE limit up to 16);
    a value > 0 sizes the QPs and CQs the backend creates.

    mori's extras: device_name: "" picks the ACTIVE port nearest to GPU gpu_index (PCI
    distance from the topology; -1: no locality, the first ACTIVE port by name);
    "mlx5_0" or "mlx5_0:1" names a device (and port). port: 0 any ACTIVE port.
    gid_index: -1 picks one (RoCE v2 with an IPv4-mapped address first; index 0 on
    InfiniBand).

    QP settings, in InfiniBand spec units: timeout (0..31; the local ACK timeout is
    4.096 us * 2**timeout, 14 ~ 67 ms), retry_cnt (0..7), rnr_retry (0..7, 7 retries
    without limit), min_rnr_timer (0..31), max_rd_atomic / max_dest_rd_atomic (RDMA
    READs in flight as initiator / responder, 1..255, capped by the device),
    path_mtu (bytes: 256..4096, or 0 for the smaller active MTU of both ports),
    service_level (0..15), traffic_class (0..255), hop_limit (1..255), force_grh
    (InfiniBand: address by GID too, for routed subnets).

    Queues: max_sge per work request (0: the device's, at most 16; max_msg_sge > 0
    overrides it), max_message_bytes per work request (0: the port's maximum, at most
    1 GiB), signal_interval (signal every Nth work request and each batch's last;
    1..max_send_wr), cq_depth (entries per CQ; max_cqe_num > 0 overrides it).

    Defaults not fixed by MORI are the native config's (``_C.rdma.BackendConfig()``).
    """

    qp_per_transfer: int = 1
    post_batch_size: int = -1
    num_worker_threads: int = -1
    poll_cq_mode: PollCqMode = PollCqMode.POLLING
    enable_notification: bool = True
    notif_per_qp: int = 1024
    enable_transfer_chunking: bool = False
    chunk_bytes: int = 65536
    max_chunks_per_transfer: int = 64
    num_nics_per_transfer: int = 1
    max_send_wr: int = 0
    max_cqe_num: int = 0
    max_msg_sge: int = 0
    device_name: str = _RDMA.device_name
    port: int = _RDMA.port
    gid_index: int = _RDMA.gid_index
    gpu_index: int = _RDMA.gpu_index
    timeout: int = _RDMA.qp.timeout
    retry_cnt: int = _RDMA.qp.retry_cnt
    rnr_retry: int = _RDMA.qp.rnr_retry
    min_rnr_timer: int = _RDMA.qp.min_rnr_timer
    max_rd_atomic: int = _RDMA.qp.max_rd_atomic
    max_dest_rd_atomic: int = _RDMA.qp.max_dest_rd_atomic
    path_mtu: int = _path_mtu_bytes(_RDMA.qp.max_path_mtu)
    service_level: int = _RDMA.qp.service_level
    traffic_class: int = _RDMA.qp.traffic_class
    hop_limit: int = _RDMA.qp.hop_limit
    force_grh: bool = _RDMA.qp.force_grh
    max_sge: int = _RDMA.max_sge
    max_message_bytes: int = _RDMA.max_message_bytes
    signal_interval: int = _RDMA.signal_interval
    cq_depth: int = _RDMA.cq_depth

    def effective(self) -> dict[str, int]:
        """The native queue settings these fields resolve to (MORI's <= 0 defaults
        applied): num_worker_threads, post_batch_size, max_send_wr, max_recv_wr,
        max_sge, cq_depth, max_message_bytes."""
        max_message_bytes = self.max_message_bytes
        if self.enable_transfer_chunking:
            max_message_bytes = self.chunk_bytes
        return {
            "num_worker_threads": _or_default(self.num_worker_threads, _RDMA.num_worker_threads),
            "post_batch_size": self.post_batch_size if self.post_batch_size > 0 else -1,
            "max_send_wr": _or_default(self.max_send_wr, _RDMA.max_send_wr),
            "max_recv_wr": self.notif_per_qp,
            "max_sge": _or_default(self.max_msg_sge, self.max_sge),
            "cq_depth": _or_default(self.max_cqe_num, self.cq_depth),
            "max_message_bytes": max_message_bytes,
        }

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise mori.core.InvalidArgumentError naming the first bad field and value."""
        ints = ("post_batch_size", "num_worker_threads", "max_send_wr", "max_cqe_num",
                "max_msg_sge", "notif_per_qp", "chunk_bytes", "max_chunks_per_transfer",
                "num_nics_per_transfer")  # fmt: skip
        for field in ints:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(field, value, "must be an int")
        for field, hi in (("num_worker_threads", 64), ("max_send_wr", 1 << 16),
                          ("max_cqe_num", 1 << 22), ("max_msg_sge", 256)):  # fmt: skip
            if getattr(self, field) > hi:
                raise _bad(field, getattr(self, field), f"above {hi} (<= 0: the default)")
        if not 1 <= self.notif_per_qp <= 1 << 16:
            raise _bad("notif_per_qp", self.notif_per_qp, "outside [1, 65536]")
        if not 1 <= self.chunk_bytes <= 1 << 31:
            raise _bad("chunk_bytes", self.chunk_bytes, f"outside [1, {1 << 31}]")
        if self.max_chunks_per_transfer < 1:
            raise _bad("max_chunks_per_transfer", self.max_chunks_per_transfer, "must be >= 1")
        if self.num_nics_per_transfer < 1:
            raise _bad("num_nics_per_transfer", self.num_nics_per_transfer, "must be >= 1")
        eff = self.effective()
        ranges = {
            "qp_per_transfer": (1, 127),
            "port": (0, 255),
            "gid_index": (-1, 255),
            "timeout": (0, 31),
            "retry_cnt": (0, 7),
            "rnr_retry": (0, 7),
            "min_rnr_timer": (0, 31),
            "max_rd_atomic": (1, 255),
            "max_dest_rd_atomic": (1, 255),
            "service_level": (0, 15),
            "traffic_class": (0, 255),
            "hop_limit": (1, 255),
            "max_sge": (0, 256),
            "max_message_bytes": (0, 1 << 31),
            "cq_depth": (1, 1 << 22),
        }
        for field, (lo, hi) in ranges.items():
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(field, value, "must be an int")
            if not lo <= value <= hi:
                raise _bad(field, value, f"outside [{lo}, {hi}]")
        if isinstance(self.gpu_index, bool) or not isinstance(self.gpu_index, int):
            raise _bad("gpu_index", self.gpu_index, "must be an int")
        if self.gpu_index < -1:
            raise _bad("gpu_index", self.gpu_index, "must be >= -1 (-1: no GPU locality)")
        if self.post_batch_size > eff["max_send_wr"]:
            raise _bad(
                "post_batch_size",
                self.post_batch_size,
                f"must be <= 0 (automatic) or in [1, max_send_wr={eff['max_send_wr']}]",
            )
        if not isinstance(self.signal_interval, int) or not (
            1 <= self.signal_interval <= eff["max_send_wr"]
        ):
            raise _bad(
                "signal_interval",
                self.signal_interval,
                f"outside [1, max_send_wr={eff['max_send_wr']}]",
            )
        if self.path_mtu not in _MTUS:
            raise _bad(
                "path_mtu", self.path_mtu, "must be 0 (automatic) or 256..4096, a power of 2"
            )
        try:
            self.poll_cq_mode = PollCqMode(self.poll_cq_mode)
        except ValueError:
            raise _bad(
                "poll_cq_mode", self.poll_cq_mode, "must be PollCqMode.POLLING or EVENT"
            ) from None
        if not isinstance(self.device_name, str):
            raise _bad("device_name", self.device_name, "must be a str")
        for flag in ("enable_notification", "force_grh", "enable_transfer_chunking"):
            if not isinstance(getattr(self, flag), bool):
                raise _bad(flag, getattr(self, flag), "must be a bool")

    def to_native(self):
        """The native config (``_C.rdma.BackendConfig``), validated again in C++."""
        self.validate()
        # Refused here, when a backend is built from it, not on construction: MORI's
        # config is plain data and connectors set this field before choosing a backend.
        if self.num_nics_per_transfer != 1:
            raise mori.core.NotSupportedError(
                f"RdmaBackendConfig.num_nics_per_transfer={self.num_nics_per_transfer}: "
                "mori's RDMA backend drives one NIC per engine"
            )
        c = _C.rdma.BackendConfig()
        for field in (
            "qp_per_transfer", "enable_notification", "device_name", "port", "gid_index",
            "gpu_index", "signal_interval",
        ):  # fmt: skip
            setattr(c, field, getattr(self, field))
        for field, value in self.effective().items():
            setattr(c, field, value)
        c.poll_cq_mode = _C.rdma.PollCqMode(int(self.poll_cq_mode))
        qp = c.qp
        qp.timeout, qp.retry_cnt, qp.rnr_retry = self.timeout, self.retry_cnt, self.rnr_retry
        qp.min_rnr_timer = self.min_rnr_timer
        qp.max_rd_atomic, qp.max_dest_rd_atomic = self.max_rd_atomic, self.max_dest_rd_atomic
        qp.max_path_mtu = (
            _C.rdma.mtu_enum_from_bytes(self.path_mtu) if self.path_mtu else _MTU_ENUM_MAX
        )
        qp.service_level, qp.traffic_class = self.service_level, self.traffic_class
        qp.hop_limit, qp.force_grh = self.hop_limit, self.force_grh
        c.qp = qp
        c.validate()
        return c


def probe() -> tuple[bool, str, list[str]]:
    """(available, reason, device names): whether the RDMA backend can run here."""
    return _C.rdma_probe()


__all__ = ["PollCqMode", "RdmaBackendConfig", "probe"]
