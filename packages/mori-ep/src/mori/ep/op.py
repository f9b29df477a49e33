# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MoE dispatch/combine with MORI's API (``mori.ops`` there, ``mori.ep`` here):
:class:`EpDispatchCombineOp`.

The op is MORI's public surface and nothing else: it checks the heap and the
config, then hands every call to one strategy object per mode (its ``_mode``):
:class:`~mori.ep.intranode.IntraNodeMode` for ``IntraNode``,
:class:`~mori.ep.low_latency.LowLatencyMode` for ``IntraNodeLL`` and ``AsyncLL``
(which also serves the expert-major and DeepEP-style calls),
:class:`~mori.ep.internode.InterNodeMode` for ``InterNode``, ``InterNodeV1`` and
``InterNodeV1LL`` (host heaps). A new mode is a new
strategy module; the op only learns which kernel types it serves.
"""

from __future__ import annotations

from typing import Any

import torch

from mori.core import InvalidArgumentError, InvalidStateError, NotSupportedError, shmem, timeouts

from .config import (
    EpDispatchCombineConfig,
    EpDispatchCombineKernelType,
    same_config_everywhere,
)
from .internode import InterNodeMode
from .intranode import IntraNodeMode
from .low_latency import LowLatencyMode
from .placement import placement_for

# The mode (strategy class) serving each implemented kernel type; the others raise
# NotSupportedError naming these.
_MODES = {
    EpDispatchCombineKernelType.IntraNode: IntraNodeMode,
    EpDispatchCombineKernelType.IntraNodeLL: LowLatencyMode,
    EpDispatchCombineKernelType.AsyncLL: LowLatencyMode,
    EpDispatchCombineKernelType.InterNode: InterNodeMode,
    EpDispatchCombineKernelType.InterNodeV1: InterNodeMode,
    EpDispatchCombineKernelType.InterNodeV1LL: InterNodeMode,
}


class EpDispatchCombineOp:
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
    arrives makes the others raise MoriTimeoutError after ``timeout_s``, naming that
    rank and the stage it did not reach (on CUDA their kernels print the same and
    trap); the op is then unusable (later calls raise InvalidStateError: create a new
    one). ``timeout_s`` is in seconds: ``inf`` or anything above a year means
    "practically forever" (a year); 0, negative values and NaN raise
    InvalidArgumentError naming the value (``mori.core.timeouts``). An input
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
        if config.kernel_type not in _MODES:
            raise NotSupportedError(
                f"kernel_type {config.kernel_type.name} is not implemented (implemented: "
                f"{[k.name for k in _MODES]})"
            )
        timeout_s = timeouts.seconds(timeout_s, "timeout_s")
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
        place = placement_for(config)
        self.config = config
        self.device = place.device
        self.timeout_s = timeout_s
        # Compared before the mode allocates its block, whose size may differ with the
        # configs; kept with the op (symmetric allocations are freed in the same order
        # on every rank).
        self._config_table = same_config_everywhere(config)
        # MORI's attribute: fp8_blockwise's scale blocks per combine row (0 otherwise).
        self._fp8_blockwise_combine_scale_dim = config.combine_scale_dim
        self._mode = _MODES[config.kernel_type](config, place, self.timeout_s)
        self.local_expert_count = self._mode.local_expert_count
        """int32 ``[num_experts_per_rank]``: after a dispatch with
        ``call_local_expert_count=True``, how many (received token, slot) pairs name
        each of this rank's experts (MORI's attribute; updated in place)."""

    @property
    def _impl(self):
        """The native implementation (the bench reads its timeline, tests its settings)."""
        return self._mode.impl

    @property
    def _ll_layout(self) -> dict[str, int]:
        """The low-latency block's region offsets (``_C.ll_buffer_layout``)."""
        return self._low_latency("_ll_layout").layout

    def _low_latency(self, what: str) -> LowLatencyMode:
        if not isinstance(self._mode, LowLatencyMode):
            raise NotSupportedError(
                f"{what} needs kernel_type IntraNodeLL or AsyncLL (this op is "
                f"{self.config.kernel_type.name})"
            )
        return self._mode

    def _async_ll(self, what: str) -> LowLatencyMode:
        if self.config.kernel_type != EpDispatchCombineKernelType.AsyncLL:
            raise NotSupportedError(
                f"{what} needs kernel_type AsyncLL (this op is {self.config.kernel_type.name})"
            )
        return self._mode

    # ------------------------------------------------------------------ dispatch
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
                fp16, fp32 or packed fp4 (``torch.float4_e2m1fn_x2``: ``hidden_dim``
                bytes of two e2m1 values each, moved bit for bit; scales, if any, in
                ``scales`` as for fp8) with element size <= ``max_token_type_size``;
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
        return self._mode.dispatch(
            input, weights, scales, indices, block_num, rdma_block_num, warp_per_block,
            call_local_expert_count, routing, return_routing,
        )  # fmt: skip

    def dispatch_send(
        self,
        input: torch.Tensor,
        weights: torch.Tensor | None,
        scales: torch.Tensor | None,
        indices: torch.Tensor,
        block_num: int = -1,
        warp_per_block: int = -1,
        call_local_expert_count: bool = False,
    ):
        """MORI's first half of an AsyncLL dispatch: writes every token into its
        destinations' receive slots and returns without waiting for the peers; the
        outputs (those of :meth:`dispatch`) hold data once :meth:`dispatch_recv` has
        run. Other kernel types run the whole dispatch (MORI's behaviour)."""
        return self.dispatch(
            input, weights, scales, indices, block_num, -1, warp_per_block,
            call_local_expert_count,
        )  # fmt: skip

    def dispatch_recv(
        self, block_num: int = -1, warp_per_block: int = -1, call_local_expert_count: bool = False
    ) -> None:
        """MORI's second half of an AsyncLL dispatch: waits for every rank's tokens of
        the pending :meth:`dispatch_send` and lays them out in its outputs (and, with
        ``call_local_expert_count``, counts them per local expert).

        Raises:
            NotSupportedError: the op's kernel type is not AsyncLL.
            InvalidStateError: no dispatch_send is pending.
            InvalidArgumentError: a rank rejected its inputs in that call.
            MoriTimeoutError: a rank did not send within ``timeout_s``."""
        del block_num, warp_per_block
        self._async_ll("dispatch_recv").dispatch_recv(call_local_expert_count)

    # ------------------------------------------------------------------- combine
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
            input: bf16, fp32, fp8 e4m3 or (host heaps) packed fp4
                (``torch.float4_e2m1fn_x2``: each e2m1 value summed in fp32 and rounded
                to nearest even, saturating at +-6, as MORI's combine) ``[rows, hidden_dim]``,
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
            With ``quant_type="fp8_blockwise"`` every returned row is
            quantized per block to fp8 e4m3 with an fp32 scale per block and
            dequantized before the sum (README, Semantics; on CUDA the rows cross
            NVLink as fp8 blocks and scales, this rank's own part quantized likewise).
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
        return self._mode.combine(
            input, weights, indices, block_num, rdma_block_num, warp_per_block,
            use_external_inp_buf, routing,
        )  # fmt: skip

    def combine_send(
        self,
        input: torch.Tensor,
        weights: torch.Tensor | None,
        indices: torch.Tensor | None,
        block_num: int = -1,
        warp_per_block: int = -1,
    ):
        """MORI's first half of an AsyncLL combine: returns every received row to its
        source rank's slot without waiting; the outputs (those of :meth:`combine`)
        hold the sums once :meth:`combine_recv` has run. Other kernel types run the
        whole combine."""
        return self.combine(input, weights, indices, block_num, -1, warp_per_block)

    def combine_recv(self, block_num: int = -1, warp_per_block: int = -1) -> None:
        """MORI's second half of an AsyncLL combine: waits for every rank's rows of the
        pending :meth:`combine_send` and reduces them into its outputs.

        Raises:
            NotSupportedError: the op's kernel type is not AsyncLL.
            InvalidStateError: no combine_send is pending.
            InvalidArgumentError: a rank rejected its combine inputs in that call.
            MoriTimeoutError: a rank did not send within ``timeout_s``."""
        del block_num, warp_per_block
        self._async_ll("combine_recv").combine_recv()

    def get_registered_combine_input_buffer(
        self, dtype: torch.dtype, hidden_dim: int = -1
    ) -> torch.Tensor:
        """A ``[max_num_tokens_to_recv, hidden_dim]`` buffer of ``dtype`` on the op's
        device (``hidden_dim`` <= 0: the config's) for experts to write their outputs
        into and pass to :meth:`combine` as ``input`` (MORI's zero-copy combine input).
        Combine reads its input in place wherever it lies, so this saves the copy
        only in the sense MORI means; the same buffer is returned for the same
        arguments."""
        return self._mode.registered_combine_input(dtype, hidden_dim)

    # --------------------------------------------- DeepEP's low-latency entry points
    def low_latency_dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats: torch.Tensor | None = None,
        dispatch_wait_recv_cost_stats: torch.Tensor | None = None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ):
        """DeepEP's low-latency dispatch into the expert-major layout.

        Args:
            x: bf16 ``[num_tokens, hidden_dim]``, ``num_tokens <= max_num_inp_token_per_rank``.
            topk_idx: int64/int32 ``[num_tokens, num_experts_per_token]`` global expert ids,
                ``-1`` for none; the ids of one token must be distinct.
            num_max_dispatch_tokens_per_rank: must equal the config's
                ``max_num_inp_token_per_rank`` (M); num_experts the config's.
            cumulative_local_expert_recv_stats: int32 ``[num_local_experts]`` or None;
                the received rows per expert are added to it.
            dispatch_wait_recv_cost_stats: not implemented (must be None).
            use_fp8: cast on the sender to e4m3 with an fp32 scale per 128 columns
                (amax floored at 1e-4, scale 448 / amax); round_scale: power-of-two
                scales; use_ue8m0 (needs round_scale): the scales as packed exponents.
            async_finish: return a :class:`LowLatencyEvent` to wait on.
            return_recv_hook: only send; the returned hook receives (call it before
                reading the outputs).

        Returns:
            ``(recv_x, recv_count, handle, event, hook)``: ``recv_x`` is bf16 ``[E, W*M,
            hidden]`` (E local experts, W ranks), or with use_fp8 ``(e4m3 [E, W*M, hidden],
            scales)`` where scales are fp32 ``[E, W*M, hidden // 128]`` (int32 ``[E, W*M,
            hidden // 512]`` with use_ue8m0), column-major in the last two dims;
            ``recv_count`` int32 ``[E]``; rows ``[0, recv_count[e])`` (at most W*P with
            ``max_total_recv_tokens``, P = ``max_num_tokens_to_recv_per_rank``) of expert e are
            valid, ordered by source rank, then source token; ``handle[0]`` (src_info,
            int32 ``[E, W*M]``) holds each row's source token index and ``handle[1]``
            (int64 ``[E, W]``) ``begin << 32 | count`` of each source rank's rows. Two
            sets of outputs alternate: a result stays valid until the dispatch after next.
        """
        return self._low_latency("low_latency_dispatch").low_latency_dispatch(
            x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
            cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats, use_fp8,
            round_scale, use_ue8m0, async_finish, return_recv_hook,
        )  # fmt: skip

    def low_latency_combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: tuple,
        use_logfmt: bool = False,
        zero_copy: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
        out: torch.Tensor | None = None,
        combine_wait_recv_cost_stats: torch.Tensor | None = None,
    ):
        """DeepEP's low-latency combine: every expert row goes back to its source
        token, which computes ``sum over k (ascending) of topk_weights[t, k] * y[t, k]``
        over its valid slots, fp32 products and sums (no fused multiply-add), one
        rounding to bf16 (zeros for a token with no expert).

        Args:
            x: bf16 ``[E, W*M, hidden]``, rows in the layout of ``handle``'s dispatch
                (the experts' outputs); with ``zero_copy`` the buffer of
                :meth:`get_next_low_latency_combine_buffer` is read instead.
            topk_idx: this rank's ``[num_tokens, k]`` routing of that dispatch.
            topk_weights: fp32 ``[num_tokens, k]``.
            handle: from :meth:`low_latency_dispatch`, the op's latest dispatch: the
                handle of an earlier dispatch or of another op fails the call on every
                rank (InvalidArgumentError naming the handle's dispatch and the latest).
            use_logfmt, combine_wait_recv_cost_stats: not implemented.
            async_finish, return_recv_hook: as in low_latency_dispatch.
            out: a bf16 ``[num_tokens, hidden]`` tensor to write into.

        Returns:
            ``(combined_x, event, hook)``; ``combined_x`` bf16 ``[num_tokens, hidden]``,
            valid after the hook when ``return_recv_hook``.
        """
        mode = self._low_latency("low_latency_combine")
        if use_logfmt:
            raise NotSupportedError("use_logfmt (DeepEP's LogFMT combine) is not implemented")
        if combine_wait_recv_cost_stats is not None:
            raise NotSupportedError("combine_wait_recv_cost_stats is not implemented (pass None)")
        return mode.low_latency_combine(
            x, topk_idx, topk_weights, handle, zero_copy, async_finish, return_recv_hook, out
        )

    def get_next_low_latency_combine_buffer(self, handle: object) -> torch.Tensor:
        """DeepEP's zero-copy combine input: a bf16 ``[E, W*M, hidden]`` tensor for the
        experts to write into; ``low_latency_combine(..., zero_copy=True)`` then reads
        it in place (the combine reads its input in place either way, so this saves
        the copy only in DeepEP's sense)."""
        del handle
        mode = self._low_latency("get_next_low_latency_combine_buffer")
        return mode.next_low_latency_combine_buffer()

    # ------------------------------------------------ MORI's standard-MoE layout
    def dispatch_standard_moe(
        self,
        input: torch.Tensor,
        weights: torch.Tensor | None,
        scales: torch.Tensor | None,
        indices: torch.Tensor,
        block_num: int = -1,
        rdma_block_num: int = -1,
        warp_per_block: int = -1,
    ):
        """MORI's standard-MoE dispatch: the received tokens expanded into the
        expert-major layout.

        Args: as :meth:`dispatch` (scales must be None: the layout carries the token
            rows only, as MORI's).

        Returns:
            ``(packed_recv_x [E, W*M, hidden] in input's dtype, packed_recv_count int32
            [E], packed_recv_src_info int32 [E, W*M], packed_recv_layout_range int64
            [E, W])``: rows ``[0, count[e])`` of expert e valid, ordered by source rank,
            then source token; src_info holds MORI's flat send index ``src_rank *
            max_num_tokens_to_send() + src_token``; layout_range ``begin << 32 | count``
            per source rank (MORI returns an empty tensor there).
        """
        mode = self._low_latency("dispatch_standard_moe")
        return mode.dispatch_standard_moe(input, weights, scales, indices)

    def combine_standard_moe(
        self,
        input: torch.Tensor,
        weights: torch.Tensor | None,
        indices: torch.Tensor,
        block_num: int = -1,
        rdma_block_num: int = -1,
        warp_per_block: int = -1,
        call_reset: bool = False,
    ):
        """MORI's standard-MoE combine: ``input`` bf16 ``[E, W*M, hidden]`` in the layout
        of the last :meth:`dispatch_standard_moe`; returns ``(out [num_tokens, hidden]
        bf16, None)`` with ``out[t]`` the sum of ``w[t, k] * y[t, k]`` over the token's
        valid slots, w the weights given to that dispatch (1 where it had None), fp32
        products and sums from -0.0, one rounding to bf16 (zeros for a token with no
        expert). The order: with :attr:`standard_moe_pre_reduce`, per rank d ascending
        the partial ``sum over d's slots k ascending`` (computed on d, sent as fp32),
        else over k ascending. ``weights`` is accepted for MORI's signature;
        ``indices`` must be this rank's ``[num_tokens, k]`` routing."""
        mode = self._low_latency("combine_standard_moe")
        del weights, block_num, rdma_block_num, warp_per_block, call_reset
        return mode.combine_standard_moe(input, indices)

    @property
    def standard_moe_pre_reduce(self) -> bool:
        """Whether :meth:`combine_standard_moe` pre-reduces per rank: each rank sums its
        own experts' weighted rows of a token into one fp32 row before sending it back
        (fewer bytes when a token has three or more experts on a rank). Decided at
        construction: on when ``num_experts_per_token >= 2 * world_size``, unless the
        environment sets ``MORI_EP_LL_PRE_REDUCE=0``; every rank must decide alike."""
        return self._low_latency("standard_moe_pre_reduce").pre_reduce

    # ------------------------------------------------------ local conversions
    def convert_dispatch_output(
        self,
        dispatch_out_x: torch.Tensor,
        dispatch_out_topk_idx: torch.Tensor,
        block_num: int = -1,
        warp_per_block: int = -1,
    ):
        """MORI's conversion of a token-major dispatch output (rows ``[0, total_recv)``)
        into the expert-major layout, on this rank alone: returns ``(packed_recv_x [E,
        W*M, hidden], packed_recv_count int32 [E], packed_recv_src_info int32 [E, W*M]
        (MORI's flat send index), packed_recv_layout_range int64 [E, W])``; the rows of
        expert e are ordered by dispatch row (so by source rank, then token). Reads
        total_recv (a synchronisation on CUDA). :meth:`convert_combine_input` inverts it."""
        del block_num, warp_per_block
        return self._mode.convert_dispatch_output(dispatch_out_x, dispatch_out_topk_idx)

    def convert_combine_input(
        self,
        packed_recv_x: torch.Tensor,
        packed_recv_src_info: torch.Tensor,
        packed_recv_layout_range: torch.Tensor,
        block_num: int = -1,
        warp_per_block: int = -1,
    ) -> torch.Tensor:
        """MORI's inverse of :meth:`convert_dispatch_output`: a token-major combine
        input ``[max_num_tokens_to_recv, hidden]`` whose row i is ``sum over k
        (ascending) of w[i, k] * y[i, k]`` over the local experts of dispatch row i,
        w the received weights, fp32, one rounding to ``packed_recv_x``'s dtype (rows
        past total_recv are zeros)."""
        del packed_recv_src_info, packed_recv_layout_range, block_num, warp_per_block
        return self._mode.convert_combine_input(packed_recv_x)

    # --------------------------------------------------------------- queries
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

    def get_dispatch_src_token_pos(self) -> torch.Tensor:
        """``[total_recv]`` flat send indices, one per received row of the last
        dispatch: ``src_rank * max_num_tokens_to_send() + src_token_index`` (MORI's
        encoding, stride ``world_size * max_num_inp_token_per_rank``; decode with
        :meth:`decode_send_flat_idx`). int32, or int64 when ``world_size**2 *
        max_num_inp_token_per_rank`` does not fit in int32. A new tensor on the op's
        device. On CUDA this reads total_recv, so it synchronises the stream."""
        return self._mode.dispatch_src_token_pos()

    def reset(self) -> None:
        """MORI's reset between iterations; a no-op (every call carries its epoch)."""

    def close(self) -> None:
        """Drop the op's buffers (they are freed once no returned view holds them);
        later calls raise InvalidStateError. Not collective."""
        self._mode.close()
        self._config_table = None


__all__ = ["EpDispatchCombineOp"]
