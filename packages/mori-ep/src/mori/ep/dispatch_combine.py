# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MoE dispatch/combine with MORI's API (``mori.ops`` there, ``mori.ep`` here).

The protocol (symmetric receive buffers sized to capacity, a count exchange that
reserves rows, per-call epochs in the signal words) is described in the package
README and in ``csrc/protocol.hpp``; this module checks inputs and owns the
symmetric block.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from mori.core import InvalidArgumentError, InvalidStateError, NotSupportedError, shmem

from . import _C

_TOKEN_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float16, torch.float32)
_COMBINE_DTYPES = (torch.bfloat16, torch.float32)


class EpDispatchCombineKernelType(enum.IntEnum):
    """Which kernel family runs the op (MORI's names). This release implements
    ``IntraNode`` (every rank on one node, over load/store-reachable symmetric
    memory); on a host heap it runs the CPU implementation of that protocol."""

    IntraNode = 0
    InterNode = 1
    InterNodeV1 = 2
    InterNodeV1LL = 3
    AsyncLL = 4


@dataclass
class EpDispatchCombineConfig:
    """Shape of an expert-parallel group; the fields and their order are MORI's.

    Args:
        rank, world_size: this rank and the number of EP ranks (= shmem pes).
        hidden_dim: columns of a token row.
        scale_dim: scale columns per token (fp8: ``hidden_dim // 128``), 0 for none.
        scale_type_size: bytes per scale element (4 for fp32 scales).
        max_token_type_size: bytes per token element the buffers are sized for
            (2 for bf16; 1 for fp8-only dispatch, combine buffers still hold bf16).
        max_num_inp_token_per_rank: most tokens a rank passes to one dispatch.
        num_experts_per_rank: experts per rank; global expert ``e`` lives on rank
            ``e // num_experts_per_rank``.
        num_experts_per_token: top-k columns of ``indices`` and ``weights``.
        warp_num_per_block, block_num: default launch shape of the CUDA kernels
            (ignored by the CPU implementation).
        use_external_inp_buf, gpu_per_node, rdma_block_num, num_qp_per_pe: MORI's
            fields, accepted for porting; unused by the intra-node kernels.
        kernel_type: only ``IntraNode`` in this release.
        data_type: MORI's leading field, keyword-only here (default bf16): the
            dtype dispatch tokens usually have; dispatch accepts any of bf16, fp8
            e4m3, fp16, fp32 whose size fits ``max_token_type_size``.
        device: ``"cpu"``, ``"cuda"`` or None (follow the shmem heap: a host heap
            selects the CPU implementation).
    """

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
    use_external_inp_buf: bool = True
    kernel_type: EpDispatchCombineKernelType = EpDispatchCombineKernelType.IntraNode
    gpu_per_node: int = 8
    rdma_block_num: int = 0
    num_qp_per_pe: int = 1
    data_type: torch.dtype = field(default=torch.bfloat16, kw_only=True)
    device: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        def positive(name):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{name} {v!r} must be a positive int")

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
        self.kernel_type = EpDispatchCombineKernelType(self.kernel_type)
        if self.device not in (None, "cpu", "cuda"):
            raise InvalidArgumentError(f"device {self.device!r} must be 'cpu', 'cuda' or None")

    @property
    def num_experts(self) -> int:
        return self.num_experts_per_rank * self.world_size

    @property
    def max_num_out_tokens(self) -> int:
        """Receive capacity per rank: ``world_size * max_num_inp_token_per_rank``."""
        return self.world_size * self.max_num_inp_token_per_rank


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


class EpDispatchCombineOp:
    """Dispatch tokens to the ranks of their experts and combine the results back.

    Collective: every rank of the shmem heap creates the op with the same config
    (its own ``rank``), in the same order as other symmetric allocations. It
    allocates one symmetric block (receive buffers sized to capacity, see
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
    then unusable (create a new one).

    On a CUDA heap the calls enqueue kernels on torch's current stream and never
    synchronise with the host (``total_recv`` stays on the device; dispatch and
    combine can be captured in a CUDA graph, each replay advancing the epoch kept in
    device memory). Failures that only the device can see are traps that print what
    was wrong: an expert id outside ``[-1, num_experts)`` (naming token, slot and
    value), combine input shorter than ``total_recv``, a peer that does not arrive
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
        if config.kernel_type != EpDispatchCombineKernelType.IntraNode:
            raise NotSupportedError(
                f"kernel_type {config.kernel_type.name} is not implemented yet (IntraNode is)"
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
        self.timeout_s = float(timeout_s)
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
        self._layout = _C.ep_buffer_layout(*shape)
        self._block = shmem.empty((self._layout["total_bytes"],), torch.uint8)
        self._cuda = kind == "cuda"
        if self._cuda:
            self._impl = _C.IntraNodeCuda(
                *shape, self._block.data_ptr(), self.device.index, self.timeout_s
            )
        else:
            self._impl = _C.IntraNodeCpu(*shape, self._block.data_ptr(), self.timeout_s)
        cap, k = c.max_num_out_tokens, c.num_experts_per_token
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

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def _launch(self, block_num: int, warp_per_block: int) -> tuple[int, int]:
        c = self.config
        return (
            c.block_num if block_num == -1 else block_num,
            c.warp_num_per_block if warp_per_block == -1 else warp_per_block,
        )

    def _reject_dispatch(self, impl, problem: str):
        if self._cuda:
            impl.reject_dispatch(problem, self._stream())
        else:
            impl.reject_dispatch(problem)

    def _reject_combine(self, impl, problem: str):
        if self._cuda:
            impl.reject_combine(problem, self._stream())
        else:
            impl.reject_combine(problem)

    def _region(self, name: str, nbytes: int) -> torch.Tensor:
        off = self._layout[name]
        return self._block[off : off + nbytes]

    def _impl_or_raise(self):
        if self._impl is None:
            raise InvalidStateError("this EpDispatchCombineOp was closed")
        return self._impl

    # ------------------------------------------------------------------ dispatch
    def _check_dispatch(self, input, weights, scales, indices, block_num, warp_per_block):
        c = self.config
        k, m = c.num_experts_per_token, c.max_num_inp_token_per_rank
        if not isinstance(input, torch.Tensor):
            return f"input must be a torch.Tensor, got {_describe(input)}"
        if input.device != self.device:
            return f"input is on {input.device}, the op runs on {self.device}"
        if input.dtype not in _TOKEN_DTYPES:
            return f"input dtype {input.dtype} is not one of bf16, fp8 e4m3, fp16, fp32"
        if input.element_size() > c.max_token_type_size:
            return (
                f"input dtype {input.dtype} has {input.element_size()}-byte elements, more than "
                f"max_token_type_size {c.max_token_type_size}"
            )
        if input.dim() != 2 or input.size(1) != c.hidden_dim:
            return f"input must be [num_tokens, {c.hidden_dim}], got shape {tuple(input.shape)}"
        n = input.size(0)
        if n > m:
            return f"num_tokens {n} exceeds max_num_inp_token_per_rank {m}"
        if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
            return f"indices must be an int32 tensor, got {_describe(indices)}"
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
        if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
            return f"weights must be a float32 tensor, got {_describe(weights)}"
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
        for name, v in (("block_num", block_num), ("warp_per_block", warp_per_block)):
            if not isinstance(v, int) or (v != -1 and v < 1):
                return f"{name} {v!r} must be -1 (config default) or a positive int"
        return None

    def dispatch(
        self,
        input: torch.Tensor,
        weights: torch.Tensor,
        scales: torch.Tensor | None,
        indices: torch.Tensor,
        block_num: int = -1,
        warp_per_block: int = -1,
    ):
        """Send each token once to every rank that owns at least one of its experts.

        Args:
            input: ``[num_tokens, hidden_dim]`` bf16, fp8 e4m3 (``torch.float8_e4m3fn``),
                fp16 or fp32 with element size <= ``max_token_type_size``;
                ``num_tokens`` may be 0. Every rank must pass the same dtype.
            weights: fp32 ``[num_tokens, num_experts_per_token]`` (router weights).
            scales: ``[num_tokens, scale_dim]`` with ``scale_type_size``-byte elements
                (fp32 per 128 columns for fp8), or None when ``scale_dim`` is 0.
            indices: int32 ``[num_tokens, num_experts_per_token]`` global expert ids in
                ``[0, num_experts)``; ``-1`` marks an unused slot.
            block_num, warp_per_block: CUDA launch shape (-1: the config's); ignored on CPU.

        Returns:
            ``(out, out_weights, out_scales, out_indices, total_recv)``: views of the
            receive buffers sized to capacity ``C = world_size * max_num_inp_token_per_rank``
            (``out [C, hidden_dim]`` in input's dtype, ``out_weights fp32 [C, k]``,
            ``out_scales [C, scale_dim]`` in scales' dtype or None, ``out_indices int32
            [C, k]``) whose rows ``[0, total_recv)`` hold the received tokens, and
            ``total_recv`` an int32 tensor ``[1]`` on the op's device. Rows arrive
            ordered by source rank, then by source token index; each carries the
            token's full top-k indices, weights and scales.

        Raises:
            InvalidArgumentError, host-side before any data moves: wrong type, dtype,
                shape or device of any argument; more tokens than
                ``max_num_inp_token_per_rank``; more (or fewer) experts per token than
                ``num_experts_per_token``; on the CPU implementation also an expert id
                outside ``[-1, num_experts)`` (naming id, token and slot). On CUDA the
                expert id check is a device-side trap in the dispatch kernel (the host
                cannot see ids without a synchronisation). Also raised when another
                rank rejected its inputs in the same call.
            MoriTimeoutError: a rank did not take part within ``timeout_s``.
        """
        impl = self._impl_or_raise()
        problem = self._check_dispatch(input, weights, scales, indices, block_num, warp_per_block)
        if problem is not None:
            self._reject_dispatch(impl, problem)  # raises InvalidArgumentError(problem)
        c = self.config
        input = input.contiguous()
        weights = weights.contiguous()
        indices = indices.contiguous()
        has_scales = c.scale_dim > 0
        if has_scales:
            scales = scales.contiguous()
        row_bytes = c.hidden_dim * input.element_size()
        args = (
            input.data_ptr(),
            row_bytes,
            weights.data_ptr(),
            scales.data_ptr() if has_scales else 0,
            indices.data_ptr(),
            input.size(0),
        )
        if self._cuda:
            impl.dispatch(*args, *self._launch(block_num, warp_per_block), self._stream())
        else:
            impl.dispatch(*args)
        out = self._recv_tokens[:, :row_bytes].view(input.dtype)
        out_scales = self._recv_scales.view(scales.dtype) if has_scales else None
        return out, self._recv_weights, out_scales, self._recv_indices, self._total_recv

    # ------------------------------------------------------------------- combine
    def _check_combine(self, input, weights, indices, block_num, warp_per_block):
        c = self.config
        k, cap = c.num_experts_per_token, c.max_num_out_tokens
        # On CUDA total_recv is on the device: rows >= total_recv is a kernel trap there.
        total = 0 if self._cuda else self._impl.total_recv
        if not isinstance(input, torch.Tensor):
            return f"input must be a torch.Tensor, got {_describe(input)}"
        if input.device != self.device:
            return f"input is on {input.device}, the op runs on {self.device}"
        if input.dtype not in _COMBINE_DTYPES:
            return f"combine input dtype {input.dtype} must be bf16 or fp32"
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
        rows = input.size(0)
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
            if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
                return f"indices must be an int32 tensor or None, got {_describe(indices)}"
            if indices.dim() != 2 or indices.size(1) != k or indices.size(0) != rows:
                return f"indices must be [{rows}, {k}], got shape {tuple(indices.shape)}"
        for name, v in (("block_num", block_num), ("warp_per_block", warp_per_block)):
            if not isinstance(v, int) or (v != -1 and v < 1):
                return f"{name} {v!r} must be -1 (config default) or a positive int"
        return None

    def combine(
        self,
        input: torch.Tensor,
        weights: torch.Tensor | None,
        indices: torch.Tensor | None,
        block_num: int = -1,
        warp_per_block: int = -1,
        call_reset: bool = False,
    ):
        """Return every received row to its source token and sum per token.

        Args:
            input: bf16 or fp32 ``[rows, hidden_dim]``, rows in the order of the last
                dispatch's output (``total_recv <= rows <= capacity``; the dispatch
                output itself, or the experts' outputs, qualify). Row-contiguous.
            weights: fp32 ``[rows, num_experts_per_token]`` or None.
            indices: the dispatch's ``out_indices`` (``[rows, k]`` int32) or None;
                checked for shape only: the routing comes from the dispatch, as in MORI.
            block_num, warp_per_block: CUDA launch shape; ignored on CPU.
            call_reset: MORI's flag; nothing to reset here (epochs), accepted.

        Returns:
            ``(out, out_weights)``: ``out [num_tokens, hidden_dim]`` in input's dtype,
            where ``num_tokens`` is this rank's last dispatch's; row ``t`` is the sum,
            over the ranks token ``t`` went to in ascending rank order, of the rows
            they return, accumulated in fp32 and rounded once (zeros for a token with
            no expert). ``out_weights fp32 [num_tokens, k]`` likewise, or None. Views
            of the op's buffers, valid until the next combine.

        Raises:
            InvalidStateError: no dispatch since the last combine (local check).
            InvalidArgumentError, host-side before any data moves: type, dtype, shape,
                device, row count below ``total_recv`` (on CUDA, where total_recv is on
                the device, that bound is a device-side trap); or another rank rejected
                its combine inputs.
            MoriTimeoutError: a rank did not take part within ``timeout_s``.
        """
        del call_reset
        impl = self._impl_or_raise()
        if not impl.combine_pending:
            raise InvalidStateError(
                f"combine needs a successful dispatch since the last combine (epoch {impl.epoch})"
            )
        problem = self._check_combine(input, weights, indices, block_num, warp_per_block)
        if problem is not None:
            self._reject_combine(impl, problem)
        c = self.config
        n = impl.num_tokens
        out = self._combine_out.get(input.dtype)
        if out is None:
            out = torch.empty(
                (c.max_num_inp_token_per_rank, c.hidden_dim), dtype=input.dtype, device=self.device
            )
            self._combine_out[input.dtype] = out
        out_weights = self._combine_out_weights if weights is not None else None
        if weights is not None:
            weights = weights.contiguous()
        args = (
            input.data_ptr(),
            input.stride(0) * input.element_size(),
            input.size(0),
            input.dtype == torch.bfloat16,
            weights.data_ptr() if weights is not None else 0,
            out.data_ptr(),
            out_weights.data_ptr() if out_weights is not None else 0,
        )
        if self._cuda:
            impl.combine(*args, *self._launch(block_num, warp_per_block), self._stream())
        else:
            impl.combine(*args)
        return out[:n], (out_weights[:n] if out_weights is not None else None)

    # --------------------------------------------------------------------- misc
    def get_dispatch_src_token_pos(self) -> torch.Tensor:
        """int32 ``[total_recv]``: for each received row of the last dispatch,
        ``src_rank * max_num_inp_token_per_rank + src_token_index`` (MORI's encoding;
        decode with ``divmod(pos, max_num_inp_token_per_rank)``). On CUDA this reads
        total_recv, so it synchronises the stream."""
        impl = self._impl_or_raise()
        total = int(self._total_recv.item()) if self._cuda else impl.total_recv
        return self._recv_src_pos[:total]

    def reset(self) -> None:
        """MORI's reset between iterations; a no-op (every call carries its epoch)."""

    def close(self) -> None:
        """Drop the op's buffers (they are freed once no returned view holds them);
        later calls raise InvalidStateError. Not collective."""
        self._impl = None
        for name in (
            "_block",
            "_recv_tokens",
            "_recv_weights",
            "_recv_scales",
            "_recv_indices",
            "_recv_src_pos",
            "_total_recv",
        ):
            setattr(self, name, None)
        self._combine_out = {}
