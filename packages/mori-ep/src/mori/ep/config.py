# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The shape of an expert-parallel op: MORI's :class:`EpDispatchCombineConfig`, its
kernel and quant enums, and the check, when an op is built, that every rank passes
the same config. Nothing here moves data; :mod:`mori.ep.op` builds the op from it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from mori.core import InvalidArgumentError, env, shmem

from ._C import EpDispatchCombineConfig as RawConfig
from ._C import ep_max_tokens_per_rank, heap_all_gather_i64


class EpDispatchCombineKernelType(enum.IntEnum):
    """Which kernel family runs the op: MORI's names and values. This release
    implements ``IntraNode`` (every rank on one node, over load/store-reachable
    symmetric memory; the CPU implementation of the same protocol on a host heap),
    the low-latency ``IntraNodeLL`` / ``AsyncLL`` (fixed receive slots, no count
    exchange; ``docs/low_latency.md``; their CUDA kernel has not run on a GPU yet) and
    the inter-node ``InterNode`` / ``InterNodeV1`` / ``InterNodeV1LL`` on host heaps
    (:mod:`mori.ep.internode`; no CUDA kernels yet: NotSupportedError on a CUDA heap)."""

    IntraNode = 0
    InterNode = 1
    InterNodeV1 = 2
    InterNodeV1LL = 3
    AsyncLL = 4
    IntraNodeLL = 5

    def __str__(self) -> str:
        return self.name


class EpDispatchCombineQuantType(enum.IntEnum):
    """How combine quantises what it sends (MORI's names and values). ``None_``,
    ``Fp8DirectCast`` and ``Fp8BlockwiseQuant`` are implemented (host heaps and CUDA);
    a config with ``Fp4BlockwiseQuant`` is made (as MORI's, whose inter-node tests build
    one), and its combine fails on every rank naming the quant types that exist."""

    None_ = 0
    Fp8DirectCast = 1
    Fp8BlockwiseQuant = 2
    Fp4BlockwiseQuant = 3

    def __str__(self) -> str:
        return self.name


_QUANT_NAMES = {
    "none": EpDispatchCombineQuantType.None_,
    "fp8_direct_cast": EpDispatchCombineQuantType.Fp8DirectCast,
    "fp8_blockwise": EpDispatchCombineQuantType.Fp8BlockwiseQuant,
    "fp4_blockwise": EpDispatchCombineQuantType.Fp4BlockwiseQuant,
}
# Scale blocks per row of the fp8_blockwise combine: MORI's MORI_FP8_COMBINE_SCALE_DIM
# and its default (7168 columns / 56 = blocks of 128).
_SCALE_DIM_ENV = "MORI_FP8_COMBINE_SCALE_DIM"
_DEFAULT_COMBINE_SCALE_DIM = 56


def _quant_type(value) -> EpDispatchCombineQuantType:
    """MORI's quant_type (a name such as ``"fp8_direct_cast"`` or the enum) as the enum."""
    if isinstance(value, EpDispatchCombineQuantType):
        q = value
    elif isinstance(value, str) and value.strip().lower() in _QUANT_NAMES:
        q = _QUANT_NAMES[value.strip().lower()]
    else:
        raise InvalidArgumentError(
            f"quant_type {value!r} is not one of {sorted(_QUANT_NAMES)} "
            "(or an EpDispatchCombineQuantType)"
        )
    return q


@dataclass
class EpDispatchCombineConfig:
    """Shape of an expert-parallel group; the fields, their order and defaults are
    MORI's (``data_type`` first and positional).

    Args:
        data_type: the dtype dispatch tokens usually have (MORI keeps it for
            compatibility; dispatch accepts any of bf16, fp8 e4m3, fp16, fp32 and
            packed fp4 ``float4_e2m1fn_x2`` whose size fits ``max_token_type_size``,
            whatever this says; for fp4, ``hidden_dim`` counts bytes, two values each,
            as in MORI).
        rank, world_size: this rank and the number of EP ranks (= shmem pes).
        hidden_dim: columns of a token row.
        scale_dim: scale columns per token (fp8: ``hidden_dim // 128``), 0 for none.
        scale_type_size: bytes per scale element (4 for fp32 scales).
        max_token_type_size: bytes per token element the buffers are sized for
            (2 for bf16; 1 for fp8-only dispatch, combine buffers still hold bf16).
        max_num_inp_token_per_rank: most tokens a rank passes to one dispatch (M).
        num_experts_per_rank: experts per rank; global expert ``e`` lives on rank
            ``e // num_experts_per_rank``.
        num_experts_per_token: top-k columns of ``indices`` and ``weights``.
        warp_num_per_block, block_num: default launch shape of the CUDA kernels
            (ignored by the CPU implementation).
        max_total_recv_tokens: 0, or a cap on the rows a rank can receive: the
            receive buffers hold ``world_size * min(ceil(cap / world_size), M)``
            rows (:attr:`max_num_tokens_to_recv`) instead of ``world_size * M``. A
            dispatch that would deliver more rows to some rank fails on every rank
            before any row moves (CPU: InvalidArgumentError on every rank; CUDA: the
            kernel traps on every rank naming the rank and the counts). On
            ``IntraNodeLL`` / ``AsyncLL`` the receive slots are per source rank: each
            rank may route at most ``P = max_num_tokens_to_recv_per_rank`` tokens to
            each rank, and a call in which one routes more fails on every rank, naming
            it, the destination and both counts (CPU: InvalidArgumentError, no row
            moved, the op usable; CUDA: every rank's kernel traps); the expert-major
            outputs keep their ``[E, W*M, hidden]`` shape (an expert gets at most
            ``W*P`` rows), the cap shrinks the symmetric receive area.
        use_external_inp_buf, rdma_block_num, num_qp_per_pe: MORI's fields, accepted
            for porting; the implementations read their combine input wherever it lies
            and take no RDMA launch shape, so they need none of them.
        gpu_per_node: ranks per node of the inter-node kernel types (a positive int;
            a node is ``min(gpu_per_node, ranks on the host)`` consecutive ranks, see
            :mod:`mori.ep.internode`); unused by the intra-node ones.
        kernel_type: an :class:`EpDispatchCombineKernelType`: ``IntraNode``, or
            ``IntraNodeLL`` / ``AsyncLL`` (the low-latency protocol, the expert-major
            methods and DeepEP's low_latency_*; see :mod:`mori.ep.low_latency`), or
            ``InterNode`` / ``InterNodeV1`` / ``InterNodeV1LL`` (host heaps;
            :mod:`mori.ep.internode`).
        quant_type: ``"none"``, ``"fp8_direct_cast"`` (bf16 combine input rounded
            to fp8 e4m3 before it is reduced, fp32 accumulation, bf16 output) or
            ``"fp8_blockwise"`` (MORI's: each bf16 row sent as fp8 e4m3 in
            :attr:`combine_scale_dim` blocks of ``ceil(hidden_dim / combine_scale_dim)``
            columns with one fp32 scale each, dequantized and summed in fp32, bf16
            output; README "Semantics"); ``"fp4_blockwise"`` makes a config whose
            combine is refused on every rank (InvalidArgumentError naming the quant
            types that exist; dispatch works as under ``"none"``).
        device: ``"cpu"``, ``"cuda"`` or None (follow the shmem heap: a host heap
            selects the CPU implementation). Keyword-only, mori's addition.
    """

    data_type: torch.dtype
    rank: int
    world_size: int
    hidden_dim: int
    scale_dim: int
    scale_type_size: int
    max_token_type_size: int
    max_num_inp_token_per_rank: int
    num_experts_per_rank: int
    num_experts_per_token: int
    warp_num_per_block: int = 8
    block_num: int = 80
    max_total_recv_tokens: int = 0
    use_external_inp_buf: bool = True
    kernel_type: EpDispatchCombineKernelType = EpDispatchCombineKernelType.IntraNode
    gpu_per_node: int = 8
    rdma_block_num: int = 0
    num_qp_per_pe: int = 1
    quant_type: str | EpDispatchCombineQuantType = "none"
    device: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        def positive(name):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{name} {v!r} must be a positive int")

        if not isinstance(self.data_type, torch.dtype):
            raise InvalidArgumentError(
                f"data_type {self.data_type!r} must be a torch.dtype (MORI's first field)"
            )
        for name in (
            "world_size",
            "hidden_dim",
            "max_num_inp_token_per_rank",
            "num_experts_per_rank",
            "num_experts_per_token",
            "warp_num_per_block",
            "block_num",
            "gpu_per_node",
        ):
            positive(name)
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(
                f"rank {self.rank!r} out of range [0, world_size {self.world_size})"
            )
        if not isinstance(self.scale_dim, int) or self.scale_dim < 0:
            raise InvalidArgumentError(f"scale_dim {self.scale_dim!r} must be an int >= 0")
        if self.scale_dim > 0 and self.scale_type_size not in (1, 2, 4):
            raise InvalidArgumentError(
                f"scale_type_size {self.scale_type_size!r} must be 1, 2 or 4 when scale_dim > 0"
            )
        if self.max_token_type_size not in (1, 2, 4):
            raise InvalidArgumentError(
                f"max_token_type_size {self.max_token_type_size!r} must be 1, 2 or 4"
            )
        if self.max_num_inp_token_per_rank > ep_max_tokens_per_rank:
            raise InvalidArgumentError(
                f"max_num_inp_token_per_rank {self.max_num_inp_token_per_rank} exceeds "
                f"{ep_max_tokens_per_rank}"
            )
        if self.world_size * self.max_num_inp_token_per_rank >= 2**31:
            raise InvalidArgumentError(
                f"world_size * max_num_inp_token_per_rank = "
                f"{self.world_size * self.max_num_inp_token_per_rank} must be < 2**31"
            )
        if self.num_experts_per_token > self.num_experts:
            raise InvalidArgumentError(
                f"num_experts_per_token {self.num_experts_per_token} exceeds the "
                f"{self.num_experts} experts"
            )
        if not isinstance(self.max_total_recv_tokens, int) or self.max_total_recv_tokens < 0:
            raise InvalidArgumentError(
                f"max_total_recv_tokens {self.max_total_recv_tokens!r} must be an int >= 0 "
                "(0: no cap)"
            )
        try:
            self.kernel_type = EpDispatchCombineKernelType(self.kernel_type)
        except ValueError:
            raise InvalidArgumentError(
                f"kernel_type {self.kernel_type!r} is not one of "
                f"{[k.name for k in EpDispatchCombineKernelType]}"
            ) from None
        _quant_type(self.quant_type)
        # Read once, when the config is made (MORI reads it when its op is built).
        self._combine_scale_dim = (
            env.get_int(_SCALE_DIM_ENV, _DEFAULT_COMBINE_SCALE_DIM, 1, 1 << 20)
            if self.quant == EpDispatchCombineQuantType.Fp8BlockwiseQuant
            else 0
        )
        if self.device not in (None, "cpu", "cuda"):
            raise InvalidArgumentError(f"device {self.device!r} must be 'cpu', 'cuda' or None")

    @property
    def num_experts(self) -> int:
        return self.num_experts_per_rank * self.world_size

    @property
    def quant(self) -> EpDispatchCombineQuantType:
        """``quant_type`` as an :class:`EpDispatchCombineQuantType`."""
        return _quant_type(self.quant_type)

    @property
    def combine_scale_dim(self) -> int:
        """fp8_blockwise's scale blocks per combine row (``MORI_FP8_COMBINE_SCALE_DIM``,
        default 56, read when the config is made); 0 for the other quant types."""
        return self._combine_scale_dim

    @property
    def max_num_tokens_to_send_per_rank(self) -> int:
        return self.max_num_inp_token_per_rank

    @property
    def max_num_tokens_to_send(self) -> int:
        return self.world_size * self.max_num_inp_token_per_rank

    @property
    def max_num_tokens_to_recv_per_rank(self) -> int:
        """Receive rows per source rank: ``min(ceil(max_total_recv_tokens /
        world_size), max_num_inp_token_per_rank)``, or M without a cap (MORI's rule)."""
        m = self.max_num_inp_token_per_rank
        if self.max_total_recv_tokens > 0:
            return min(-(-self.max_total_recv_tokens // self.world_size), m)
        return m

    @property
    def max_num_tokens_to_recv(self) -> int:
        """Receive capacity per rank (rows of dispatch's outputs)."""
        return self.world_size * self.max_num_tokens_to_recv_per_rank

    @property
    def max_num_out_tokens(self) -> int:
        """Receive capacity per rank; the same as :attr:`max_num_tokens_to_recv`."""
        return self.max_num_tokens_to_recv

    def to_cpp_config(self):
        """This config as ROCm/mori's raw bound config, ``mori.cpp.EpDispatchCombineConfig``
        (``mori.ep._C.EpDispatchCombineConfig``): every field but ``data_type`` and
        ``device``, ``quant_type`` as its enum (MORI's op builds the same struct from its
        dataclass)."""
        return RawConfig(
            rank=self.rank,
            world_size=self.world_size,
            hidden_dim=self.hidden_dim,
            scale_dim=self.scale_dim,
            scale_type_size=self.scale_type_size,
            max_token_type_size=self.max_token_type_size,
            max_num_inp_token_per_rank=self.max_num_inp_token_per_rank,
            num_experts_per_rank=self.num_experts_per_rank,
            num_experts_per_token=self.num_experts_per_token,
            max_total_recv_tokens=self.max_total_recv_tokens,
            warp_num_per_block=self.warp_num_per_block,
            block_num=self.block_num,
            use_external_inp_buf=bool(self.use_external_inp_buf),
            kernel_type=int(self.kernel_type),
            gpu_per_node=self.gpu_per_node,
            rdma_block_num=self.rdma_block_num,
            num_qp_per_pe=self.num_qp_per_pe,
            quant_type=int(self.quant),
        )


# Config fields every rank must agree on (rank aside, the launch defaults are per rank).
_SHARED_FIELDS = (
    "world_size",
    "hidden_dim",
    "scale_dim",
    "scale_type_size",
    "max_token_type_size",
    "max_num_inp_token_per_rank",
    "num_experts_per_rank",
    "num_experts_per_token",
    "max_total_recv_tokens",
    "kernel_type",
    "quant",
    "combine_scale_dim",
)


def same_config_everywhere(c: EpDispatchCombineConfig) -> torch.Tensor:
    """Collective, when an op is built: every rank puts its :data:`_SHARED_FIELDS` into
    every rank's row of a small symmetric table, then a heap barrier; every rank reads
    the same table, so a difference raises InvalidArgumentError on every rank, naming
    the field, the values and the ranks (before the op's block is allocated, whose
    size may differ with the configs). Returns the table (kept with the op: symmetric
    allocations are freed in the same order on every rank)."""
    mine = torch.tensor([int(getattr(c, f)) for f in _SHARED_FIELDS], dtype=torch.int64)
    table = shmem.empty((c.world_size, len(_SHARED_FIELDS)), torch.int64)
    if len(shmem.info()["local_pes"]) < c.world_size:
        # Some pes are on other hosts (inter-node kernel types): the heap's bootstrap.
        table.copy_(torch.tensor(heap_all_gather_i64(mine.tolist()), dtype=torch.int64))
        shmem.barrier_all()
    else:
        row = mine.to(table.device)
        for pe in range(c.world_size):
            shmem.put(table[c.rank], row, pe)
        shmem.barrier_all()
    rows = table.cpu()
    for j, name in enumerate(_SHARED_FIELDS):
        for r in range(1, c.world_size):
            if rows[r, j] != rows[0, j]:
                show = {"kernel_type": EpDispatchCombineKernelType,
                        "quant": EpDispatchCombineQuantType}.get(name, int)  # fmt: skip
                raise InvalidArgumentError(
                    f"EpDispatchCombineConfig differs between ranks: {name} is "
                    f"{show(int(rows[0, j]))} on rank 0 and {show(int(rows[r, j]))} on rank "
                    f"{r}; every rank must build the op with the same config (its own rank)"
                )
    return table


__all__ = ["EpDispatchCombineConfig", "EpDispatchCombineKernelType", "EpDispatchCombineQuantType"]
