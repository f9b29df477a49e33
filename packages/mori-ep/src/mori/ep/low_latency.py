# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The low-latency kernel types of :class:`~mori.ep.EpDispatchCombineOp`
(``IntraNodeLL``, ``AsyncLL``), the expert-major layout (MORI's standard MoE) and
DeepEP's low-latency entry points, as methods the op inherits.

The protocol (fixed receive slots per source rank, double-buffered areas, a flag
per source carrying the count) is in ``csrc/low_latency_protocol.hpp`` and
``docs/low_latency.md``; this module checks inputs, owns the output tensors and
calls the native implementation.
"""

from __future__ import annotations

from typing import Any

import torch

from mori.core import InvalidStateError, NotSupportedError, shmem

from . import _C

# Token dtype codes posted with dispatch's counts or flags (csrc/protocol.hpp,
# DtypeTagName): every rank compares every rank's.
_ROW_TAGS = {torch.bfloat16: 1, torch.float8_e4m3fn: 2, torch.float16: 3, torch.float32: 4}

_TOKEN_MAJOR, _EXPERT_MAJOR = 0, 1
_FP8 = torch.float8_e4m3fn
_COMBINE_CODES = {torch.bfloat16: 0, torch.float32: 1, torch.float8_e4m3fn: 2}


class LowLatencyHandle(tuple):
    """DeepEP's low-latency handle: ``(src_info, layout_range,
    num_max_dispatch_tokens_per_rank, hidden, num_experts)``, plus what this
    implementation's combine needs (the top-k slot of every expert row)."""

    slot_k: torch.Tensor
    src_info_stride: int

    def __new__(cls, items, slot_k, src_info_stride):
        h = super().__new__(cls, items)
        h.slot_k = slot_k
        h.src_info_stride = src_info_stride
        return h


class LowLatencyEvent:
    """DeepEP's ``EventOverlap`` for ``async_finish``: on CUDA an event recorded after
    the call's kernel, ``current_stream_wait()`` makes the current stream wait for it;
    on CPU the call has finished when it returns (``event`` is None)."""

    def __init__(self, event: Any = None, extra_tensors: tuple | None = None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


class LowLatencyMixin:
    """The low-latency half of EpDispatchCombineOp (see the class docstring there)."""

    # ------------------------------------------------------------------ set-up
    def _init_low_latency(self, shape) -> None:
        c = self.config
        m, k = c.max_num_inp_token_per_rank, c.num_experts_per_token
        # max_total_recv_tokens: P = max_num_tokens_to_recv_per_rank slots per source
        # rank instead of M (MORI's rule); a rank routing more than P tokens to one
        # rank fails the call on every rank.
        cap = c.max_num_tokens_to_recv
        self._ll_layout = _C.ll_buffer_layout(*shape, recv_capacity=cap)
        self._block = shmem.empty((self._ll_layout["total_bytes"],), torch.uint8)
        if self._cuda:
            if not hasattr(_C, "LowLatencyCuda"):
                raise NotSupportedError(
                    f"kernel_type {c.kernel_type.name} has no CUDA kernels in this build; use a "
                    "host heap (the CPU implementation)"
                )
            self._impl = _C.LowLatencyCuda(
                *shape, self._block.data_ptr(), self.device.index, self.timeout_s,
                recv_capacity=cap,
            )  # fmt: skip
        else:
            self._impl = _C.LowLatencyCpu(
                *shape, self._block.data_ptr(), self.timeout_s, recv_capacity=cap
            )
        dev = self.device
        hb = c.hidden_dim * c.max_token_type_size
        # Token-major outputs (valid until the next dispatch), named as the intra-node
        # op names its views so the shared methods (src token pos, expert counts) work.
        self._recv_tokens = torch.empty((cap, hb), dtype=torch.uint8, device=dev)
        self._recv_weights = torch.empty((cap, k), dtype=torch.float32, device=dev)
        self._recv_scales = torch.empty(
            (cap, c.scale_dim * c.scale_type_size), dtype=torch.uint8, device=dev
        )
        self._recv_indices = torch.empty((cap, k), dtype=torch.int32, device=dev)
        self._recv_src_pos = torch.empty((cap,), dtype=torch.int32, device=dev)
        self._total_recv = torch.zeros((1,), dtype=torch.int32, device=dev)
        self._ll_total_recv = 0
        self._combine_out: dict[torch.dtype, torch.Tensor] = {}
        self._combine_out_weights = torch.empty((m, k), dtype=torch.float32, device=dev)
        self._zero_weights = torch.zeros((m, k), dtype=torch.float32, device=dev)
        self._one_weights = torch.ones((m, k), dtype=torch.float32, device=dev)
        self._ll_pre_reduce = bool(self._impl.pre_reduce)
        self._registered_inputs: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self.local_expert_count = torch.zeros(c.num_experts_per_rank, dtype=torch.int32, device=dev)
        # Expert-major outputs: two sets (DeepEP's "at most two results held"),
        # alternating per dispatch; combine outputs likewise.
        self._ll_parity = 0
        self._ll_packed: dict[tuple, dict[str, torch.Tensor]] = {}
        self._ll_combine_parity = 0
        self._ll_combine_bufs: dict[int, torch.Tensor] = {}
        self._ll_next_combine_input: dict[int, torch.Tensor] = {}
        self._ll_pending_dispatch: dict[str, Any] | None = None
        self._ll_pending_combine: dict[str, Any] | None = None
        self._ll_combine_ready = False
        self._ll_combine_layout = _TOKEN_MAJOR
        self._ll_keep: tuple = ()
        self._ll_stdmoe: dict[str, Any] | None = None

    def _ll_stream(self) -> tuple:
        return (self._stream(),) if self._cuda else ()

    def _ll_launch(self, block_num: int, warp_per_block: int) -> tuple:
        return (*self._launch(block_num, warp_per_block), self._stream()) if self._cuda else ()

    def _ll_send_launch(self, fuse: bool, block_num: int, warp_per_block: int) -> tuple:
        """A send's extra arguments on CUDA: whether the receive follows at once (one
        fused kernel), the launch shape and the stream."""
        if not self._cuda:
            return ()
        return (fuse, *self._launch(block_num, warp_per_block), self._stream())

    def _ll_reject_dispatch(self, problem: str):
        self._ll_pending_dispatch = None
        self._ll_combine_ready = False
        self._impl.reject_dispatch(problem, *self._ll_stream())

    def _ll_reject_combine(self, problem: str):
        self._ll_pending_combine = None
        self._ll_combine_ready = False
        self._impl.reject_combine(problem, *self._ll_stream())

    def _ll_require(self, what: str) -> None:
        if not getattr(self, "_ll", False):
            raise NotSupportedError(
                f"{what} needs kernel_type IntraNodeLL or AsyncLL (this op is "
                f"{self.config.kernel_type.name})"
            )

    def _ll_check_order(self, what: str) -> None:
        if self._ll_pending_dispatch is not None:
            raise InvalidStateError(
                f"{what} while a dispatch was sent and not received: call dispatch_recv (or the "
                "receive hook) first"
            )
        if self._ll_pending_combine is not None:
            raise InvalidStateError(
                f"{what} while a combine was sent and not received: call combine_recv (or the "
                "receive hook) first"
            )

    # --------------------------------------------------- token-major (MORI's LL)
    def _ll_dispatch(self, problem, input, weights, scales, indices, block_num, warp_per_block,
                     call_local_expert_count):  # fmt: skip
        self._ll_check_order("dispatch")
        if problem is not None:
            self._ll_reject_dispatch(problem)
        c = self.config
        try:
            input = input.contiguous()
            n = input.size(0)
            weights = self._zero_weights[:n] if weights is None else weights.contiguous()
            if indices.dtype == torch.int64:
                indices = indices.clamp(-(2**31), 2**31 - 1).to(torch.int32)
            indices = indices.contiguous()
            has_scales = c.scale_dim > 0
            if has_scales:
                scales = scales.contiguous()
            row_bytes = c.hidden_dim * input.element_size()
        except (RuntimeError, TypeError, ValueError) as e:
            self._ll_reject_dispatch(f"dispatch inputs could not be prepared: {e}")
        self._ll_keep = (input, weights, scales, indices)
        # Before the send: a send the native side rejects (an expert id, the receive
        # cap) leaves no received dispatch to combine, on this rank as on the others.
        self._ll_combine_ready = False
        with self._fails_on_timeout():
            # The rows' dtype travels in the flags: ranks passing different ones fail
            # the call on every rank (InvalidArgumentError on CPU, a trap on CUDA).
            self._impl.dispatch_send(
                _TOKEN_MAJOR, input.data_ptr(), row_bytes, weights.data_ptr(),
                scales.data_ptr() if has_scales else 0, indices.data_ptr(), n, False, False,
                *self._ll_send_launch(c.kernel_type.name == "IntraNodeLL", block_num,
                                      warp_per_block),
                dtype_tag=_ROW_TAGS[input.dtype],
            )  # fmt: skip
        self._ll_pending_dispatch = dict(
            layout=_TOKEN_MAJOR, block_num=block_num, warp_per_block=warp_per_block,
            count=call_local_expert_count,
        )  # fmt: skip
        self._ll_combine_ready = False
        if c.kernel_type.name == "IntraNodeLL":
            self._ll_dispatch_recv()
        out = self._recv_tokens[:, :row_bytes].view(input.dtype)
        out_scales = self._recv_scales.view(scales.dtype) if has_scales else None
        return out, self._recv_weights, out_scales, self._recv_indices, self._total_recv

    def _ll_dispatch_recv(self) -> None:
        p = self._ll_pending_dispatch
        self._ll_pending_dispatch = None
        launch = self._ll_launch(p["block_num"], p["warp_per_block"])
        with self._fails_on_timeout():
            if p["layout"] == _TOKEN_MAJOR:
                total = self._impl.dispatch_recv_token_major(
                    self._recv_tokens.data_ptr(), self._recv_weights.data_ptr(),
                    self._recv_scales.data_ptr(), self._recv_indices.data_ptr(),
                    self._recv_src_pos.data_ptr(), self._total_recv.data_ptr(), *launch,
                )  # fmt: skip
            else:
                b = p["bufs"]
                total = self._impl.dispatch_recv_expert_major(
                    b["x"].data_ptr(), b["scales"].data_ptr() if "scales" in b else 0,
                    p["ue8m0"], b["count"].data_ptr(), b["src_info"].data_ptr(),
                    p["src_info_stride"], b["layout_range"].data_ptr(), b["slot_k"].data_ptr(),
                    *launch,
                )  # fmt: skip
        if p["layout"] == _TOKEN_MAJOR:
            if not self._cuda:
                self._ll_total_recv = int(total)
            if p["count"]:
                self._count_local_experts()
        self._ll_combine_ready = True
        self._ll_combine_layout = p["layout"]

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
        if self.config.kernel_type.name != "AsyncLL":
            raise NotSupportedError(
                f"dispatch_recv needs kernel_type AsyncLL (this op is {self.config.kernel_type.name})"
            )
        self._impl_or_raise()
        if self._ll_pending_dispatch is None:
            raise InvalidStateError("dispatch_recv needs a pending dispatch_send")
        if call_local_expert_count:
            self._ll_pending_dispatch["count"] = True
        self._ll_dispatch_recv()

    def _ll_combine(self, input, weights, indices, block_num, rdma_block_num, warp_per_block,
                    use_external_inp_buf):  # fmt: skip
        impl = self._impl
        if self._ll_pending_dispatch is not None:
            raise InvalidStateError("combine while a dispatch was sent and not received")
        if self._ll_pending_combine is not None:
            raise InvalidStateError("combine while a combine was sent and not received")
        if not self._ll_combine_ready or self._ll_combine_layout != _TOKEN_MAJOR:
            raise InvalidStateError(
                "combine needs a received dispatch since the last combine (dispatch, or "
                "dispatch_send + dispatch_recv)"
            )
        problem = self._check_combine(
            input, weights, indices, block_num, rdma_block_num, warp_per_block,
            use_external_inp_buf,
        )  # fmt: skip
        if problem is not None:
            self._ll_reject_combine(problem)
        from .dispatch_combine import EpDispatchCombineQuantType

        c = self.config
        n = impl.num_tokens
        fp8_cast = self._quant == EpDispatchCombineQuantType.Fp8DirectCast
        try:
            out = self._combine_out.get(input.dtype)
            if out is None:
                out = torch.empty(
                    (c.max_num_inp_token_per_rank, c.hidden_dim), dtype=input.dtype,
                    device=self.device,
                )  # fmt: skip
                self._combine_out[input.dtype] = out
            out_weights = self._combine_out_weights if weights is not None else None
            if weights is not None:
                weights = weights.contiguous()
            args = (
                input.data_ptr(), input.stride(0) * input.element_size(), input.size(0),
                _COMBINE_CODES[input.dtype], weights.data_ptr() if weights is not None else 0,
                self._recv_src_pos.data_ptr(),
                self._total_recv.data_ptr() if self._cuda else self._ll_total_recv,
                out.data_ptr(), out_weights.data_ptr() if out_weights is not None else 0,
                fp8_cast,
            )  # fmt: skip
        except (RuntimeError, TypeError, ValueError) as e:
            self._ll_reject_combine(f"combine inputs could not be prepared: {e}")
        self._ll_keep = (input, weights)
        self._ll_combine_ready = False
        with self._fails_on_timeout():
            fuse = c.kernel_type.name == "IntraNodeLL"
            impl.combine_send_token_major(
                *args, *self._ll_send_launch(fuse, block_num, warp_per_block)
            )
        self._ll_pending_combine = dict(block_num=block_num, warp_per_block=warp_per_block)
        if c.kernel_type.name == "IntraNodeLL":
            self._ll_combine_recv()
        return out[:n], (out_weights[:n] if out_weights is not None else None)

    def _ll_combine_recv(self) -> None:
        p = self._ll_pending_combine
        self._ll_pending_combine = None
        with self._fails_on_timeout():
            self._impl.combine_recv(*self._ll_launch(p["block_num"], p["warp_per_block"]))

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
        if self.config.kernel_type.name != "AsyncLL":
            raise NotSupportedError(
                f"combine_recv needs kernel_type AsyncLL (this op is {self.config.kernel_type.name})"
            )
        self._impl_or_raise()
        if self._ll_pending_combine is None:
            raise InvalidStateError("combine_recv needs a pending combine_send")
        self._ll_combine_recv()

    # ------------------------------------------------------ expert-major layout
    def _ll_bufs(self, parity: int, dtype: torch.dtype, fp8: bool, ue8m0: bool):
        """The expert-major outputs of one of the two alternating sets."""
        c = self.config
        key = (parity, dtype, fp8, ue8m0)
        b = self._ll_packed.get(key)
        if b is None:
            e, wm, h = (
                c.num_experts_per_rank,
                c.world_size * c.max_num_inp_token_per_rank,
                c.hidden_dim,
            )
            dev = self.device
            b = dict(
                x=torch.empty((e, wm, h), dtype=_FP8 if fp8 else dtype, device=dev),
                count=torch.zeros((e,), dtype=torch.int32, device=dev),
                src_info=torch.zeros((e, wm), dtype=torch.int32, device=dev),
                layout_range=torch.zeros((e, c.world_size), dtype=torch.int64, device=dev),
                slot_k=torch.zeros((e, wm), dtype=torch.int32, device=dev),
            )
            if fp8:
                q = h // 128 // 4 if ue8m0 else h // 128
                st = torch.int32 if ue8m0 else torch.float32
                # DeepEP's layout: [E, W*M, Q] whose last two dims are column-major.
                b["scales"] = torch.zeros((e, q, wm), dtype=st, device=dev).transpose(1, 2)
            self._ll_packed[key] = b
        return b

    def _ll_check_expert_major(self, x, topk_idx, dtypes, what):
        c = self.config
        k = c.num_experts_per_token
        dtype_problem = f"{what} input dtype {{dtype}} must be one of {[str(d) for d in dtypes]}"
        problem = self._tokens_problem(x, "x", dtypes, dtype_problem)
        if problem is not None:
            return problem
        n = x.size(0)
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype not in (
            torch.int32,
            torch.int64,
        ):
            return f"topk_idx must be an int32 or int64 tensor, got {_describe(topk_idx)}"
        if topk_idx.device != self.device:
            return f"topk_idx is on {topk_idx.device}, the op runs on {self.device}"
        if tuple(topk_idx.shape) != (n, k):
            return f"topk_idx must be [{n}, {k}], got shape {tuple(topk_idx.shape)}"
        return self._int64_ids_problem(topk_idx)

    @property
    def standard_moe_pre_reduce(self) -> bool:
        """Whether :meth:`combine_standard_moe` pre-reduces per rank: each rank sums its
        own experts' weighted rows of a token into one fp32 row before sending it back
        (fewer bytes when a token has three or more experts on a rank). Decided at
        construction: on when ``num_experts_per_token >= 2 * world_size``, unless the
        environment sets ``MORI_EP_LL_PRE_REDUCE=0``; every rank must decide alike."""
        self._ll_require("standard_moe_pre_reduce")
        return self._ll_pre_reduce

    def _ll_expert_dispatch(self, x, topk_idx, weights, fp8, round_scale, ue8m0, src_stride,
                            problem, dtypes, what, fuse, unit_weights=False):  # fmt: skip
        self._impl_or_raise()
        self._ll_check_order(what)
        if problem is None:
            problem = self._ll_check_expert_major(x, topk_idx, dtypes, what)
        if problem is not None:
            self._ll_reject_dispatch(problem)
        c = self.config
        try:
            x = x.contiguous()
            idx = topk_idx
            if idx.dtype == torch.int64:
                idx = idx.clamp(-(2**31), 2**31 - 1).to(torch.int32)
            idx = idx.contiguous()
            n = x.size(0)
            if weights is None:  # what a pre-reduced combine weights by: 1 (or unused 0)
                w = (self._one_weights if unit_weights else self._zero_weights)[:n]
            else:
                w = weights.contiguous()
            parity = self._ll_parity
            bufs = self._ll_bufs(parity, x.dtype, fp8, ue8m0)
        except (RuntimeError, TypeError, ValueError) as e:
            self._ll_reject_dispatch(f"dispatch inputs could not be prepared: {e}")
        self._ll_parity ^= 1
        self._ll_keep = (x, idx, w)
        self._ll_combine_ready = False  # before the send (as in _ll_dispatch)
        with self._fails_on_timeout():
            self._impl.dispatch_send(
                _EXPERT_MAJOR, x.data_ptr(), c.hidden_dim * x.element_size(), w.data_ptr(), 0,
                idx.data_ptr(), n, fp8, round_scale, *self._ll_send_launch(fuse, -1, -1),
            )  # fmt: skip
        self._ll_pending_dispatch = dict(
            layout=_EXPERT_MAJOR, bufs=bufs, ue8m0=ue8m0, src_info_stride=src_stride,
            block_num=-1, warp_per_block=-1, count=False,
        )  # fmt: skip
        self._ll_combine_ready = False
        return bufs

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
        self._ll_require("low_latency_dispatch")
        self._ll_stdmoe = None  # combine_standard_moe combines a dispatch_standard_moe only
        c = self.config
        problem = None
        if num_max_dispatch_tokens_per_rank != c.max_num_inp_token_per_rank:
            problem = (
                f"num_max_dispatch_tokens_per_rank {num_max_dispatch_tokens_per_rank} differs "
                f"from the op's max_num_inp_token_per_rank {c.max_num_inp_token_per_rank}"
            )
        elif num_experts != c.num_experts:
            problem = f"num_experts {num_experts} differs from the op's {c.num_experts}"
        elif dispatch_wait_recv_cost_stats is not None:
            problem = "dispatch_wait_recv_cost_stats is not implemented (pass None)"
        elif use_ue8m0 and not round_scale:
            problem = "use_ue8m0 needs round_scale=True (DeepEP's rule)"
        elif use_fp8 and c.hidden_dim % (512 if use_ue8m0 else 128):
            problem = (
                f"hidden_dim {c.hidden_dim} must be a multiple of {512 if use_ue8m0 else 128} "
                "for the fp8 cast"
            )
        elif cumulative_local_expert_recv_stats is not None and (
            not isinstance(cumulative_local_expert_recv_stats, torch.Tensor)
            or cumulative_local_expert_recv_stats.dtype != torch.int32
            or tuple(cumulative_local_expert_recv_stats.shape) != (c.num_experts_per_rank,)
        ):
            problem = (
                f"cumulative_local_expert_recv_stats must be int32 [{c.num_experts_per_rank}], got "
                f"{_describe(cumulative_local_expert_recv_stats)}"
            )
        bufs = self._ll_expert_dispatch(
            x, topk_idx, None, bool(use_fp8), bool(round_scale), bool(use_ue8m0), 0, problem,
            (torch.bfloat16,), "low_latency_dispatch", not return_recv_hook,
        )  # fmt: skip
        handle = LowLatencyHandle(
            (bufs["src_info"], bufs["layout_range"], c.max_num_inp_token_per_rank, c.hidden_dim,
             c.num_experts),
            bufs["slot_k"], 0,
        )  # fmt: skip

        def receive():
            self._ll_dispatch_recv()
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats.add_(bufs["count"])

        hook = None
        if return_recv_hook:
            hook = receive
        else:
            receive()
        event = self._ll_event(async_finish)
        recv_x = (bufs["x"], bufs["scales"]) if use_fp8 else bufs["x"]
        return recv_x, bufs["count"], handle, event, hook

    def _ll_event(self, async_finish: bool) -> LowLatencyEvent:
        if async_finish and self._cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            return LowLatencyEvent(ev)
        return LowLatencyEvent()

    def _ll_expert_combine(self, x, topk_idx, topk_weights, handle, out, what, fuse,
                           pre_reduce=False):  # fmt: skip
        self._impl_or_raise()
        self._ll_check_order(what)
        c = self.config
        k = c.num_experts_per_token
        e, wm = c.num_experts_per_rank, c.world_size * c.max_num_inp_token_per_rank
        problem = None
        if not self._ll_combine_ready or self._ll_combine_layout != _EXPERT_MAJOR:
            raise InvalidStateError(
                f"{what} needs a received expert-major dispatch since the last combine"
            )
        if not isinstance(handle, LowLatencyHandle):
            problem = (
                f"handle must be the one low_latency_dispatch returned, got {_describe(handle)}"
            )
        elif not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
            problem = f"x must be a bf16 tensor, got {_describe(x)}"
        elif x.device != self.device:
            problem = f"x is on {x.device}, the op runs on {self.device}"
        elif (
            tuple(x.shape) != (e, wm, c.hidden_dim)
            or x.stride(2) != 1
            or x.stride(0) != wm * x.stride(1)
        ):
            problem = (
                f"x must be a row-contiguous [{e}, {wm}, {c.hidden_dim}] tensor, got shape "
                f"{tuple(x.shape)}"
            )
        elif not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype not in (
            torch.int32,
            torch.int64,
        ):
            problem = f"topk_idx must be an int32 or int64 tensor, got {_describe(topk_idx)}"
        elif tuple(topk_idx.shape) != (self._impl.num_tokens, k):
            problem = (
                f"topk_idx must be this rank's [{self._impl.num_tokens}, {k}] routing of the "
                f"dispatch, got shape {tuple(topk_idx.shape)}"
            )
        elif topk_weights is not None and (
            not isinstance(topk_weights, torch.Tensor)
            or topk_weights.dtype != torch.float32
            or tuple(topk_weights.shape) != tuple(topk_idx.shape)
        ):
            problem = (
                f"topk_weights must be float32 [{self._impl.num_tokens}, {k}], got "
                f"{_describe(topk_weights)}"
            )
        elif out is not None and (
            not isinstance(out, torch.Tensor)
            or out.dtype != torch.bfloat16
            or tuple(out.shape) != (topk_idx.size(0), c.hidden_dim)
            or not out.is_contiguous()
        ):
            problem = f"out must be a contiguous bf16 [{topk_idx.size(0)}, {c.hidden_dim}], got {_describe(out)}"
        if problem is not None:
            self._ll_reject_combine(problem)
        n = topk_idx.size(0)
        try:
            idx = topk_idx
            if idx.dtype == torch.int64:
                idx = idx.clamp(-(2**31), 2**31 - 1).to(torch.int32)
            idx = idx.contiguous()
            w = topk_weights.contiguous() if topk_weights is not None else None
            if out is None:
                parity = self._ll_combine_parity
                buf = self._ll_combine_bufs.get(parity)
                if buf is None:
                    buf = torch.empty(
                        (c.max_num_inp_token_per_rank, c.hidden_dim), dtype=torch.bfloat16,
                        device=self.device,
                    )  # fmt: skip
                    self._ll_combine_bufs[parity] = buf
                self._ll_combine_parity ^= 1
                out = buf[:n]
        except (RuntimeError, TypeError, ValueError) as err:
            self._ll_reject_combine(f"combine inputs could not be prepared: {err}")
        src_info, layout_range = handle[0], handle[1]
        self._ll_keep = (x, idx, w, out, handle)
        self._ll_combine_ready = False
        with self._fails_on_timeout():
            self._impl.combine_send_expert_major(
                x.data_ptr(), x.stride(1) * 2, src_info.data_ptr(), handle.src_info_stride,
                layout_range.data_ptr(), handle.slot_k.data_ptr(), idx.data_ptr(),
                w.data_ptr() if w is not None else 0, n, out.data_ptr(),
                *self._ll_send_launch(fuse, -1, -1), pre_reduce=pre_reduce,
            )  # fmt: skip
        self._ll_pending_combine = dict(block_num=-1, warp_per_block=-1)
        return out

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
            handle: from :meth:`low_latency_dispatch` (the latest one).
            use_logfmt, combine_wait_recv_cost_stats: not implemented.
            async_finish, return_recv_hook: as in low_latency_dispatch.
            out: a bf16 ``[num_tokens, hidden]`` tensor to write into.

        Returns:
            ``(combined_x, event, hook)``; ``combined_x`` bf16 ``[num_tokens, hidden]``,
            valid after the hook when ``return_recv_hook``.
        """
        self._ll_require("low_latency_combine")
        if use_logfmt:
            raise NotSupportedError("use_logfmt (DeepEP's LogFMT combine) is not implemented")
        if combine_wait_recv_cost_stats is not None:
            raise NotSupportedError("combine_wait_recv_cost_stats is not implemented (pass None)")
        if zero_copy:
            x = self._ll_next_combine_input.get(self._ll_combine_parity, x)
        res = self._ll_expert_combine(
            x, topk_idx, topk_weights, handle, out, "low_latency_combine", not return_recv_hook
        )
        hook = None
        if return_recv_hook:
            hook = self._ll_combine_recv
        else:
            self._ll_combine_recv()
        return res, self._ll_event(async_finish), hook

    def get_next_low_latency_combine_buffer(self, handle: object) -> torch.Tensor:
        """DeepEP's zero-copy combine input: a bf16 ``[E, W*M, hidden]`` tensor for the
        experts to write into; ``low_latency_combine(..., zero_copy=True)`` then reads
        it in place (the combine reads its input in place either way, so this saves
        the copy only in DeepEP's sense)."""
        self._ll_require("get_next_low_latency_combine_buffer")
        del handle
        c = self.config
        p = self._ll_combine_parity
        buf = self._ll_next_combine_input.get(p)
        if buf is None:
            buf = torch.zeros(
                (c.num_experts_per_rank, c.world_size * c.max_num_inp_token_per_rank, c.hidden_dim),
                dtype=torch.bfloat16, device=self.device,
            )  # fmt: skip
            self._ll_next_combine_input[p] = buf
        return buf

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
        self._ll_require("dispatch_standard_moe")
        c = self.config
        problem = None
        if weights is not None and (
            not isinstance(weights, torch.Tensor)
            or weights.dtype != torch.float32
            or not isinstance(input, torch.Tensor)
            or tuple(weights.shape) != (input.size(0), c.num_experts_per_token)
        ):
            problem = f"weights must be float32 [num_tokens, {c.num_experts_per_token}] or None, got {_describe(weights)}"
        elif scales is not None and (not isinstance(scales, torch.Tensor) or scales.numel()):
            problem = "dispatch_standard_moe carries no scales (pass None)"
        self._ll_stdmoe = None
        bufs = self._ll_expert_dispatch(
            input, indices, weights, False, False, False, c.max_num_tokens_to_send, problem,
            (torch.bfloat16, torch.float16, torch.float32, _FP8), "dispatch_standard_moe", True,
            unit_weights=True,
        )  # fmt: skip
        self._ll_dispatch_recv()
        n = input.size(0)
        w = weights.contiguous() if weights is not None else None
        self._ll_stdmoe = dict(
            handle=LowLatencyHandle(
                (bufs["src_info"], bufs["layout_range"], c.max_num_inp_token_per_rank,
                 c.hidden_dim, c.num_experts),
                bufs["slot_k"], c.max_num_tokens_to_send,
            ),
            weights=w, indices=self._ll_keep[1], n=n,
        )  # fmt: skip
        return bufs["x"], bufs["count"], bufs["src_info"], bufs["layout_range"]

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
        self._ll_require("combine_standard_moe")
        del weights, block_num, rdma_block_num, warp_per_block, call_reset
        s = self._ll_stdmoe
        if s is None:
            raise InvalidStateError("combine_standard_moe needs a dispatch_standard_moe first")
        pre = self._ll_pre_reduce
        out = self._ll_expert_combine(
            input, indices, None if pre else s["weights"], s["handle"], None,
            "combine_standard_moe", True, pre_reduce=pre,
        )  # fmt: skip
        self._ll_combine_recv()
        self._ll_stdmoe = None
        return out, None

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
        c = self.config
        e, wm, k = (
            c.num_experts_per_rank,
            c.world_size * c.max_num_inp_token_per_rank,
            c.num_experts_per_token,
        )
        total = int(self._total_recv.item())
        idx = dispatch_out_topk_idx[:total].to(torch.int64)
        lo = c.rank * e
        local = (idx >= lo) & (idx < lo + e)
        rows, slots = local.nonzero(as_tuple=True)  # row-major: dispatch row, then slot
        experts = idx[rows, slots] - lo
        order = torch.sort(experts, stable=True).indices
        rows, slots, experts = rows[order], slots[order], experts[order]
        count = torch.bincount(experts, minlength=e).to(torch.int32)
        starts = torch.cumsum(count.to(torch.int64), 0) - count.to(torch.int64)
        pos = torch.arange(rows.numel(), device=idx.device) - starts[experts]
        x = torch.zeros((e, wm, c.hidden_dim), dtype=dispatch_out_x.dtype, device=self.device)
        x[experts, pos] = dispatch_out_x[rows]
        flat = self.get_dispatch_src_token_pos().to(torch.int64)
        src_info = torch.zeros((e, wm), dtype=torch.int32, device=self.device)
        src_info[experts, pos] = flat[rows].to(torch.int32)
        src_rank = flat[rows] // c.max_num_tokens_to_send
        per = torch.zeros((e, c.world_size), dtype=torch.int64, device=self.device)
        per.index_put_((experts, src_rank), torch.ones_like(src_rank), accumulate=True)
        begin = torch.cumsum(per, 1) - per
        layout_range = (begin << 32) | per
        self._ll_convert = (rows, slots, experts, pos, total)
        del k
        return x, count, src_info, layout_range

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
        conv = getattr(self, "_ll_convert", None)
        if conv is None:
            raise InvalidStateError("convert_combine_input needs a convert_dispatch_output first")
        rows, slots, experts, pos, total = conv
        c = self.config
        acc = torch.zeros(
            (c.max_num_tokens_to_recv, c.hidden_dim), dtype=torch.float32, device=self.device
        )
        w = self._recv_weights[rows, slots]
        y = packed_recv_x[experts, pos].float() * w[:, None]
        for kk in range(c.num_experts_per_token):  # ascending k: a fixed order
            sel = slots == kk
            acc.index_add_(0, rows[sel], y[sel])
        del total
        return acc.to(packed_recv_x.dtype)


__all__ = ["LowLatencyEvent", "LowLatencyHandle", "LowLatencyMixin"]
