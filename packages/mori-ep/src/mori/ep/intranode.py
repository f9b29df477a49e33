# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The ``IntraNode`` mode: MORI's intra-node dispatch/combine.

The protocol (symmetric receive buffers sized to capacity, a count exchange that
reserves rows, per-call epochs in the signal words) is described in the package
README and in ``csrc/protocol.hpp``; this module checks inputs, owns the symmetric
block and calls the native implementation (``IntraNodeCpu`` on a host heap,
``IntraNodeCuda`` on a CUDA heap, one signature). Routing handles
(:mod:`mori.ep.routing`) are this mode's.
"""

from __future__ import annotations

import torch

from mori.core import InvalidStateError, shmem

from . import checks
from . import routing as _routing
from ._C import IntraNodeCpu, ep_buffer_layout
from .config import EpDispatchCombineQuantType
from .mode import Mode

try:  # a build with CUDA
    from ._C import IntraNodeCuda
except ImportError:
    IntraNodeCuda = None


class IntraNodeMode(Mode):
    """The strategy behind an ``IntraNode`` op (the public contract is
    :class:`~mori.ep.EpDispatchCombineOp`'s)."""

    def __init__(self, config, place, timeout_s: float) -> None:
        super().__init__(config, place, timeout_s)
        c = config
        cap = c.max_num_tokens_to_recv
        self.layout = ep_buffer_layout(*self.shape, recv_capacity=cap)
        self.block = shmem.empty((self.layout["total_bytes"],), torch.uint8)
        self.impl = self.native(IntraNodeCpu, IntraNodeCuda, f"kernel_type {c.kernel_type.name}")
        self.routing_owner = object()  # what routing handles of this op carry
        self.map_recv_regions()

    def map_recv_regions(self) -> None:
        """The views of the block's receive regions that dispatch returns (every mode
        whose layout names them: intra-node, inter-node), ``max_num_tokens_to_recv``
        rows each."""
        c = self.config
        cap, k = c.max_num_tokens_to_recv, c.num_experts_per_token
        hb = c.hidden_dim * c.max_token_type_size
        sb = c.scale_dim * c.scale_type_size
        self.recv_tokens = self.region("recv_tokens", cap * hb).view(cap, hb)
        self.recv_weights = self.region("recv_weights", cap * k * 4).view(torch.float32)
        self.recv_weights = self.recv_weights.view(cap, k)
        self.recv_scales = self.region("recv_scales", cap * sb).view(cap, sb)
        self.recv_indices = self.region("recv_indices", cap * k * 4).view(torch.int32)
        self.recv_indices = self.recv_indices.view(cap, k)
        self.recv_src_pos = self.region("recv_src_pos", cap * 4).view(torch.int32)
        self.total_recv = self.region("total_recv", 4).view(torch.int32)

    def region(self, name: str, nbytes: int) -> torch.Tensor:
        """``nbytes`` of the symmetric block from region ``name`` (protocol.hpp), uint8."""
        off = self.layout[name]
        return self.block[off : off + nbytes]

    def epoch_tensor(self) -> torch.Tensor:
        """The last dispatch's epoch as an int64 ``[1]`` tensor on the op's device, for
        routing handles: on CUDA the word the dispatch kernel advanced
        (EpDeviceState.epoch, read by the combine kernel), on the host the
        implementation's counter."""
        if self.place.host:
            return torch.tensor([self.impl.epoch], dtype=torch.int64)
        return self.region("state", 8).view(torch.int64)

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, input, weights, scales, indices, block_num, rdma_block_num,
                 warp_per_block, call_local_expert_count, routing, return_routing):  # fmt: skip
        impl = self.impl_or_raise()
        problem = checks.dispatch_problem(
            self, input, weights, scales, indices, block_num, rdma_block_num, warp_per_block
        )
        if problem is None and (routing is not None or return_routing):
            problem = self._replay_problem(input, indices, routing, return_routing)
        if problem is not None:  # raises InvalidArgumentError(problem)
            impl.reject_dispatch(problem, self.place.stream())
        c = self.config
        try:  # torch may still refuse an input that passed the checks (a sparse layout)
            input, weights, scales, indices = self.prepared_dispatch(
                input, weights, scales, indices
            )
            n = input.size(0)
            masks = 0 if routing is None else _routing.rank_masks(self, routing).data_ptr()
            args = (
                input.data_ptr(),
                input.size(1) * input.element_size(),
                weights.data_ptr(),
                scales.data_ptr() if c.scale_dim > 0 else 0,
                indices.data_ptr(),
                n,
            )
        except (RuntimeError, TypeError, ValueError) as e:
            # Fail the call on every rank, as a check would, instead of leaving the
            # peers waiting for this rank's counts.
            impl.reject_dispatch(f"dispatch inputs could not be prepared: {e}", self.place.stream())
        tag = checks.row_tag(c, input)
        with self.fails_on_timeout():
            impl.dispatch(*args, *self.launch(block_num, warp_per_block), masks, tag)
        if call_local_expert_count:
            self.count_local_experts()
        base = self.dispatch_outputs(input, scales)
        if routing is not None:
            _routing.stamp(self, routing)
            return (*base, routing.total_recv_token_num)
        if return_routing:
            handle = _routing.snapshot(self, n)
            return (*base, handle.total_recv_token_num, handle)
        return (*base, self.total_recv)

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

    # ------------------------------------------------------------------- combine
    @checks.inspectable("combine")
    def _combine_problem(self, input, weights, indices, block_num, rdma_block_num,
                         warp_per_block, use_ext, routing):  # fmt: skip
        # On CUDA total_recv is on the device: rows >= total_recv is a kernel trap there.
        if routing is not None:
            total = self.place.host_count(_routing.derived(self, routing)[5])
        else:
            total = self.place.host_count(self.total_recv)
        n = self.impl.num_tokens if routing is None else routing.cur_rank_num_token
        return checks.combine_problem(self, total, n, input, weights, indices, block_num,
                                      rdma_block_num, warp_per_block, use_ext)  # fmt: skip

    def combine(self, input, weights, indices, block_num, rdma_block_num, warp_per_block,
                use_external_inp_buf, routing):  # fmt: skip
        impl = self.impl_or_raise()
        stream = self.place.stream()
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
                impl.reject_combine(handle_problem, stream, _routing.reject_words(self, routing))
        elif not impl.combine_pending:
            raise InvalidStateError(
                f"combine needs a successful dispatch since the last combine (epoch {impl.epoch})"
            )
        problem = self._combine_problem(
            input, weights, indices, block_num, rdma_block_num, warp_per_block,
            use_external_inp_buf, routing,
        )  # fmt: skip
        if problem is not None:
            impl.reject_combine(problem, stream, words)
        n = impl.num_tokens if routing is None else routing.cur_rank_num_token
        fp8_cast = self.quant == EpDispatchCombineQuantType.Fp8DirectCast
        try:  # as in dispatch: a local failure here fails the call on every rank
            out = self.combine_out(input.dtype)
            out_weights = self.combine_out_weights if weights is not None else None
            if weights is not None:
                weights = weights.contiguous()
            addrs = (input.data_ptr(), input.stride(0) * input.element_size(), input.size(0))
            outs = (
                weights.data_ptr() if weights is not None else 0,
                out.data_ptr(),
                out_weights.data_ptr() if out_weights is not None else 0,
            )
        except (RuntimeError, TypeError, ValueError) as e:
            impl.reject_combine(f"combine inputs could not be prepared: {e}", stream, words)
        with self.fails_on_timeout():
            impl.combine(
                *addrs, checks.COMBINE_DTYPE_CODES[input.dtype], *outs, fp8_cast,
                *self.launch(block_num, warp_per_block), words,
                fp8_block_scale_dim=self.config.combine_scale_dim,
            )  # fmt: skip
        return out[:n], (out_weights[:n] if out_weights is not None else None)
