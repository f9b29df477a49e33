# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""``mori.ep.balanced.Buffer``: MoonEP's ``Buffer`` API on mori-core's symmetric heap.

Every call is collective over the Buffer's ranks. Inputs are checked on the calling
rank; on a host heap a rank with a bad input makes the call raise InvalidArgumentError
on every rank, naming the value, before any byte moves; on a CUDA heap that rank raises
it and the other ranks' kernels trap naming that rank (no host synchronisation). Every
wait is bounded by ``timeout_s``. The data paths run on a host heap
(``mori.core.shmem.init(device="cpu")``, tested) or as CUDA kernels on a CUDA heap
(tested on 1 x H200 with 2 processes). Calls are not CUDA-graph capturable (refused
while the current stream is capturing).
"""

from __future__ import annotations

from typing import Any

import torch

from mori.core import InvalidArgumentError, InvalidStateError, NotSupportedError, shmem, timeouts

from .. import _C
from .planning import Plan, empty_tables, nvs_of, table_addresses


class CompletedEvent:
    """What ``async_finish=True`` returns on a host heap, where every call has finished
    when it returns: a ``torch.cuda.Event`` look-alike that is always complete."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} {value!r} must be a positive int")
    return value


def _tensor_problem(x, name: str, dtype, shape, device: torch.device) -> str:
    """Why ``x`` is not a contiguous tensor of ``dtype`` and ``shape`` on ``device`` ("" if
    it is)."""
    if not isinstance(x, torch.Tensor):
        return f"{name} must be a torch.Tensor, got {type(x).__name__}"
    if x.dtype != dtype:
        return f"{name} dtype {x.dtype} must be {dtype}"
    if tuple(x.shape) != tuple(shape):
        return f"{name} shape {tuple(x.shape)} must be {tuple(shape)}"
    if x.device != device:
        return f"{name} is on {x.device}; this Buffer's heap is on {device}"
    if not x.is_contiguous():
        return f"{name} (shape {tuple(x.shape)}) must be contiguous"
    return ""


class Buffer:
    """MoonEP's communication buffer (see the mori-ep README's "Balanced mode").

    Args:
        S: tokens per rank; H: hidden size; K: top-k; E: experts (a multiple of R);
        num_ep_ranks: R, which must equal the heap's (and ``group``'s) size.
        num_sms: SMs for the kernels (None: 32); kept for MoonEP's signature.
        token_padding: each non-empty group is padded to a multiple of this.
        group: torch.distributed group (its size is checked when given).
        comm_stream_priority, enable_pdl, explicitly_destroy: MoonEP's; the first two
            are kept for its signature (no stream on a host heap).
        timeout_s: bound on every wait for a peer (mori.core.timeouts' rules).
        prefetch_engine: "sm" (default: a kernel's stores push the weights) or "copy"
            (copy engines: one peer copy per slot and tensor, after one stream
            synchronisation to read the plan's slots); CUDA heaps only, ignored on a
            host heap.

    ``mori.core.shmem.init`` must have been called with num_ep_ranks pes.
    """

    def __init__(
        self,
        S: int,
        H: int,
        K: int,
        E: int,
        num_ep_ranks: int,
        num_sms: int | None = None,
        token_padding: int = 128,
        group: Any = None,
        comm_stream_priority: int = -1,
        enable_pdl: bool = True,
        explicitly_destroy: bool = False,
        *,
        timeout_s: float = 60.0,
        prefetch_engine: str = "sm",
    ):
        self._destroyed = True
        self.S, self.H, self.K = _positive(S, "S"), _positive(H, "H"), _positive(K, "K")
        self.E, self.R = _positive(E, "E"), _positive(num_ep_ranks, "num_ep_ranks")
        self.num_sms = 32 if num_sms is None else _positive(num_sms, "num_sms")
        self.token_padding = _positive(token_padding, "token_padding")
        if self.E % self.R:
            raise InvalidArgumentError(
                f"E ({E}) must be divisible by num_ep_ranks ({num_ep_ranks})"
            )
        if not isinstance(comm_stream_priority, int) or not isinstance(enable_pdl, bool):
            raise InvalidArgumentError(
                f"comm_stream_priority {comm_stream_priority!r} must be an int and "
                f"enable_pdl {enable_pdl!r} a bool"
            )
        if prefetch_engine not in ("sm", "copy"):
            raise InvalidArgumentError(
                f"prefetch_engine {prefetch_engine!r} must be 'sm' or 'copy'"
            )
        self.prefetch_engine = prefetch_engine
        self.explicitly_destroy = bool(explicitly_destroy)
        self.timeout_s = timeouts.seconds(timeout_s, "timeout_s")
        if not shmem.initialized():
            raise InvalidStateError(
                "balanced.Buffer needs mori.core.shmem.init() first (device='cpu' for a host heap)"
            )
        if shmem.n_pes() != self.R:
            raise InvalidArgumentError(
                f"num_ep_ranks ({self.R}) must equal the heap's pes ({shmem.n_pes()})"
            )
        if group is not None:
            import torch.distributed as dist

            if dist.get_world_size(group=group) != self.R:
                raise InvalidArgumentError(
                    f"num_ep_ranks ({self.R}) must equal group world size "
                    f"({dist.get_world_size(group=group)})"
                )
        info = shmem.info()
        self._cuda = info["kind"] != "host"
        if self._cuda and not getattr(_C, "with_cuda", False):
            raise NotSupportedError("a CUDA heap needs mori.ep built with CUDA (MORI_CUDA=on)")
        self.device = (
            torch.device("cuda", int(info["device"])) if self._cuda else torch.device("cpu")
        )
        self.group = group
        self.rank = shmem.my_pe()
        self.epn = self.E // self.R
        self.NvS = nvs_of(self.S, self.K, self.E, self.R, self.token_padding)
        shape = (self.R, self.E, self.S, self.K, self.token_padding)
        self._key = shape
        layout = _C.balanced_block_layout(*shape, self.H)
        self._block = shmem.empty((int(layout["total_bytes"]),), torch.uint8)
        native = _C.BalancedCuda if self._cuda else _C.BalancedCpu
        self._impl = native(*shape, self.H, self.rank, self._block.data_ptr(),
                            self.device.index if self._cuda else -1, self.timeout_s)  # fmt: skip
        nvs, H, at, w = self.NvS, self.H, layout["hidden"], layout["weights"]
        self._hidden_view = self._block[at : at + nvs * H * 2].view(torch.bfloat16).view(nvs, H)
        self._weights_view = self._block[w : w + nvs * 4].view(torch.float32)
        self._destroyed = False

    # -- state ------------------------------------------------------------------------

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def hidden_nvsh_buffer_view(self) -> torch.Tensor:
        """This rank's [NvS, H] bf16 shard (what ``zero_copy`` dispatch returns); the
        next dispatch/combine overwrites it."""
        self._require()
        return self._hidden_view

    @property
    def router_weight_buffer_view(self) -> torch.Tensor:
        """This rank's [NvS] fp32 route-weight shard; same lifetime as the shard."""
        self._require()
        return self._weights_view

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self._cuda else 0

    def _event(self):
        if not self._cuda:
            return CompletedEvent()
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _require(self) -> None:
        if self._destroyed:
            raise InvalidStateError("balanced.Buffer has been destroyed")

    def _not_capturing(self, op: str) -> None:
        """Refuse a call made while the stream is captured into a CUDA graph, before any
        launch: each call's kernels take its sequence numbers (rank agreement, barrier
        phases) from host counters as launch arguments, and a replay would repeat them,
        so the replayed waits would not order anything."""
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise NotSupportedError(
                f"balanced.Buffer.{op} cannot be captured in a CUDA graph (its kernels' "
                "sequence numbers come from the host per call); call it eagerly"
            )

    def destroy(self) -> None:
        """Release the symmetric block (collective: a heap barrier first). Idempotent."""
        if self._destroyed:
            return
        if self._cuda:
            torch.cuda.synchronize(self.device)
        shmem.barrier_all()
        self._destroyed = True
        self._impl = None
        self._hidden_view = self._weights_view = None
        self._block = None

    def __del__(self):
        if getattr(self, "_destroyed", True) or getattr(self, "explicitly_destroy", False):
            return
        # Collective release is the caller's (destroy()); here only local references go.
        self._impl = None

    # -- checks -----------------------------------------------------------------------

    def _plan_problem(self, plan) -> str:
        if not isinstance(plan, Plan):
            return f"plan must be a mori.ep.balanced.Plan, got {type(plan).__name__}"
        if plan.key != self._key or plan.rank != self.rank:
            return (
                f"plan of (R, E, S, K, token_padding) {plan.key} for rank {plan.rank} does not "
                f"fit this Buffer's {self._key} on rank {self.rank}"
            )
        if plan.dst.device != self.device:
            return f"plan tensors are on {plan.dst.device}; this Buffer's heap is on {self.device}"
        return ""

    def _refuse(self, op: str, reason: str):
        self._impl.refuse(op, reason, self._stream())

    # -- dispatch ---------------------------------------------------------------------

    def dispatch(
        self,
        hidden_sh: torch.Tensor,
        route_weights_sk: torch.Tensor | None = None,
        topk_experts_sk: torch.Tensor | None = None,
        tokens_per_expert: torch.Tensor | None = None,
        plan: Plan | None = None,
        async_finish: bool = False,
        *,
        inter_rank_sync: bool = True,
        zero_copy: bool = False,
        router_weights_zero_copy: bool = False,
    ):
        """Plan (unless ``plan`` is given) and send every (token, k) row to its slot.

        Args:
            hidden_sh: [S, H] bf16 tokens.
            route_weights_sk: [S, K] fp32 routing weights, or None.
            topk_experts_sk: [S, K] int32 expert ids (needed without ``plan``).
            tokens_per_expert: [E] int32, this rank's pairs per expert (its bincount).
            plan: a saved Plan of this Buffer's rank: planning is skipped (combine bwd).
            async_finish: also return an event (complete on a host heap).
            inter_rank_sync: MoonEP's; every call here starts with a rank exchange.
            zero_copy / router_weights_zero_copy: return views of the shard instead
                of fresh tensors (valid until the next dispatch/combine).

        Returns:
            ``(hidden_nvsh [NvS, H] bf16, route_weights_nvs [NvS] fp32 or None,
            cu_seqlens [2*epn] int32 or None on plan reuse, plan)``, plus the event
            when ``async_finish``. Rows inside a group's padding are zero; rows past
            ``cu_seqlens[-1]`` are undefined.
        """
        self._require()
        self._not_capturing("dispatch")
        S, K, E, H = self.S, self.K, self.E, self.H
        reason = _tensor_problem(hidden_sh, "hidden_sh", torch.bfloat16, (S, H), self.device)
        if not reason and route_weights_sk is not None:
            reason = _tensor_problem(
                route_weights_sk, "route_weights_sk", torch.float32, (S, K), self.device
            )
        fresh = plan is None
        if fresh and not reason:
            if topk_experts_sk is None or tokens_per_expert is None:
                reason = "dispatch without plan needs topk_experts_sk and tokens_per_expert"
            else:
                reason = _tensor_problem(
                    topk_experts_sk, "topk_experts_sk", torch.int32, (S, K), self.device
                )
                reason = reason or _tensor_problem(
                    tokens_per_expert, "tokens_per_expert", torch.int32, (E,), self.device
                )
        elif not fresh and not reason:
            reason = self._plan_problem(plan)
        if reason:
            self._refuse("dispatch", reason)
        if fresh:
            dev = self.device
            tables = empty_tables(self.R, E, dev)
            dst = torch.empty(S * K, dtype=torch.int32, device=dev)
            self._impl.plan(tokens_per_expert.data_ptr(), topk_experts_sk.data_ptr(), "",
                            table_addresses(tables), dst.data_ptr(), self._stream())  # fmt: skip
            nvs = self.NvS
            plan = Plan(
                self.rank, self.R, S, K, E, self.token_padding, nvs, dst,
                tables["cu_seqlens"][self.rank].clone(), tables["experts_to_copy"],
                tables["zero_fill_ranges"][self.rank].clone(),
                tables["remote_stats"][self.rank].clone(),
                torch.zeros(nvs, 3, dtype=torch.int32, device=dev),
                torch.zeros(nvs, dtype=torch.int32, device=dev),
                torch.zeros(2, dtype=torch.int32, device=dev), tables["alloc"],
                tables["expert_offsets"],
            )  # fmt: skip
        weights_ptr = 0 if route_weights_sk is None else route_weights_sk.data_ptr()
        self._impl.dispatch(plan.rank_tables(), hidden_sh.data_ptr(), H, weights_ptr, fresh, "",
                            self._stream())  # fmt: skip
        hidden_nvsh = self._hidden_view if zero_copy else self._hidden_view.clone()
        if route_weights_sk is None:
            weights_nvs = None
        elif router_weights_zero_copy:
            weights_nvs = self._weights_view
        else:
            weights_nvs = self._weights_view.clone()
        cu = plan.cu_seqlens.clone() if fresh else None
        out = (hidden_nvsh, weights_nvs, cu, plan)
        return (*out, self._event()) if async_finish else out

    # -- combine ----------------------------------------------------------------------

    def combine(
        self,
        plan: Plan | None = None,
        hidden_nvsh: torch.Tensor | None = None,
        route_weights_nvs: torch.Tensor | None = None,
        async_finish: bool = False,
        inter_rank_sync: bool = True,
        *,
        zero_copy: bool = False,
        router_weights_zero_copy: bool = False,
    ):
        """Sum each token's K expert rows back: output[t] = bf16(sum over the token's
        ranks, in k order, of that rank's partial), a rank's partial being the fp32 sum
        of its rows for the token rounded once to bf16 (MoonEP's unweighted sum; a
        single row returns with its bits).

        Args:
            plan: the dispatch's Plan.
            hidden_nvsh: [NvS, H] bf16 expert outputs (with ``zero_copy``, exactly
                ``hidden_nvsh_buffer_view``).
            route_weights_nvs: [NvS] fp32 or None; gathered back to [S, K] when given.

        Returns:
            ``(output_sh [S, H] bf16, gathered_route_weights_sk [S, K] fp32 or None,
            event or None)``.
        """
        self._require()
        self._not_capturing("combine")
        nvs, H, S, K = self.NvS, self.H, self.S, self.K
        reason = self._plan_problem(plan) if plan is not None else "combine needs plan"
        reason = reason or _tensor_problem(
            hidden_nvsh, "hidden_nvsh", torch.bfloat16, (nvs, H), self.device
        )
        if not reason and route_weights_nvs is not None:
            reason = _tensor_problem(
                route_weights_nvs, "route_weights_nvs", torch.float32, (nvs,), self.device
            )
        if not reason and zero_copy and hidden_nvsh.data_ptr() != self._hidden_view.data_ptr():
            reason = "combine(zero_copy=True): hidden_nvsh must be hidden_nvsh_buffer_view"
        if (
            not reason
            and router_weights_zero_copy
            and route_weights_nvs is not None
            and route_weights_nvs.data_ptr() != self._weights_view.data_ptr()
        ):
            reason = (
                "combine(router_weights_zero_copy=True): route_weights_nvs must be "
                "router_weight_buffer_view"
            )
        if reason:
            self._refuse("combine", reason)
        out = torch.empty(S, H, dtype=torch.bfloat16, device=self.device)
        out_w = (
            None
            if route_weights_nvs is None
            else torch.empty(S, K, dtype=torch.float32, device=self.device)
        )
        self._impl.combine(
            plan.rank_tables(), hidden_nvsh.data_ptr(),
            0 if route_weights_nvs is None else route_weights_nvs.data_ptr(), out.data_ptr(),
            0 if out_w is None else out_w.data_ptr(), "", self._stream(),
        )  # fmt: skip
        return out, out_w, (self._event() if async_finish else None)

    # -- expert weights ---------------------------------------------------------------

    def _pool_pairs(self, op: str, plan, pairs, fp32: bool) -> tuple[list, list, list, str]:
        reason = self._plan_problem(plan) if plan is not None else f"{op} needs plan"
        locals_, pools, sizes = [], [], []
        if not reason and any(a is None or b is None for _, a, b in pairs[:3]):
            reason = f"{op} needs the gate, up and down local tensors and buffers together"
        for name, local, pool in pairs:
            if reason:
                break
            if (local is None) != (pool is None):
                reason = f"{op}: {name} local tensor and buffer must be given together"
                continue
            if local is None:
                continue
            if not isinstance(local, torch.Tensor) or not isinstance(pool, torch.Tensor):
                reason = f"{op}: {name} tensors must be torch.Tensors"
            elif fp32 and (local.dtype != torch.float32 or pool.dtype != torch.float32):
                reason = f"{op}: {name} dtypes {local.dtype}/{pool.dtype} must be torch.float32"
            elif pool.dtype != local.dtype:
                reason = f"{op}: {name} buffer dtype {pool.dtype} differs from {local.dtype}"
            elif local.dim() < 2 or int(local.shape[0]) != self.epn:
                reason = (
                    f"{op}: {name} local shape {tuple(local.shape)} must be [epn={self.epn}, ...]"
                )
            elif tuple(pool.shape) != (self.R, *local.shape):
                reason = (
                    f"{op}: {name} buffer shape {tuple(pool.shape)} must be "
                    f"{(self.R, *local.shape)}"
                )
            elif not local.is_contiguous() or not pool.is_contiguous():
                reason = f"{op}: {name} tensors must be contiguous"
            elif local.device != self.device or pool.device != self.device:
                reason = f"{op}: {name} tensors must be on the heap's device {self.device}"
            else:
                locals_.append(local.data_ptr())
                pools.append(pool.data_ptr())
                per_expert = local[0].numel()
                sizes.append(per_expert if fp32 else per_expert * local.element_size())
        return locals_, pools, sizes, reason

    def prefetch_weight(
        self,
        plan: Plan | None = None,
        async_finish: bool = False,
        *,
        local_gate_weight=None,
        local_up_weight=None,
        local_down_weight=None,
        gate_prefetch_buffer=None,
        up_prefetch_buffer=None,
        down_prefetch_buffer=None,
        local_gate_scale=None,
        local_up_scale=None,
        local_down_scale=None,
        gate_scale_prefetch_buffer=None,
        up_scale_prefetch_buffer=None,
        down_scale_prefetch_buffer=None,
    ):
        """Each owner writes its experts' weights into every prefetch slot the plan gives
        them: rank d's slot b (``experts_to_copy[d, b]``) is ``buffer[d, b]`` of rank
        d's copy of the symmetric ``[R, epn, ...]`` buffer (``mori.core.shmem.empty``).
        Weights [epn, H, H'] of any dtype, scales optional. Slots no expert uses are
        untouched. Returns None, or an event with ``async_finish``."""
        self._require()
        self._not_capturing("prefetch_weight")
        pairs = [
            ("gate_weight", local_gate_weight, gate_prefetch_buffer),
            ("up_weight", local_up_weight, up_prefetch_buffer),
            ("down_weight", local_down_weight, down_prefetch_buffer),
            ("gate_scale", local_gate_scale, gate_scale_prefetch_buffer),
            ("up_scale", local_up_scale, up_scale_prefetch_buffer),
            ("down_scale", local_down_scale, down_scale_prefetch_buffer),
        ]
        locals_, pools, sizes, reason = self._pool_pairs("prefetch_weight", plan, pairs, False)
        if reason:
            self._refuse("prefetch_weight", reason)
        self._impl.prefetch(plan.experts_to_copy.data_ptr(), locals_, pools, sizes, "",
                            self.prefetch_engine == "copy", self._stream())  # fmt: skip
        return self._event() if async_finish else None

    def reduce_grad(
        self,
        plan: Plan | None = None,
        async_finish: bool = False,
        *,
        local_gate_grad=None,
        local_up_grad=None,
        local_down_grad=None,
        gate_reduce_buffer=None,
        up_reduce_buffer=None,
        down_reduce_buffer=None,
    ):
        """Each owner adds the slot gradients of its experts (``buffer[d, b]`` of every
        rank d whose slot b holds one) into its fp32 local grads [epn, H, H'], in
        ascending (d, b) order, so the result is bitwise reproducible; then every rank
        zeroes its own consumed slots. Returns None, or an event with ``async_finish``."""
        self._require()
        self._not_capturing("reduce_grad")
        pairs = [
            ("gate_grad", local_gate_grad, gate_reduce_buffer),
            ("up_grad", local_up_grad, up_reduce_buffer),
            ("down_grad", local_down_grad, down_reduce_buffer),
        ]
        locals_, pools, sizes, reason = self._pool_pairs("reduce_grad", plan, pairs, True)
        if reason:
            self._refuse("reduce_grad", reason)
        self._impl.reduce_grad(plan.experts_to_copy.data_ptr(), locals_, pools, sizes, "",
                               self._stream())  # fmt: skip
        return self._event() if async_finish else None
