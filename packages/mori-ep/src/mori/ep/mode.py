# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""What every mode of :class:`~mori.ep.EpDispatchCombineOp` shares.

A mode is the strategy object behind the op: :class:`~mori.ep.intranode.IntraNodeMode`
(``IntraNode``) or :class:`~mori.ep.low_latency.LowLatencyMode` (``IntraNodeLL``,
``AsyncLL``). It owns the native implementation (``impl``, CPU or CUDA, called with
one signature), the op's symmetric block and its output tensors; the op checks
nothing itself and forwards every call to its mode. This base holds the output
tensors every mode fills (dispatch's received rows in token-major order, combine's
per-dtype outputs), the failure rules (a closed or timed-out op refuses calls) and
the local conversions that read those outputs.
"""

from __future__ import annotations

import contextlib

import torch

from mori.core import InvalidArgumentError, InvalidStateError, MoriTimeoutError

from .config import EpDispatchCombineConfig


def narrow_ids(indices: torch.Tensor) -> torch.Tensor:
    """Expert ids as the native code reads them: contiguous int32, int64 ids clamped
    first so that an out-of-range id stays out of range."""
    if indices.dtype == torch.int64:
        indices = indices.clamp(-(2**31), 2**31 - 1).to(torch.int32)
    return indices.contiguous()


class Mode:
    """The state and rules every mode shares (see the module docstring).

    Attributes a subclass sets: ``impl`` (the native implementation), ``block`` (the
    symmetric block, or None), ``recv_tokens`` (uint8 ``[C, hidden * max_token_type_size]``),
    ``recv_weights`` (fp32 ``[C, k]``), ``recv_scales`` (uint8 ``[C, scale bytes]``),
    ``recv_indices`` (int32 ``[C, k]``), ``recv_src_pos`` (int32 ``[C]``, ``src_rank *
    M + token``) and ``total_recv`` (int32 ``[1]``), C the receive capacity."""

    def __init__(self, config: EpDispatchCombineConfig, place, timeout_s: float) -> None:
        c = config
        self.config = c
        self.place = place
        self.device = place.device
        self.quant = c.quant
        self.timeout_s = timeout_s
        self._timed_out: str | None = None
        # The native constructors' and buffer layouts' shape arguments.
        self.shape = (
            c.world_size,
            c.rank,
            c.max_num_inp_token_per_rank,
            c.num_experts_per_token,
            c.hidden_dim,
            c.max_token_type_size,
            c.scale_dim * c.scale_type_size,
            c.num_experts_per_rank,
        )
        m, k, dev = c.max_num_inp_token_per_rank, c.num_experts_per_token, place.device
        self.combine_outs: dict[torch.dtype, torch.Tensor] = {}
        self.combine_out_weights = torch.empty((m, k), dtype=torch.float32, device=dev)
        # dispatch(weights=None) sends zeros (MORI leaves the weights unwritten).
        self.zero_weights = torch.zeros((m, k), dtype=torch.float32, device=dev)
        self.registered_inputs: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self.local_expert_count = torch.zeros(c.num_experts_per_rank, dtype=torch.int32, device=dev)
        self.impl = None
        self.block = None
        self._convert = None

    def native(self, cpu_class, cuda_class, what: str):
        """The native implementation of this placement, built over ``self.block``
        (collective: zeroes this pe's signal words, then a heap barrier)."""
        cls = self.place.native(cpu_class, cuda_class, what)
        return cls(*self.shape, self.block.data_ptr(), self.place.index, self.timeout_s,
                   recv_capacity=self.config.max_num_tokens_to_recv)  # fmt: skip

    # ---------------------------------------------------------------- call rules
    def launch(self, block_num: int, warp_per_block: int) -> tuple[int, int, int]:
        """The launch shape (<= 0: the config's) and the stream every native call
        takes last (the CPU implementations ignore them)."""
        c = self.config
        return (
            c.block_num if block_num <= 0 else block_num,
            c.warp_num_per_block if warp_per_block <= 0 else warp_per_block,
            self.place.stream(),
        )

    def impl_or_raise(self):
        if self.impl is None:
            raise InvalidStateError("this EpDispatchCombineOp was closed")
        if self._timed_out is not None:
            raise InvalidStateError(
                f"this EpDispatchCombineOp timed out earlier ({self._timed_out}); its ranks "
                "no longer agree on the call they are in: create a new op"
            )
        return self.impl

    @contextlib.contextmanager
    def fails_on_timeout(self):
        """A timed-out call leaves the ranks at different epochs: later calls would
        pair with stale ones, so the op refuses them (InvalidStateError)."""
        try:
            yield
        except MoriTimeoutError as e:
            self._timed_out = str(e).splitlines()[0]
            raise

    def prepared_dispatch(self, input, weights, scales, indices):
        """A token-major dispatch's inputs as the native code reads them: contiguous,
        int32 ids, zeros for ``weights=None``. Raises what torch raises (the caller
        turns it into a rejection on every rank)."""
        input = input.contiguous()
        n = input.size(0)
        weights = self.zero_weights[:n] if weights is None else weights.contiguous()
        indices = narrow_ids(indices)
        if self.config.scale_dim > 0:
            scales = scales.contiguous()
        return input, weights, scales, indices

    def dispatch_outputs(self, input, scales):
        """dispatch's ``(out, out_weights, out_scales, out_indices)`` views."""
        row_bytes = input.size(1) * input.element_size()
        out = self.recv_tokens[:, :row_bytes].view(input.dtype)
        out_scales = self.recv_scales.view(scales.dtype) if self.config.scale_dim > 0 else None
        return out, self.recv_weights, out_scales, self.recv_indices

    def combine_out(self, dtype: torch.dtype) -> torch.Tensor:
        """combine's ``[max_num_inp_token_per_rank, hidden_dim]`` output of ``dtype``."""
        out = self.combine_outs.get(dtype)
        if out is None:
            c = self.config
            out = torch.empty(
                (c.max_num_inp_token_per_rank, c.hidden_dim), dtype=dtype, device=self.device
            )
            self.combine_outs[dtype] = out
        return out

    def count_local_experts(self) -> None:
        """local_expert_count from the last dispatch's received indices (rows past
        total_recv not read): on CUDA one kernel on the current stream, no host
        synchronisation (the native count mori.ops.local_expert_count launches)."""
        c = self.config
        idx = self.recv_indices
        self.place.count_local_experts(
            idx.data_ptr(), self.total_recv.data_ptr(), c.rank, c.num_experts_per_rank,
            c.num_experts_per_token, self.local_expert_count.data_ptr(), idx.numel(),
        )  # fmt: skip

    # ------------------------------------------------------------ shared queries
    def registered_combine_input(self, dtype: torch.dtype, hidden_dim: int) -> torch.Tensor:
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgumentError(f"dtype {dtype!r} must be a torch.dtype")
        h = self.config.hidden_dim if hidden_dim <= 0 else int(hidden_dim)
        key = (dtype, h)
        buf = self.registered_inputs.get(key)
        if buf is None:
            buf = torch.empty(
                (self.config.max_num_tokens_to_recv, h), dtype=dtype, device=self.device
            )
            self.registered_inputs[key] = buf
        return buf

    def dispatch_src_token_pos(self) -> torch.Tensor:
        self.impl_or_raise()
        total = int(self.total_recv.item())
        c = self.config
        m = c.max_num_inp_token_per_rank
        # The buffer holds src_rank * M + token (the kernels' compact form).
        pos = self.recv_src_pos[:total].to(torch.int64)
        flat = pos // m * c.max_num_tokens_to_send + pos % m
        if c.world_size * c.max_num_tokens_to_send < 2**31:
            flat = flat.to(torch.int32)
        return flat

    def convert_dispatch_output(self, dispatch_out_x, dispatch_out_topk_idx):
        c = self.config
        e, wm = c.num_experts_per_rank, c.world_size * c.max_num_inp_token_per_rank
        total = int(self.total_recv.item())
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
        flat = self.dispatch_src_token_pos().to(torch.int64)
        src_info = torch.zeros((e, wm), dtype=torch.int32, device=self.device)
        src_info[experts, pos] = flat[rows].to(torch.int32)
        src_rank = flat[rows] // c.max_num_tokens_to_send
        per = torch.zeros((e, c.world_size), dtype=torch.int64, device=self.device)
        per.index_put_((experts, src_rank), torch.ones_like(src_rank), accumulate=True)
        begin = torch.cumsum(per, 1) - per
        layout_range = (begin << 32) | per
        self._convert = (rows, slots, experts, pos)
        return x, count, src_info, layout_range

    def convert_combine_input(self, packed_recv_x) -> torch.Tensor:
        if self._convert is None:
            raise InvalidStateError("convert_combine_input needs a convert_dispatch_output first")
        rows, slots, experts, pos = self._convert
        c = self.config
        acc = torch.zeros(
            (c.max_num_tokens_to_recv, c.hidden_dim), dtype=torch.float32, device=self.device
        )
        w = self.recv_weights[rows, slots]
        y = packed_recv_x[experts, pos].float() * w[:, None]
        for kk in range(c.num_experts_per_token):  # ascending k: a fixed order
            sel = slots == kk
            acc.index_add_(0, rows[sel], y[sel])
        return acc.to(packed_recv_x.dtype)

    def close(self) -> None:
        """Drop the native implementation and the buffers (freed once no returned
        view holds them)."""
        self.impl = None
        for name in (
            "block",
            "recv_tokens",
            "recv_weights",
            "recv_scales",
            "recv_indices",
            "recv_src_pos",
            "total_recv",
        ):
            setattr(self, name, None)
        self.combine_outs = {}
