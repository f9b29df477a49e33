# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The low-latency modes of :class:`~mori.ep.EpDispatchCombineOp` (``IntraNodeLL``,
``AsyncLL``): MORI's token-major calls, the expert-major layout (MORI's standard MoE)
and DeepEP's low-latency entry points, all served by :class:`LowLatencyMode`.

The protocol (fixed receive slots per source rank, double-buffered areas, a flag
per source carrying the count) is in ``csrc/low_latency_protocol.hpp`` and
``docs/low_latency.md``; this module checks inputs, owns the output tensors and
calls the native implementation (``LowLatencyCpu`` on a host heap,
``LowLatencyCuda`` on a CUDA heap, one signature).
"""

from __future__ import annotations

from typing import Any

import torch

from mori.core import InvalidStateError, NotSupportedError, shmem

from . import checks
from ._C import LowLatencyCpu, ll_buffer_layout
from .config import EpDispatchCombineQuantType
from .mode import Mode, narrow_ids

try:  # a build with CUDA
    from ._C import LowLatencyCuda
except ImportError:
    LowLatencyCuda = None

_TOKEN_MAJOR, _EXPERT_MAJOR = 0, 1
_FP8 = torch.float8_e4m3fn


class LowLatencyHandle(tuple):
    """DeepEP's low-latency handle: ``(src_info, layout_range,
    num_max_dispatch_tokens_per_rank, hidden, num_experts)``, plus what this
    implementation's combine needs (the top-k slot of every expert row) and which
    dispatch it belongs to: ``dispatch_seq``, the op's count of dispatches when it made
    this one (1 for its first). A combine takes the handle of the op's latest dispatch
    only; any other (an earlier dispatch's, whose rows the two alternating output sets
    or the next dispatches have overwritten, or another op's) is refused, naming both.

    Under CUDA graphs the check runs when the combine is captured: a graph replays its
    kernels in captured order, so a dispatch and the combine of its handle captured
    together stay matched on every replay (each replay's dispatch rewrites the handle's
    tensors before its combine reads them). A combine captured with the handle of a
    dispatch that ran outside any capture would read, on each replay, whatever dispatch
    last wrote that output set: it is refused (InvalidStateError) when captured."""

    slot_k: torch.Tensor
    src_info_stride: int
    dispatch_seq: int
    op_id: int
    captured: bool

    def __new__(cls, items, slot_k, src_info_stride, dispatch_seq=0, op_id=0, captured=False):
        h = super().__new__(cls, items)
        h.slot_k = slot_k
        h.src_info_stride = src_info_stride
        h.dispatch_seq = dispatch_seq
        h.op_id = op_id
        h.captured = captured  # made while a CUDA graph was being captured
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


class LowLatencyMode(Mode):
    """The strategy behind an ``IntraNodeLL`` / ``AsyncLL`` op (the public contract
    is :class:`~mori.ep.EpDispatchCombineOp`'s). ``IntraNodeLL`` receives within the
    call that sends (on CUDA one fused kernel); ``AsyncLL`` leaves the receive to
    ``dispatch_recv`` / ``combine_recv``; the expert-major calls take a receive hook."""

    def __init__(self, config, place, timeout_s: float) -> None:
        super().__init__(config, place, timeout_s)
        c = config
        m, k = c.max_num_inp_token_per_rank, c.num_experts_per_token
        # max_total_recv_tokens: P = max_num_tokens_to_recv_per_rank slots per source
        # rank instead of M (MORI's rule); a rank routing more than P tokens to one
        # rank fails the call on every rank.
        cap = c.max_num_tokens_to_recv
        self.layout = ll_buffer_layout(*self.shape, recv_capacity=cap)
        self.block = shmem.empty((self.layout["total_bytes"],), torch.uint8)
        self.impl = self.native(LowLatencyCpu, LowLatencyCuda, f"kernel_type {c.kernel_type.name}")
        self.fused = c.kernel_type.name == "IntraNodeLL"  # the receive follows the send at once
        dev = self.device
        hb = c.hidden_dim * c.max_token_type_size
        # Token-major outputs (valid until the next dispatch), in the intra-node layout.
        self.recv_tokens = torch.empty((cap, hb), dtype=torch.uint8, device=dev)
        self.recv_weights = torch.empty((cap, k), dtype=torch.float32, device=dev)
        self.recv_scales = torch.empty(
            (cap, c.scale_dim * c.scale_type_size), dtype=torch.uint8, device=dev
        )
        self.recv_indices = torch.empty((cap, k), dtype=torch.int32, device=dev)
        self.recv_src_pos = torch.empty((cap,), dtype=torch.int32, device=dev)
        self.total_recv = torch.zeros((1,), dtype=torch.int32, device=dev)
        self.one_weights = torch.ones((m, k), dtype=torch.float32, device=dev)
        self.pre_reduce = bool(self.impl.pre_reduce)
        # Expert-major outputs: two sets (DeepEP's "at most two results held"),
        # alternating per dispatch; combine outputs likewise.
        self._parity = 0
        self._packed: dict[tuple, dict[str, torch.Tensor]] = {}
        self.combine_parity = 0
        self._combine_bufs: dict[int, torch.Tensor] = {}
        self.next_combine_input: dict[int, torch.Tensor] = {}
        self._pending_dispatch: dict[str, Any] | None = None
        self._pending_combine: dict[str, Any] | None = None
        self._combine_ready = False
        self._combine_layout = _TOKEN_MAJOR
        self._keep: tuple = ()  # the inputs of the call in flight (kept alive until the next)
        # Dispatches sent (every layout): a LowLatencyHandle records the count at its
        # dispatch, and combines take the latest dispatch's handle only.
        self.dispatch_seq = 0
        self.stdmoe: dict[str, Any] | None = None

    def _send_launch(self, fuse: bool, block_num: int, warp_per_block: int) -> tuple:
        """A send's trailing arguments: whether the receive follows at once (one fused
        kernel on CUDA), the launch shape and the stream."""
        return (fuse, *self.launch(block_num, warp_per_block))

    def _reject_dispatch(self, problem: str):
        self._pending_dispatch = None
        self._combine_ready = False
        self.impl.reject_dispatch(problem, self.place.stream())

    def _reject_combine(self, problem: str):
        self._pending_combine = None
        self._combine_ready = False
        self.impl.reject_combine(problem, self.place.stream())

    def _check_order(self, what: str) -> None:
        if self._pending_dispatch is not None:
            raise InvalidStateError(
                f"{what} while a dispatch was sent and not received: call dispatch_recv (or the "
                "receive hook) first"
            )
        if self._pending_combine is not None:
            raise InvalidStateError(
                f"{what} while a combine was sent and not received: call combine_recv (or the "
                "receive hook) first"
            )

    def _capturing(self) -> bool:
        """Whether the current CUDA stream is being captured into a graph."""
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def event(self, async_finish: bool) -> LowLatencyEvent:
        return LowLatencyEvent(self.place.record_event() if async_finish else None)

    # --------------------------------------------------- token-major (MORI's LL)
    def dispatch(self, input, weights, scales, indices, block_num, rdma_block_num,
                 warp_per_block, call_local_expert_count, routing, return_routing):  # fmt: skip
        self.impl_or_raise()
        if routing is not None or return_routing:
            raise NotSupportedError(
                f"routing handles (routing=, return_routing=) are implemented for kernel_type "
                f"IntraNode, not {self.config.kernel_type.name} (as in MORI)"
            )
        problem = checks.dispatch_problem(
            self, input, weights, scales, indices, block_num, rdma_block_num, warp_per_block
        )
        self._check_order("dispatch")
        if problem is not None:
            self._reject_dispatch(problem)
        c = self.config
        try:
            input, weights, scales, indices = self.prepared_dispatch(
                input, weights, scales, indices
            )
            n = input.size(0)
        except (RuntimeError, TypeError, ValueError) as e:
            self._reject_dispatch(f"dispatch inputs could not be prepared: {e}")
        self._keep = (input, weights, scales, indices)
        self.dispatch_seq += 1
        # Before the send: a send the native side rejects (an expert id, the receive
        # cap) leaves no received dispatch to combine, on this rank as on the others.
        self._combine_ready = False
        with self.fails_on_timeout():
            # The rows' dtype travels in the flags: ranks passing different ones fail
            # the call on every rank (InvalidArgumentError on CPU, a trap on CUDA).
            self.impl.dispatch_send(
                _TOKEN_MAJOR, input.data_ptr(), input.size(1) * input.element_size(),
                weights.data_ptr(), scales.data_ptr() if c.scale_dim > 0 else 0,
                indices.data_ptr(), n, False, False,
                *self._send_launch(self.fused, block_num, warp_per_block),
                dtype_tag=checks.row_tag(c, input),
            )  # fmt: skip
        self._pending_dispatch = dict(
            layout=_TOKEN_MAJOR, block_num=block_num, warp_per_block=warp_per_block,
            count=call_local_expert_count,
        )  # fmt: skip
        self._combine_ready = False
        if self.fused:
            self._dispatch_recv()
        return (*self.dispatch_outputs(input, scales), self.total_recv)

    def _dispatch_recv(self) -> None:
        p = self._pending_dispatch
        self._pending_dispatch = None
        launch = self.launch(p["block_num"], p["warp_per_block"])
        with self.fails_on_timeout():
            if p["layout"] == _TOKEN_MAJOR:
                self.impl.dispatch_recv_token_major(
                    self.recv_tokens.data_ptr(), self.recv_weights.data_ptr(),
                    self.recv_scales.data_ptr(), self.recv_indices.data_ptr(),
                    self.recv_src_pos.data_ptr(), self.total_recv.data_ptr(), *launch,
                )  # fmt: skip
            else:
                b = p["bufs"]
                self.impl.dispatch_recv_expert_major(
                    b["x"].data_ptr(), b["scales"].data_ptr() if "scales" in b else 0,
                    p["ue8m0"], b["count"].data_ptr(), b["src_info"].data_ptr(),
                    p["src_info_stride"], b["layout_range"].data_ptr(), b["slot_k"].data_ptr(),
                    *launch,
                )  # fmt: skip
        if p["layout"] == _TOKEN_MAJOR and p["count"]:
            self.count_local_experts()
        self._combine_ready = True
        self._combine_layout = p["layout"]

    def dispatch_recv(self, call_local_expert_count: bool) -> None:
        """AsyncLL's second half of a dispatch (the op checked the kernel type)."""
        self.impl_or_raise()
        if self._pending_dispatch is None:
            raise InvalidStateError("dispatch_recv needs a pending dispatch_send")
        if call_local_expert_count:
            self._pending_dispatch["count"] = True
        self._dispatch_recv()

    @checks.inspectable("combine")
    def _combine_problem(self, input, weights, indices, block_num, rdma_block_num,
                         warp_per_block, use_ext):  # fmt: skip
        # On CUDA total_recv is on the device: rows >= total_recv is a kernel trap there.
        total = self.place.host_count(self.total_recv)
        return checks.combine_problem(self, total, self.impl.num_tokens, input, weights,
                                      indices, block_num, rdma_block_num, warp_per_block,
                                      use_ext)  # fmt: skip

    def combine(self, input, weights, indices, block_num, rdma_block_num, warp_per_block,
                use_external_inp_buf, routing):  # fmt: skip
        impl = self.impl_or_raise()
        if routing is not None:
            raise NotSupportedError(
                f"routing handles (routing=) are implemented for kernel_type IntraNode, "
                f"not {self.config.kernel_type.name} (as in MORI)"
            )
        if self._pending_dispatch is not None:
            raise InvalidStateError("combine while a dispatch was sent and not received")
        if self._pending_combine is not None:
            raise InvalidStateError("combine while a combine was sent and not received")
        if not self._combine_ready or self._combine_layout != _TOKEN_MAJOR:
            raise InvalidStateError(
                "combine needs a received dispatch since the last combine (dispatch, or "
                "dispatch_send + dispatch_recv)"
            )
        problem = self._combine_problem(
            input, weights, indices, block_num, rdma_block_num, warp_per_block,
            use_external_inp_buf,
        )  # fmt: skip
        if problem is not None:
            self._reject_combine(problem)
        n = impl.num_tokens
        fp8_cast = self.quant == EpDispatchCombineQuantType.Fp8DirectCast
        try:
            out = self.combine_out(input.dtype)
            out_weights = self.combine_out_weights if weights is not None else None
            if weights is not None:
                weights = weights.contiguous()
            args = (
                input.data_ptr(), input.stride(0) * input.element_size(), input.size(0),
                checks.COMBINE_DTYPE_CODES[input.dtype],
                weights.data_ptr() if weights is not None else 0, self.recv_src_pos.data_ptr(),
                self.total_recv.data_ptr(), out.data_ptr(),
                out_weights.data_ptr() if out_weights is not None else 0, fp8_cast,
            )  # fmt: skip
        except (RuntimeError, TypeError, ValueError) as e:
            self._reject_combine(f"combine inputs could not be prepared: {e}")
        self._keep = (input, weights)
        self._combine_ready = False
        with self.fails_on_timeout():
            impl.combine_send_token_major(
                *args,
                *self._send_launch(self.fused, block_num, warp_per_block),
                fp8_block_scale_dim=self.config.combine_scale_dim,
            )
        self._pending_combine = dict(block_num=block_num, warp_per_block=warp_per_block)
        if self.fused:
            self._combine_recv()
        return out[:n], (out_weights[:n] if out_weights is not None else None)

    def _combine_recv(self) -> None:
        p = self._pending_combine
        self._pending_combine = None
        with self.fails_on_timeout():
            self.impl.combine_recv(*self.launch(p["block_num"], p["warp_per_block"]))

    def combine_recv(self) -> None:
        """AsyncLL's second half of a combine (the op checked the kernel type)."""
        self.impl_or_raise()
        if self._pending_combine is None:
            raise InvalidStateError("combine_recv needs a pending combine_send")
        self._combine_recv()

    # ------------------------------------------------------ expert-major layout
    def _bufs(self, parity: int, dtype: torch.dtype, fp8: bool, ue8m0: bool):
        """The expert-major outputs of one of the two alternating sets."""
        c = self.config
        key = (parity, dtype, fp8, ue8m0)
        b = self._packed.get(key)
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
            self._packed[key] = b
        return b

    def _expert_major_problem(self, x, topk_idx, dtypes, what):
        c = self.config
        k = c.num_experts_per_token
        dtype_problem = f"{what} input dtype {{dtype}} must be one of {[str(d) for d in dtypes]}"
        problem = checks.tokens_problem(self, x, "x", dtypes, dtype_problem)
        if problem is not None:
            return problem
        n = x.size(0)
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype not in checks.INDEX_DTYPES:
            return f"topk_idx must be an int32 or int64 tensor, got {checks.describe(topk_idx)}"
        if topk_idx.device != self.device:
            return f"topk_idx is on {topk_idx.device}, the op runs on {self.device}"
        if tuple(topk_idx.shape) != (n, k):
            return f"topk_idx must be [{n}, {k}], got shape {tuple(topk_idx.shape)}"
        return checks.int64_ids_problem(self, topk_idx)

    def _expert_dispatch(self, x, topk_idx, weights, fp8, round_scale, ue8m0, src_stride,
                         problem, dtypes, what, fuse, unit_weights=False):  # fmt: skip
        self.impl_or_raise()
        self._check_order(what)
        if problem is None:
            problem = self._expert_major_problem(x, topk_idx, dtypes, what)
        if problem is not None:
            self._reject_dispatch(problem)
        c = self.config
        try:
            x = x.contiguous()
            idx = narrow_ids(topk_idx)
            n = x.size(0)
            if weights is None:  # what a pre-reduced combine weights by: 1 (or unused 0)
                w = (self.one_weights if unit_weights else self.zero_weights)[:n]
            else:
                w = weights.contiguous()
            parity = self._parity
            bufs = self._bufs(parity, x.dtype, fp8, ue8m0)
        except (RuntimeError, TypeError, ValueError) as e:
            self._reject_dispatch(f"dispatch inputs could not be prepared: {e}")
        self._parity ^= 1
        self._keep = (x, idx, w)
        self.dispatch_seq += 1
        self._combine_ready = False  # before the send (as in dispatch)
        with self.fails_on_timeout():
            # The wire tag names the rows' dtype and the cast (fp8, round_scale): ranks
            # that differ fail the call on every rank, naming both sides.
            self.impl.dispatch_send(
                _EXPERT_MAJOR, x.data_ptr(), c.hidden_dim * x.element_size(), w.data_ptr(), 0,
                idx.data_ptr(), n, fp8, round_scale, *self._send_launch(fuse, -1, -1),
                dtype_tag=checks.ROW_TAGS[x.dtype],
            )  # fmt: skip
        self._pending_dispatch = dict(
            layout=_EXPERT_MAJOR, bufs=bufs, ue8m0=ue8m0, src_info_stride=src_stride,
            block_num=-1, warp_per_block=-1, count=False,
        )  # fmt: skip
        self._combine_ready = False
        return bufs

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats,
                             use_fp8, round_scale, use_ue8m0, async_finish,
                             return_recv_hook):  # fmt: skip
        self.stdmoe = None  # combine_standard_moe combines a dispatch_standard_moe only
        c = self.config
        stats = cumulative_local_expert_recv_stats
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
        elif stats is not None and (
            not isinstance(stats, torch.Tensor)
            or stats.dtype != torch.int32
            or tuple(stats.shape) != (c.num_experts_per_rank,)
        ):
            problem = (
                f"cumulative_local_expert_recv_stats must be int32 [{c.num_experts_per_rank}], got "
                f"{checks.describe(stats)}"
            )
        bufs = self._expert_dispatch(
            x, topk_idx, None, bool(use_fp8), bool(round_scale), bool(use_ue8m0), 0, problem,
            (torch.bfloat16,), "low_latency_dispatch", not return_recv_hook,
        )  # fmt: skip
        handle = LowLatencyHandle(
            (bufs["src_info"], bufs["layout_range"], c.max_num_inp_token_per_rank, c.hidden_dim,
             c.num_experts),
            bufs["slot_k"], 0, self.dispatch_seq, id(self), self._capturing(),
        )  # fmt: skip

        def receive():
            self._dispatch_recv()
            if stats is not None:
                stats.add_(bufs["count"])

        hook = None
        if return_recv_hook:
            hook = receive
        else:
            receive()
        event = self.event(async_finish)
        recv_x = (bufs["x"], bufs["scales"]) if use_fp8 else bufs["x"]
        return recv_x, bufs["count"], handle, event, hook

    def _expert_combine(self, x, topk_idx, topk_weights, handle, out, what, fuse,
                        pre_reduce=False):  # fmt: skip
        self.impl_or_raise()
        self._check_order(what)
        if not self._combine_ready or self._combine_layout != _EXPERT_MAJOR:
            raise InvalidStateError(
                f"{what} needs a received expert-major dispatch since the last combine"
            )
        if isinstance(handle, LowLatencyHandle) and self._capturing() and not handle.captured:
            # Nothing runs while capturing: refused here, on this rank, before any launch.
            raise InvalidStateError(
                f"{what} captured in a CUDA graph with the handle of a dispatch that ran "
                "outside the capture: each replay would combine whatever dispatch last wrote "
                "that handle's outputs; capture the dispatch and its combine together"
            )
        problem = self._expert_combine_problem(x, topk_idx, topk_weights, handle, out)
        if problem is not None:
            self._reject_combine(problem)
        c = self.config
        n = topk_idx.size(0)
        try:
            idx = narrow_ids(topk_idx)
            w = topk_weights.contiguous() if topk_weights is not None else None
            if out is None:
                parity = self.combine_parity
                buf = self._combine_bufs.get(parity)
                if buf is None:
                    buf = torch.empty(
                        (c.max_num_inp_token_per_rank, c.hidden_dim), dtype=torch.bfloat16,
                        device=self.device,
                    )  # fmt: skip
                    self._combine_bufs[parity] = buf
                self.combine_parity ^= 1
                out = buf[:n]
        except (RuntimeError, TypeError, ValueError) as err:
            self._reject_combine(f"combine inputs could not be prepared: {err}")
        src_info, layout_range = handle[0], handle[1]
        self._keep = (x, idx, w, out, handle)
        self._combine_ready = False
        with self.fails_on_timeout():
            self.impl.combine_send_expert_major(
                x.data_ptr(), x.stride(1) * 2, src_info.data_ptr(), handle.src_info_stride,
                layout_range.data_ptr(), handle.slot_k.data_ptr(), idx.data_ptr(),
                w.data_ptr() if w is not None else 0, n, out.data_ptr(),
                *self._send_launch(fuse, -1, -1), pre_reduce=pre_reduce,
            )  # fmt: skip
        self._pending_combine = dict(block_num=-1, warp_per_block=-1)
        return out

    def _expert_combine_problem(self, x, topk_idx, topk_weights, handle, out) -> str | None:
        c = self.config
        k, n = c.num_experts_per_token, self.impl.num_tokens
        e, wm = c.num_experts_per_rank, c.world_size * c.max_num_inp_token_per_rank
        describe = checks.describe
        if not isinstance(handle, LowLatencyHandle):
            return f"handle must be the one low_latency_dispatch returned, got {describe(handle)}"
        if handle.op_id != id(self):
            return "handle is another EpDispatchCombineOp's (a handle combines on its own op only)"
        if handle.dispatch_seq != self.dispatch_seq:
            return (
                f"stale handle: it is of this op's dispatch {handle.dispatch_seq}, the latest "
                f"dispatch is {self.dispatch_seq} (a combine takes the handle of the latest "
                "dispatch; an earlier one's rows may be overwritten)"
            )
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
            return f"x must be a bf16 tensor, got {describe(x)}"
        if x.device != self.device:
            return f"x is on {x.device}, the op runs on {self.device}"
        if (
            tuple(x.shape) != (e, wm, c.hidden_dim)
            or x.stride(2) != 1
            or x.stride(0) != wm * x.stride(1)
        ):
            return (
                f"x must be a row-contiguous [{e}, {wm}, {c.hidden_dim}] tensor, got shape "
                f"{tuple(x.shape)}"
            )
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype not in checks.INDEX_DTYPES:
            return f"topk_idx must be an int32 or int64 tensor, got {describe(topk_idx)}"
        if tuple(topk_idx.shape) != (n, k):
            return (
                f"topk_idx must be this rank's [{n}, {k}] routing of the dispatch, got shape "
                f"{tuple(topk_idx.shape)}"
            )
        if topk_weights is not None and (
            not isinstance(topk_weights, torch.Tensor)
            or topk_weights.dtype != torch.float32
            or tuple(topk_weights.shape) != tuple(topk_idx.shape)
        ):
            return f"topk_weights must be float32 [{n}, {k}], got {describe(topk_weights)}"
        if out is not None and (
            not isinstance(out, torch.Tensor)
            or out.dtype != torch.bfloat16
            or tuple(out.shape) != (topk_idx.size(0), c.hidden_dim)
            or not out.is_contiguous()
        ):
            return (
                f"out must be a contiguous bf16 [{topk_idx.size(0)}, {c.hidden_dim}], got "
                f"{describe(out)}"
            )
        return None

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, zero_copy, async_finish,
                            return_recv_hook, out):  # fmt: skip
        if zero_copy:
            x = self.next_combine_input.get(self.combine_parity, x)
        res = self._expert_combine(
            x, topk_idx, topk_weights, handle, out, "low_latency_combine", not return_recv_hook
        )
        hook = None
        if return_recv_hook:
            hook = self._combine_recv
        else:
            self._combine_recv()
        return res, self.event(async_finish), hook

    def next_low_latency_combine_buffer(self) -> torch.Tensor:
        c = self.config
        p = self.combine_parity
        buf = self.next_combine_input.get(p)
        if buf is None:
            buf = torch.zeros(
                (c.num_experts_per_rank, c.world_size * c.max_num_inp_token_per_rank, c.hidden_dim),
                dtype=torch.bfloat16, device=self.device,
            )  # fmt: skip
            self.next_combine_input[p] = buf
        return buf

    def dispatch_standard_moe(self, input, weights, scales, indices):
        c = self.config
        problem = None
        if weights is not None and (
            not isinstance(weights, torch.Tensor)
            or weights.dtype != torch.float32
            or not isinstance(input, torch.Tensor)
            or tuple(weights.shape) != (input.size(0), c.num_experts_per_token)
        ):
            problem = (
                f"weights must be float32 [num_tokens, {c.num_experts_per_token}] or None, got "
                f"{checks.describe(weights)}"
            )
        elif scales is not None and (not isinstance(scales, torch.Tensor) or scales.numel()):
            problem = "dispatch_standard_moe carries no scales (pass None)"
        self.stdmoe = None
        bufs = self._expert_dispatch(
            input, indices, weights, False, False, False, c.max_num_tokens_to_send, problem,
            (torch.bfloat16, torch.float16, torch.float32, _FP8), "dispatch_standard_moe", True,
            unit_weights=True,
        )  # fmt: skip
        self._dispatch_recv()
        n = input.size(0)
        w = weights.contiguous() if weights is not None else None
        self.stdmoe = dict(
            handle=LowLatencyHandle(
                (bufs["src_info"], bufs["layout_range"], c.max_num_inp_token_per_rank,
                 c.hidden_dim, c.num_experts),
                bufs["slot_k"], c.max_num_tokens_to_send, self.dispatch_seq, id(self),
                self._capturing(),
            ),
            weights=w, indices=self._keep[1], n=n,
        )  # fmt: skip
        return bufs["x"], bufs["count"], bufs["src_info"], bufs["layout_range"]

    def combine_standard_moe(self, input, indices):
        s = self.stdmoe
        if s is None:
            raise InvalidStateError("combine_standard_moe needs a dispatch_standard_moe first")
        pre = self.pre_reduce
        out = self._expert_combine(
            input, indices, None if pre else s["weights"], s["handle"], None,
            "combine_standard_moe", True, pre_reduce=pre,
        )  # fmt: skip
        self._combine_recv()
        self.stdmoe = None
        return out, None


__all__ = ["LowLatencyEvent", "LowLatencyHandle", "LowLatencyMode"]
