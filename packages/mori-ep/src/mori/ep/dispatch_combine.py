# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MoE dispatch/combine with MORI's API (``mori.ops`` there, ``mori.ep`` here).

The protocol (symmetric receive buffers sized to capacity, a count exchange that
reserves rows, per-call epochs in the signal words) is described in the package
README and in ``csrc/protocol.hpp``; this module checks inputs and owns the
symmetric block.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from mori.core import (
    InvalidArgumentError,
    InvalidStateError,
    MoriTimeoutError,
    NotSupportedError,
    shmem,
)

from . import _C
from . import routing as _routing
from .low_latency import _ROW_TAGS, LowLatencyMixin

_TOKEN_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
# Combine's element types and the native code for each (both implementations).
_COMBINE_DTYPE_CODES = {torch.bfloat16: 0, torch.float32: 1, torch.float8_e4m3fn: 2}


class EpDispatchCombineKernelType(enum.IntEnum):
    """Which kernel family runs the op: MORI's names and values. This release
    implements ``IntraNode`` (every rank on one node, over load/store-reachable
    symmetric memory; the CPU implementation of the same protocol on a host heap) and
    the low-latency ``IntraNodeLL`` / ``AsyncLL`` (fixed receive slots, no count
    exchange; ``docs/low_latency.md``; their CUDA kernel has not run on a GPU yet);
    the op raises NotSupportedError for the others."""

    IntraNode = 0
    InterNode = 1
    InterNodeV1 = 2
    InterNodeV1LL = 3
    AsyncLL = 4
    IntraNodeLL = 5

    def __str__(self) -> str:
        return self.name


class EpDispatchCombineQuantType(enum.IntEnum):
    """How combine quantises what it sends (MORI's names and values). ``None_`` and
    ``Fp8DirectCast`` are implemented; the blockwise types raise NotSupportedError."""

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
_IMPLEMENTED_QUANT = (EpDispatchCombineQuantType.None_, EpDispatchCombineQuantType.Fp8DirectCast)
_IMPLEMENTED_KERNELS = (
    EpDispatchCombineKernelType.IntraNode,
    EpDispatchCombineKernelType.IntraNodeLL,
    EpDispatchCombineKernelType.AsyncLL,
)
_LOW_LATENCY_KERNELS = (
    EpDispatchCombineKernelType.IntraNodeLL,
    EpDispatchCombineKernelType.AsyncLL,
)


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
    if q not in _IMPLEMENTED_QUANT:
        names = [k for k, v in _QUANT_NAMES.items() if v in _IMPLEMENTED_QUANT]
        raise NotSupportedError(f"quant_type {q.name} is not implemented (implemented: {names})")
    return q


@dataclass
class EpDispatchCombineConfig:
    """Shape of an expert-parallel group; the fields, their order and defaults are
    MORI's (``data_type`` first and positional).

    Args:
        data_type: the dtype dispatch tokens usually have (MORI keeps it for
            compatibility; dispatch accepts any of bf16, fp8 e4m3, fp16, fp32 whose
            size fits ``max_token_type_size``, whatever this says).
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
        use_external_inp_buf, gpu_per_node, rdma_block_num, num_qp_per_pe: MORI's
            fields, accepted for porting; the intra-node implementation reads its
            combine input wherever it lies, so it needs none of them.
        kernel_type: an :class:`EpDispatchCombineKernelType`: ``IntraNode``, or
            ``IntraNodeLL`` / ``AsyncLL`` (the low-latency protocol, the expert-major
            methods and DeepEP's low_latency_*; see :mod:`mori.ep.low_latency`).
        quant_type: ``"none"`` or ``"fp8_direct_cast"`` (bf16 combine input rounded
            to fp8 e4m3 before it is reduced, fp32 accumulation, bf16 output); the
            blockwise types raise NotSupportedError.
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
        if self.max_num_inp_token_per_rank > _C.ep_max_tokens_per_rank:
            raise InvalidArgumentError(
                f"max_num_inp_token_per_rank {self.max_num_inp_token_per_rank} exceeds "
                f"{_C.ep_max_tokens_per_rank}"
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
        return _C.EpDispatchCombineConfig(
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


def _check_launch(block_num, rdma_block_num, warp_per_block) -> str | None:
    for name, v in (
        ("block_num", block_num),
        ("rdma_block_num", rdma_block_num),
        ("warp_per_block", warp_per_block),
    ):
        if not isinstance(v, int) or isinstance(v, bool):
            return f"{name} {v!r} must be an int (<= 0: the config's default)"
    return None


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
)


def _same_config_everywhere(c: EpDispatchCombineConfig) -> torch.Tensor:
    """Collective, when an op is built: every rank puts its :data:`_SHARED_FIELDS` into
    every rank's row of a small symmetric table, then a heap barrier; every rank reads
    the same table, so a difference raises InvalidArgumentError on every rank, naming
    the field, the values and the ranks (before the op's block is allocated, whose
    size may differ with the configs). Returns the table (kept with the op: symmetric
    allocations are freed in the same order on every rank)."""
    mine = torch.tensor([int(getattr(c, f)) for f in _SHARED_FIELDS], dtype=torch.int64)
    table = shmem.empty((c.world_size, len(_SHARED_FIELDS)), torch.int64)
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


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


class EpDispatchCombineOp(LowLatencyMixin):
    """Dispatch tokens to the ranks of their experts and combine the results back.

    Collective: every rank of the shmem heap creates the op with the same config
    (its own ``rank``), in the same order as other symmetric allocations; the ranks
    compare their configs first (a difference raises InvalidArgumentError on every
    rank, naming the field and both values). It allocates one symmetric block (receive buffers sized to capacity, see
    :attr:`EpDispatchCombineConfig.max_num_out_tokens`) and runs a heap barrier.
    ``mori.core.shmem.init`` must have been called; a host heap (``device="cpu"``)
    selects the CPU implementation.

    Every call is collective as well (all ranks call ``dispatch``, then all call
    ``combine``); repeated calls need no reset: each carries an epoch in its signal
    words. A rank may pass zero tokens. Outputs are views of the op's buffers: a
    dispatch's outputs stay valid until this rank's next dispatch, a combine's
    until its next combine.

    Errors: the checks listed in :meth:`dispatch` and :meth:`combine` run on the
    host before any byte moves. A rank whose inputs fail them still takes part in
    the call's signal exchange, marking itself as rejecting, so every rank raises
    InvalidArgumentError in the same call and the op stays usable. A peer that never
    arrives makes the others raise MoriTimeoutError after ``timeout_s``; the op is
    then unusable (later calls raise InvalidStateError: create a new one). An input
    that passes the checks but that torch then refuses to prepare (a sparse tensor)
    or even to inspect (a sparse CSR tensor has no strides) fails the call on every
    rank like a failed check.

    On a CUDA heap the calls enqueue kernels on torch's current stream and never
    synchronise with the host (``total_recv`` stays on the device; dispatch and
    combine can be captured in a CUDA graph, each replay advancing the epoch kept in
    device memory). Failures that only the device can see are traps that print what
    was wrong: an expert id outside ``[-1, num_experts)`` (naming token, slot and
    value), a dispatch that would deliver more rows to some rank than
    ``max_total_recv_tokens`` allows (naming the rank and both counts; every rank
    traps; on the low-latency types, more tokens from one rank to another than the
    receive slots per source rank), combine input shorter than ``total_recv``, a peer that does not arrive
    within ``timeout_s``. A rejected call (host-side check on one rank) raises
    InvalidArgumentError on that rank and makes the kernels of the others trap naming
    it, min(timeout_s / 2, 1 s) later: on CUDA a rejection ends the job, it does not
    leave the op usable.
    """

    def __init__(self, config: EpDispatchCombineConfig, group: Any = None, *, timeout_s=60.0):
        if not isinstance(config, EpDispatchCombineConfig):
            raise InvalidArgumentError(
                f"config must be an EpDispatchCombineConfig, got {type(config).__name__}"
            )
        if config.kernel_type not in _IMPLEMENTED_KERNELS:
            raise NotSupportedError(
                f"kernel_type {config.kernel_type.name} is not implemented (implemented: "
                f"{[k.name for k in _IMPLEMENTED_KERNELS]})"
            )
        if not shmem.initialized():
            raise InvalidStateError(
                "EpDispatchCombineOp needs mori.core.shmem.init() first (device='cpu' for the "
                "CPU implementation)"
            )
        if group is not None:
            import torch.distributed as dist

            g_rank, g_size = dist.get_rank(group), dist.get_world_size(group)
            if (g_rank, g_size) != (config.rank, config.world_size):
                raise InvalidArgumentError(
                    f"config has rank {config.rank} of {config.world_size}, the group has rank "
                    f"{g_rank} of {g_size}"
                )
        if (shmem.my_pe(), shmem.n_pes()) != (config.rank, config.world_size):
            raise InvalidArgumentError(
                f"config has rank {config.rank} of {config.world_size}, the shmem heap has pe "
                f"{shmem.my_pe()} of {shmem.n_pes()}"
            )
        info = shmem.info()
        kind = info["kind"]
        device = config.device or ("cpu" if kind == "host" else "cuda")
        if (device == "cuda") != (kind == "cuda"):
            raise NotSupportedError(
                f"device {device!r} on a {kind} heap: the op runs where the heap is "
                "(shmem.init(device='cpu') for the CPU implementation, a CUDA device for the "
                "kernels)"
            )
        if kind == "cuda" and not getattr(_C, "with_cuda", False):
            raise NotSupportedError(
                "mori.ep was built without CUDA (MORI_CUDA=off): the dispatch/combine kernels "
                "are missing; rebuild with MORI_CUDA=on or use a host heap"
            )
        self.config = config
        self.device = (
            torch.device("cuda", info["device"]) if kind == "cuda" else torch.device("cpu")
        )
        self._quant = config.quant
        self.timeout_s = float(timeout_s)
        self._timed_out: str | None = None
        self._routing_owner = object()  # what routing handles of this op carry
        c = config
        shape = (
            c.world_size,
            c.rank,
            c.max_num_inp_token_per_rank,
            c.num_experts_per_token,
            c.hidden_dim,
            c.max_token_type_size,
            c.scale_dim * c.scale_type_size,
            c.num_experts_per_rank,
        )
        cap, k = c.max_num_tokens_to_recv, c.num_experts_per_token
        self._cuda = kind == "cuda"
        self._ll = c.kernel_type in _LOW_LATENCY_KERNELS
        self._config_table = _same_config_everywhere(c)
        if self._ll:
            self._init_low_latency(shape)
            return
        self._layout = _C.ep_buffer_layout(*shape, recv_capacity=cap)
        self._block = shmem.empty((self._layout["total_bytes"],), torch.uint8)
        self._cuda = kind == "cuda"
        if self._cuda:
            self._impl = _C.IntraNodeCuda(
                *shape,
                self._block.data_ptr(),
                self.device.index,
                self.timeout_s,
                recv_capacity=cap,
            )
        else:
            self._impl = _C.IntraNodeCpu(
                *shape, self._block.data_ptr(), self.timeout_s, recv_capacity=cap
            )
        self._recv_tokens = self._region("recv_tokens", cap * c.hidden_dim * c.max_token_type_size)
        self._recv_tokens = self._recv_tokens.view(cap, c.hidden_dim * c.max_token_type_size)
        self._recv_weights = self._region("recv_weights", cap * k * 4).view(torch.float32)
        self._recv_weights = self._recv_weights.view(cap, k)
        self._recv_scales = self._region("recv_scales", cap * c.scale_dim * c.scale_type_size)
        self._recv_scales = self._recv_scales.view(cap, c.scale_dim * c.scale_type_size)
        self._recv_indices = self._region("recv_indices", cap * k * 4).view(torch.int32)
        self._recv_indices = self._recv_indices.view(cap, k)
        self._recv_src_pos = self._region("recv_src_pos", cap * 4).view(torch.int32)
        self._total_recv = self._region("total_recv", 4).view(torch.int32)
        self._combine_out: dict[torch.dtype, torch.Tensor] = {}
        self._combine_out_weights = torch.empty(
            (c.max_num_inp_token_per_rank, k), dtype=torch.float32, device=self.device
        )
        # dispatch(weights=None) sends zeros (MORI leaves the weights unwritten).
        self._zero_weights = torch.zeros(
            (c.max_num_inp_token_per_rank, k), dtype=torch.float32, device=self.device
        )
        self._registered_inputs: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self.local_expert_count = torch.zeros(
            c.num_experts_per_rank, dtype=torch.int32, device=self.device
        )
        """int32 ``[num_experts_per_rank]``: after a dispatch with
        ``call_local_expert_count=True``, how many (received token, slot) pairs name
        each of this rank's experts (MORI's attribute; updated in place)."""

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def _launch(self, block_num: int, warp_per_block: int) -> tuple[int, int]:
        c = self.config
        return (
            c.block_num if block_num <= 0 else block_num,
            c.warp_num_per_block if warp_per_block <= 0 else warp_per_block,
        )

    def _reject_dispatch(self, impl, problem: str):
        if self._cuda:
            impl.reject_dispatch(problem, self._stream())
        else:
            impl.reject_dispatch(problem)

    def _reject_combine(self, impl, problem: str, routing: list[int] | None = None):
        if self._cuda:
            impl.reject_combine(problem, self._stream(), routing)
        else:
            impl.reject_combine(problem, routing)

    def _region(self, name: str, nbytes: int) -> torch.Tensor:
        off = self._layout[name]
        return self._block[off : off + nbytes]

    def _impl_or_raise(self):
        if self._impl is None:
            raise InvalidStateError("this EpDispatchCombineOp was closed")
        if self._timed_out is not None:
            raise InvalidStateError(
                f"this EpDispatchCombineOp timed out earlier ({self._timed_out}); its ranks "
                "no longer agree on the call they are in: create a new op"
            )
        return self._impl

    @contextlib.contextmanager
    def _fails_on_timeout(self):
        """A timed-out call leaves the ranks at different epochs: later calls would
        pair with stale ones, so the op refuses them (InvalidStateError)."""
        try:
            yield
        except MoriTimeoutError as e:
            self._timed_out = str(e).splitlines()[0]
            raise

    # ------------------------------------------------------------------ dispatch
    def _tokens_problem(self, x, name, dtypes, dtype_problem):
        """What every dispatch checks of its token rows ``x`` (the argument ``name``): a
        tensor on the op's device whose dtype is in ``dtypes`` (else ``dtype_problem``,
        formatted with ``dtype``) and fits max_token_type_size, shaped [num_tokens,
        hidden_dim] with at most max_num_inp_token_per_rank rows. The first problem, or
        None."""
        c = self.config
        if not isinstance(x, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {_describe(x)}"
        if x.device != self.device:
            return f"{name} is on {x.device}, the op runs on {self.device}"
        if x.dtype not in dtypes:
            return dtype_problem.format(dtype=x.dtype)
        if x.element_size() > c.max_token_type_size:
            return (
                f"{name} dtype {x.dtype} has {x.element_size()}-byte elements, more than "
                f"max_token_type_size {c.max_token_type_size}"
            )
        if x.dim() != 2 or x.size(1) != c.hidden_dim:
            return f"{name} must be [num_tokens, {c.hidden_dim}], got shape {tuple(x.shape)}"
        if x.size(0) > c.max_num_inp_token_per_rank:
            return (
                f"num_tokens {x.size(0)} exceeds max_num_inp_token_per_rank "
                f"{c.max_num_inp_token_per_rank}"
            )
        return None

    def _check_dispatch(self, *args) -> str | None:
        """:meth:`_dispatch_problem`, with an input that torch cannot even inspect (a
        sparse CSR tensor has no strides) reported as a problem, so that it fails the
        call on every rank like a failed check instead of raising here alone."""
        try:
            return self._dispatch_problem(*args)
        except (RuntimeError, TypeError, ValueError) as e:
            return f"dispatch inputs could not be checked: {e}"

    def _dispatch_problem(
        self, input, weights, scales, indices, block_num, rdma_block_num, warp_per_block
    ):
        c = self.config
        k = c.num_experts_per_token
        problem = self._tokens_problem(
            input,
            "input",
            _TOKEN_DTYPES,
            "input dtype {dtype} is not one of bf16, fp8 e4m3, fp16, fp32",
        )
        if problem is not None:
            return problem
        n = input.size(0)
        if not isinstance(indices, torch.Tensor) or indices.dtype not in _INDEX_DTYPES:
            return f"indices must be an int32 or int64 tensor, got {_describe(indices)}"
        if indices.device != self.device:
            return f"indices is on {indices.device}, the op runs on {self.device}"
        if indices.dim() != 2 or indices.size(0) != n:
            return f"indices must be [{n}, {k}], got shape {tuple(indices.shape)}"
        if indices.size(1) > k:
            return (
                f"indices has {indices.size(1)} experts per token, more than "
                f"num_experts_per_token {k}"
            )
        if indices.size(1) < k:
            return (
                f"indices has {indices.size(1)} experts per token, fewer than "
                f"num_experts_per_token {k} (pad with -1)"
            )
        if weights is not None:
            if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
                return f"weights must be a float32 tensor or None, got {_describe(weights)}"
            if weights.device != self.device:
                return f"weights is on {weights.device}, the op runs on {self.device}"
            if tuple(weights.shape) != (n, k):
                return f"weights must be [{n}, {k}], got shape {tuple(weights.shape)}"
        if c.scale_dim > 0:
            if not isinstance(scales, torch.Tensor):
                return f"scales are required (scale_dim {c.scale_dim}), got {_describe(scales)}"
            if scales.device != self.device:
                return f"scales is on {scales.device}, the op runs on {self.device}"
            if scales.element_size() != c.scale_type_size:
                return (
                    f"scales dtype {scales.dtype} has {scales.element_size()}-byte elements, "
                    f"scale_type_size is {c.scale_type_size}"
                )
            if tuple(scales.shape) != (n, c.scale_dim):
                return f"scales must be [{n}, {c.scale_dim}], got shape {tuple(scales.shape)}"
        elif scales is not None and (not isinstance(scales, torch.Tensor) or scales.numel()):
            return f"scales given ({_describe(scales)}) but the config has scale_dim 0"
        problem = _check_launch(block_num, rdma_block_num, warp_per_block)
        return problem if problem is not None else self._int64_ids_problem(indices)

    def _int64_ids_problem(self, indices):
        """int64 routing on the CPU implementation is checked before its cast to int32,
        which could wrap a bad id into range (int32 ids are checked where they are read;
        on CUDA, in the kernel). The first id outside [-1, num_experts), or None."""
        if indices.dtype != torch.int64 or self._cuda or not indices.size(0):
            return None
        bad = (indices < -1) | (indices >= self.config.num_experts)
        if not bool(bad.any()):
            return None
        t, j = (int(v) for v in bad.nonzero()[0])
        return (
            f"expert id {int(indices[t, j])} out of range [-1, {self.config.num_experts}) at "
            f"token {t} slot {j}"
        )

    def dispatch(
        self,
        input: torch.Tensor,
        weights: torch.Tensor | None,
        scales: torch.Tensor | None,
        indices: torch.Tensor,
        block_num: int = -1,
        rdma_block_num: int = -1,
        warp_per_block: int = -1,
        call_local_expert_count: bool = False,
        *,
        routing: Any = None,
        return_routing: bool = False,
    ):
        """Send each token once to every rank that owns at least one of its experts.

        Args:
            input: ``[num_tokens, hidden_dim]`` bf16, fp8 e4m3 (``torch.float8_e4m3fn``),
                fp16 or fp32 with element size <= ``max_token_type_size``;
                ``num_tokens`` may be 0. Every rank must pass the same dtype (compared
                in the count exchange: a difference fails the call on every rank).
            weights: fp32 ``[num_tokens, num_experts_per_token]`` (router weights), or
                None (the receivers get zeros).
            scales: ``[num_tokens, scale_dim]`` with ``scale_type_size``-byte elements
                (fp32 per 128 columns for fp8), or None when ``scale_dim`` is 0.
            indices: int32 or int64 ``[num_tokens, num_experts_per_token]`` global expert
                ids in ``[0, num_experts)``; ``-1`` marks an unused slot (int64 is
                narrowed to int32 on the device, out-of-range values staying out of
                range).
            block_num, warp_per_block: CUDA launch shape (-1: the config's); ignored on CPU.
            rdma_block_num: MORI's inter-node launch parameter; unused intra-node.
            call_local_expert_count: also count, on the device, the (received token,
                slot) pairs per local expert into :attr:`local_expert_count`.
            routing: an :class:`EpDispatchRoutingHandle` (intra-node kernel type):
                replay its dispatch's layout. Each token goes to the ranks it went to
                then (``indices`` travel as data only and are not checked), so with
                every rank replaying handles of the same earlier call the rows land
                where they landed then; ``input`` must have the handle's
                ``cur_rank_num_token`` rows. The handle can then be combined again.
            return_routing: also return a new handle of this call's routing (not
                with ``routing=``).

        Returns:
            ``(out, out_weights, out_scales, out_indices, total_recv)``: views of the
            receive buffers sized to capacity ``C = world_size * max_num_inp_token_per_rank``
            (``out [C, hidden_dim]`` in input's dtype, ``out_weights fp32 [C, k]``,
            ``out_scales [C, scale_dim]`` in scales' dtype or None, ``out_indices int32
            [C, k]``) whose rows ``[0, total_recv)`` hold the received tokens, and
            ``total_recv`` an int32 tensor ``[1]`` on the op's device (with a
            routing handle: the handle's ``total_recv_token_num``). Rows arrive
            ordered by source rank, then by source token index; each carries the
            token's full top-k indices, weights and scales. With
            ``return_routing=True`` the handle follows as a sixth element (MORI's).

        Raises:
            InvalidArgumentError, host-side before any data moves: wrong type, dtype,
                shape or device of any argument; more tokens than
                ``max_num_inp_token_per_rank``; more (or fewer) experts per token than
                ``num_experts_per_token``; on the CPU implementation also an expert id
                outside ``[-1, num_experts)`` (naming id, token and slot). On CUDA the
                expert id check is a device-side trap in the dispatch kernel (the host
                cannot see ids without a synchronisation). Also raised when another
                rank rejected its inputs in the same call, or passed another token
                dtype (on CUDA: a trap on every rank naming both).
            MoriTimeoutError: a rank did not take part within ``timeout_s``.
        """
        impl = self._impl_or_raise()
        if self._ll and (routing is not None or return_routing):
            raise NotSupportedError(
                f"routing handles (routing=, return_routing=) are implemented for kernel_type "
                f"IntraNode, not {self.config.kernel_type.name} (as in MORI)"
            )
        problem = self._check_dispatch(
            input, weights, scales, indices, block_num, rdma_block_num, warp_per_block
        )
        if problem is None and (routing is not None or return_routing):
            problem = self._replay_problem(input, indices, routing, return_routing)
        if self._ll:
            return self._ll_dispatch(problem, input, weights, scales, indices, block_num,
                                     warp_per_block, call_local_expert_count)  # fmt: skip
        if problem is not None:
            self._reject_dispatch(impl, problem)  # raises InvalidArgumentError(problem)
        c = self.config
        has_scales = c.scale_dim > 0
        try:  # torch may still refuse an input that passed the checks (a sparse layout)
            input = input.contiguous()
            n = input.size(0)
            weights = self._zero_weights[:n] if weights is None else weights.contiguous()
            if indices.dtype == torch.int64:
                indices = indices.clamp(-(2**31), 2**31 - 1).to(torch.int32)
            indices = indices.contiguous()
            if has_scales:
                scales = scales.contiguous()
            row_bytes = c.hidden_dim * input.element_size()
            masks = 0 if routing is None else _routing.rank_masks(self, routing).data_ptr()
            args = (
                input.data_ptr(),
                row_bytes,
                weights.data_ptr(),
                scales.data_ptr() if has_scales else 0,
                indices.data_ptr(),
                input.size(0),
            )
        except (RuntimeError, TypeError, ValueError) as e:
            # Fail the call on every rank, as a check would, instead of leaving the
            # peers waiting for this rank's counts.
            self._reject_dispatch(impl, f"dispatch inputs could not be prepared: {e}")
        tag = _ROW_TAGS[input.dtype]
        with self._fails_on_timeout():
            if self._cuda:
                impl.dispatch(
                    *args, *self._launch(block_num, warp_per_block), self._stream(), masks, tag
                )
            else:
                impl.dispatch(*args, masks, tag)
        if call_local_expert_count:
            self._count_local_experts()
        out = self._recv_tokens[:, :row_bytes].view(input.dtype)
        out_scales = self._recv_scales.view(scales.dtype) if has_scales else None
        base = (out, self._recv_weights, out_scales, self._recv_indices)
        if routing is not None:
            _routing.stamp(self, routing)
            return (*base, routing.total_recv_token_num)
        if return_routing:
            handle = _routing.snapshot(self, n)
            return (*base, handle.total_recv_token_num, handle)
        return (*base, self._total_recv)

    def _replay_problem(self, input, indices, routing, return_routing) -> str | None:
        """What is wrong with dispatch's routing arguments (MORI's messages), or None."""
        if routing is not None and return_routing:
            return "pass either `routing=` (replay) or `return_routing=True` (new layout), not both"
        if routing is None:
            return None
        problem = _routing.handle_problem(routing, self, replay=True)
        if problem is not None:
            return problem
        replay_n = routing.cur_rank_num_token
        if input.size(0) != replay_n:
            return (
                f"replay dispatch input has {input.size(0)} tokens but "
                f"routing.cur_rank_num_token={replay_n}"
            )
        if indices.size(0) != replay_n:
            return (
                f"replay dispatch indices has {indices.size(0)} tokens but "
                f"routing.cur_rank_num_token={replay_n}"
            )
        return None

    def _count_local_experts(self) -> None:
        """local_expert_count from the last dispatch's received indices (rows past
        total_recv not read): on CUDA one kernel on the current stream, no host
        synchronisation (the native count mori.ops.local_expert_count launches)."""
        c = self.config
        idx = self._recv_indices
        args = (
            idx.data_ptr(),
            self._total_recv.data_ptr(),
            c.rank,
            c.num_experts_per_rank,
            c.num_experts_per_token,
            self.local_expert_count.data_ptr(),
        )
        if self._cuda:
            blocks = max(1, min(64, -(-idx.numel() // 256)))
            _C.local_expert_count_cuda(*args, blocks, 256, self._stream())
        else:
            _C.local_expert_count_cpu(*args)

    # ------------------------------------------------------------------- combine
    def _check_combine(self, *args) -> str | None:
        """:meth:`_combine_problem`, an input torch cannot inspect reported as a
        problem (as :meth:`_check_dispatch`)."""
        try:
            return self._combine_problem(*args)
        except (RuntimeError, TypeError, ValueError) as e:
            return f"combine inputs could not be checked: {e}"

    def _combine_problem(
        self, input, weights, indices, block_num, rdma_block_num, warp_per_block, use_ext,
        routing=None,
    ):  # fmt: skip
        c = self.config
        k, cap = c.num_experts_per_token, c.max_num_tokens_to_recv
        # On CUDA total_recv is on the device: rows >= total_recv is a kernel trap there.
        if self._ll:
            total = 0 if self._cuda else self._ll_total_recv
        elif routing is not None:
            total = 0 if self._cuda else int(_routing.derived(self, routing)[5])
        else:
            total = 0 if self._cuda else self._impl.total_recv
        n = self._impl.num_tokens if routing is None else routing.cur_rank_num_token
        if not isinstance(input, torch.Tensor):
            return f"input must be a torch.Tensor, got {_describe(input)}"
        if input.device != self.device:
            return f"input is on {input.device}, the op runs on {self.device}"
        if input.dtype not in _COMBINE_DTYPE_CODES:
            return f"combine input dtype {input.dtype} must be bf16, fp32 or fp8 e4m3"
        if (
            self._quant == EpDispatchCombineQuantType.Fp8DirectCast
            and input.dtype != torch.bfloat16
        ):
            return f"quant_type fp8_direct_cast combines bf16 input, got {input.dtype}"
        if input.element_size() > max(c.max_token_type_size, 2):
            return (
                f"combine input dtype {input.dtype} needs {input.element_size()}-byte elements, "
                f"the buffers hold {max(c.max_token_type_size, 2)} (max_token_type_size)"
            )
        if input.dim() != 2 or input.size(1) != c.hidden_dim:
            return f"input must be [rows, {c.hidden_dim}], got shape {tuple(input.shape)}"
        if not total <= input.size(0) <= cap:
            return (
                f"combine input has {input.size(0)} rows; it needs total_recv {total} to "
                f"capacity {cap} rows in dispatch order"
            )
        if input.stride(1) != 1:
            return "combine input rows must be contiguous (stride 1 along hidden_dim)"
        if weights is not None:
            if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
                return f"weights must be a float32 tensor or None, got {_describe(weights)}"
            if weights.device != self.device:
                return f"weights is on {weights.device}, the op runs on {self.device}"
            if weights.dim() != 2 or weights.size(1) != k or not total <= weights.size(0) <= cap:
                return (
                    f"weights must be [rows, {k}] with total_recv {total} <= rows <= {cap}, "
                    f"got shape {tuple(weights.shape)}"
                )
        if indices is not None:
            if not isinstance(indices, torch.Tensor) or indices.dtype not in _INDEX_DTYPES:
                return f"indices must be an int32 or int64 tensor or None, got {_describe(indices)}"
            if indices.dim() != 2 or indices.size(1) != k:
                return f"indices must be [{n}, {k}], got shape {tuple(indices.shape)}"
            if indices.size(0) != n:
                return (
                    f"combine indices has {indices.size(0)} rows but this rank dispatched {n} "
                    f"tokens: pass this rank's own [num_tokens, {k}] routing (the tensor given "
                    "to dispatch), not dispatch's out_indices"
                )
        if not isinstance(use_ext, int):
            return f"use_external_inp_buf {use_ext!r} must be an int or bool (-1: the config's)"
        return _check_launch(block_num, rdma_block_num, warp_per_block)

    def combine(
        self,
        input: torch.Tensor,
        weights: torch.Tensor | None,
        indices: torch.Tensor | None,
        block_num: int = -1,
        rdma_block_num: int = -1,
        warp_per_block: int = -1,
        use_external_inp_buf: int = -1,
        call_reset: bool = False,
        *,
        routing: Any = None,
    ):
        """Return every received row to its source token and sum per token.

        Args:
            input: bf16, fp32 or fp8 e4m3 ``[rows, hidden_dim]``,
                rows in the order of the last dispatch's output (``total_recv <= rows
                <= capacity``; the dispatch output itself, the experts' outputs, or
                :meth:`get_registered_combine_input_buffer` qualify). Row-contiguous.
            weights: fp32 ``[rows, num_experts_per_token]`` (dispatch's out_weights
                layout) or None.
            indices: this rank's own routing, the ``[num_tokens, k]`` int32/int64
                tensor it passed to dispatch (as MORI requires), or None; checked for
                shape only: the routing itself comes from the dispatch. Adds no kernel
                and no synchronisation.
            block_num, warp_per_block: CUDA launch shape (<= 0: the config's); ignored
                on CPU. rdma_block_num: MORI's inter-node parameter, unused here.
            use_external_inp_buf: MORI's flag (-1: the config's); the intra-node
                implementation reads ``input`` wherever it lies either way.
            call_reset: MORI's flag; nothing to reset here (epochs), accepted.
            routing: an :class:`EpDispatchRoutingHandle` of an earlier dispatch of
                this op (intra-node kernel type): reverse that dispatch instead of the
                last one; ``input`` then holds that dispatch's rows, in its order (a
                later dispatch overwrote the receive buffers: keep a copy).
                Dispatches are combined in their order, each once (a handle is
                combined again after replaying it); a combine that follows a
                combine first runs a barrier over the ranks (on CUDA on the stream),
                so that no rank's rows overwrite what a peer still reduces.

        Returns:
            ``(out, out_weights)``: ``out [num_tokens, hidden_dim]`` in input's dtype,
            where ``num_tokens`` is this rank's last dispatch's (the handle's
            ``cur_rank_num_token``); row ``t`` is the sum,
            over the ranks token ``t`` went to in ascending rank order, of the rows
            they return, accumulated in fp32 and rounded once (zeros for a token with
            no expert). With ``quant_type="fp8_direct_cast"`` every returned value is
            first rounded to fp8 e4m3, as MORI sends it (on CUDA the rows cross
            NVLink as fp8 bytes and the kernel rounds this rank's own part likewise).
            ``out_weights fp32 [num_tokens, k]`` likewise, or None. Views of the op's
            buffers, valid until the next combine.

        Raises:
            InvalidStateError: no dispatch since the last combine, or a handle that is
                not this op's or whose dispatch was combined already or precedes
                the last combined one (local checks).
            InvalidArgumentError, host-side before any data moves: type, dtype, shape,
                device, row count below ``total_recv`` (on CUDA, where total_recv is on
                the device, that bound is a device-side trap), indices that are not
                this rank's ``[num_tokens, k]`` routing, a routing handle whose
                tensors do not fit this op (type, dtype, size, device, layout); or
                another rank rejected its combine inputs or passed another input dtype (on CUDA a trap on every
                rank naming both).
            MoriTimeoutError: a rank did not take part within ``timeout_s``.
        """
        del call_reset
        impl = self._impl_or_raise()
        if self._ll:
            if routing is not None:
                raise NotSupportedError(
                    f"routing handles (routing=) are implemented for kernel_type IntraNode, "
                    f"not {self.config.kernel_type.name} (as in MORI)"
                )
            return self._ll_combine(input, weights, indices, block_num, rdma_block_num,
                                    warp_per_block, use_external_inp_buf)  # fmt: skip
        words = None
        if routing is not None:
            order_problem = _routing.order_problem(routing, self)
            if order_problem is not None:
                raise InvalidStateError(order_problem)
            # An unusable handle fails the call on every rank, as a bad input does.
            handle_problem = _routing.handle_problem(routing, self, replay=False)
            if handle_problem is None:
                try:
                    words = _routing.combine_words(self, routing)
                except (RuntimeError, TypeError, ValueError) as e:
                    handle_problem = f"routing handle could not be read: {e}"
            if handle_problem is not None:
                self._reject_combine(impl, handle_problem, _routing.reject_words(self, routing))
        elif not impl.combine_pending:
            raise InvalidStateError(
                f"combine needs a successful dispatch since the last combine (epoch {impl.epoch})"
            )
        problem = self._check_combine(
            input, weights, indices, block_num, rdma_block_num, warp_per_block,
            use_external_inp_buf, routing,
        )  # fmt: skip
        if problem is not None:
            self._reject_combine(impl, problem, words)
        c = self.config
        n = impl.num_tokens if routing is None else routing.cur_rank_num_token
        out_dtype = input.dtype
        fp8_cast = self._quant == EpDispatchCombineQuantType.Fp8DirectCast
        try:  # as in dispatch: a local failure here fails the call on every rank
            out = self._combine_out.get(out_dtype)
            if out is None:
                out = torch.empty(
                    (c.max_num_inp_token_per_rank, c.hidden_dim),
                    dtype=out_dtype,
                    device=self.device,
                )
                self._combine_out[out_dtype] = out
            out_weights = self._combine_out_weights if weights is not None else None
            if weights is not None:
                weights = weights.contiguous()
            addrs = (
                input.data_ptr(),
                input.stride(0) * input.element_size(),
                input.size(0),
            )
            outs = (
                weights.data_ptr() if weights is not None else 0,
                out.data_ptr(),
                out_weights.data_ptr() if out_weights is not None else 0,
            )
        except (RuntimeError, TypeError, ValueError) as e:
            self._reject_combine(impl, f"combine inputs could not be prepared: {e}", words)
        with self._fails_on_timeout():
            if self._cuda:
                impl.combine(
                    *addrs, _COMBINE_DTYPE_CODES[input.dtype], *outs, fp8_cast,
                    *self._launch(block_num, warp_per_block), self._stream(), words,
                )  # fmt: skip
            else:
                impl.combine(*addrs, _COMBINE_DTYPE_CODES[input.dtype], *outs, fp8_cast, words)
        return out[:n], (out_weights[:n] if out_weights is not None else None)

    def get_registered_combine_input_buffer(
        self, dtype: torch.dtype, hidden_dim: int = -1
    ) -> torch.Tensor:
        """A ``[max_num_tokens_to_recv, hidden_dim]`` buffer of ``dtype`` on the op's
        device (``hidden_dim`` <= 0: the config's) for experts to write their outputs
        into and pass to :meth:`combine` as ``input`` (MORI's zero-copy combine input).
        Combine reads its input in place wherever it lies, so this saves the copy
        only in the sense MORI means; the same buffer is returned for the same
        arguments."""
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgumentError(f"dtype {dtype!r} must be a torch.dtype")
        h = self.config.hidden_dim if hidden_dim <= 0 else int(hidden_dim)
        key = (dtype, h)
        buf = self._registered_inputs.get(key)
        if buf is None:
            buf = torch.empty(
                (self.config.max_num_tokens_to_recv, h), dtype=dtype, device=self.device
            )
            self._registered_inputs[key] = buf
        return buf

    def max_num_tokens_to_recv(self) -> int:
        """Rows of the receive buffers (MORI's method; see the config's property)."""
        return self.config.max_num_tokens_to_recv

    def max_num_tokens_to_recv_per_rank(self) -> int:
        return self.config.max_num_tokens_to_recv_per_rank

    def max_num_tokens_to_send(self) -> int:
        return self.config.max_num_tokens_to_send

    def max_num_tokens_to_send_per_rank(self) -> int:
        return self.config.max_num_tokens_to_send_per_rank

    def decode_send_flat_idx(self, flat_idx: int) -> tuple[int, int]:
        """MORI's decoding of a flat send index: ``divmod(flat_idx,
        max_num_tokens_to_send())``."""
        stride = self.max_num_tokens_to_send()
        return int(flat_idx) // stride, int(flat_idx) % stride

    def get_launch_config(
        self, is_dispatch: bool = True, block_num: int = -1, rdma_block_num: int = -1,
        warp_per_block: int = -1,
    ) -> tuple[int, int, int]:  # fmt: skip
        """MORI's launch-parameter query: ``(block_num, rdma_block_num,
        warp_per_block)`` as given (MORI's MANUAL mode; <= 0 means the config's)."""
        del is_dispatch
        return block_num, rdma_block_num, warp_per_block

    # --------------------------------------------------------------------- misc
    def get_dispatch_src_token_pos(self) -> torch.Tensor:
        """``[total_recv]`` flat send indices, one per received row of the last
        dispatch: ``src_rank * max_num_tokens_to_send() + src_token_index`` (MORI's
        encoding, stride ``world_size * max_num_inp_token_per_rank``; decode with
        :meth:`decode_send_flat_idx`). int32, or int64 when ``world_size**2 *
        max_num_inp_token_per_rank`` does not fit in int32. A new tensor on the op's
        device. On CUDA this reads total_recv, so it synchronises the stream."""
        impl = self._impl_or_raise()
        del impl
        total = int(self._total_recv.item())
        c = self.config
        m = c.max_num_inp_token_per_rank
        # The buffer holds src_rank * M + token (the kernels' compact form).
        pos = self._recv_src_pos[:total].to(torch.int64)
        flat = pos // m * c.max_num_tokens_to_send + pos % m
        if c.world_size * c.max_num_tokens_to_send < 2**31:
            flat = flat.to(torch.int32)
        return flat

    def reset(self) -> None:
        """MORI's reset between iterations; a no-op (every call carries its epoch)."""

    def close(self) -> None:
        """Drop the op's buffers (they are freed once no returned view holds them);
        later calls raise InvalidStateError. Not collective."""
        self._impl = None
        for name in (
            "_block",
            "_config_table",
            "_recv_tokens",
            "_recv_weights",
            "_recv_scales",
            "_recv_indices",
            "_recv_src_pos",
            "_total_recv",
        ):
            setattr(self, name, None)
        self._combine_out = {}
