# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Type stubs for mori.ep._C (pointers are integers: tensor.data_ptr())."""

from typing import Any

__mori_core_version_compiled__: str
with_cuda: bool

def dispatch_layout_cpu(
    indices: int,
    num_tokens: int,
    top_k: int,
    num_experts: int,
    world_size: int,
    tokens_per_rank: int,
    tokens_per_expert: int,
    token_in_rank: int,
) -> None: ...
def dispatch_layout_cuda(
    indices: int,
    num_tokens: int,
    top_k: int,
    num_experts: int,
    world_size: int,
    tokens_per_rank: int,
    tokens_per_expert: int,
    token_in_rank: int,
    error_record: int,
    stream: int,
) -> None: ...
def local_expert_count_cpu(
    indices: int, total_recv: int, rank: int, num_experts_per_rank: int, top_k: int, counts: int
) -> None: ...
def local_expert_count_cuda(
    indices: int,
    total_recv: int,
    rank: int,
    num_experts_per_rank: int,
    top_k: int,
    counts: int,
    blocks: int,
    threads: int,
    stream: int,
) -> None: ...

class EpDispatchCombineConfig:
    """ROCm/mori's raw dispatch/combine config (mori.cpp.EpDispatchCombineConfig)."""

    rank: int
    world_size: int
    hidden_dim: int
    scale_dim: int
    scale_type_size: int
    max_token_type_size: int
    max_num_inp_token_per_rank: int
    num_experts_per_rank: int
    num_experts_per_token: int
    max_total_recv_tokens: int
    warp_num_per_block: int
    block_num: int
    use_external_inp_buf: bool
    kernel_type: Any  # reads EpDispatchCombineKernelType, takes it or its int value
    gpu_per_node: int
    rdma_block_num: int
    num_qp_per_pe: int
    quant_type: Any  # reads EpDispatchCombineQuantType, takes it or its int value
    def __init__(
        self,
        rank: int = 0,
        world_size: int = 0,
        hidden_dim: int = 0,
        scale_dim: int = 0,
        scale_type_size: int = 0,
        max_token_type_size: int = 0,
        max_num_inp_token_per_rank: int = 0,
        num_experts_per_rank: int = 0,
        num_experts_per_token: int = 0,
        max_total_recv_tokens: int = 0,
        warp_num_per_block: int = 0,
        block_num: int = 0,
        use_external_inp_buf: bool = True,
        kernel_type: int = 0,
        gpu_per_node: int = 8,
        rdma_block_num: int = 0,
        num_qp_per_pe: int = 1,
        quant_type: int = 0,
    ) -> None: ...
    def max_num_tokens_to_send_per_rank(self) -> int: ...
    def max_num_tokens_to_send(self) -> int: ...
    def max_num_tokens_to_recv_per_rank(self) -> int: ...
    def max_num_tokens_to_recv(self) -> int: ...

def launch_local_expert_count(
    config: EpDispatchCombineConfig,
    indices_ptr: int,
    total_recv_token_num_ptr: int,
    local_expert_count_ptr: int,
    block_num: int = -1,
    warp_per_block: int = -1,
    stream: int = 0,
) -> None: ...

ep_max_tokens_per_rank: int
ep_combine_group_tokens: int

def ep_buffer_layout(
    world_size: int,
    rank: int,
    max_tokens: int,
    top_k: int,
    hidden_dim: int,
    max_token_type_size: int,
    scale_bytes: int,
    num_experts_per_rank: int,
    recv_capacity: int = 0,
) -> dict[str, int]: ...

class IntraNodeCpu:
    """Intra-node dispatch/combine on a host symmetric heap. Its methods take the same
    arguments as :class:`IntraNodeCuda`'s; the launch shape, the stream and the device
    are ignored (a call has finished when it returns)."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        max_tokens: int,
        top_k: int,
        hidden_dim: int,
        max_token_type_size: int,
        scale_bytes: int,
        num_experts_per_rank: int,
        block: int,
        device: int,
        timeout_s: float,
        recv_capacity: int = 0,
    ) -> None: ...
    def dispatch(
        self,
        tokens: int,
        token_row_bytes: int,
        weights: int,
        scales: int,
        indices: int,
        num_tokens: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
        rank_masks: int = 0,
        row_tag: int = 0,
    ) -> None: ...
    def reject_dispatch(self, reason: str, stream: int) -> None: ...
    def combine(
        self,
        input: int,
        input_row_stride: int,
        input_rows: int,
        dtype: int,
        weights: int,
        out: int,
        out_weights: int,
        fp8_cast: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        routing: list[int] | None = None,
        fp8_block_scale_dim: int = 0,
    ) -> None: ...
    def reject_combine(
        self, reason: str, stream: int, routing: list[int] | None = None
    ) -> None: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def combined_epoch(self) -> int: ...
    @property
    def combine_pending(self) -> bool: ...

class IntraNodeCuda:
    """Intra-node dispatch/combine kernels on a CUDA symmetric heap (present when
    mori.ep was built with CUDA): every call enqueues on ``stream``, no host sync."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        max_tokens: int,
        top_k: int,
        hidden_dim: int,
        max_token_type_size: int,
        scale_bytes: int,
        num_experts_per_rank: int,
        block: int,
        device: int,
        timeout_s: float,
        recv_capacity: int = 0,
    ) -> None: ...
    def dispatch(
        self,
        tokens: int,
        token_row_bytes: int,
        weights: int,
        scales: int,
        indices: int,
        num_tokens: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
        rank_masks: int = 0,
        row_tag: int = 0,
    ) -> None: ...
    def reject_dispatch(self, reason: str, stream: int) -> None: ...
    def combine(
        self,
        input: int,
        input_row_stride: int,
        input_rows: int,
        dtype: int,
        weights: int,
        out: int,
        out_weights: int,
        fp8_cast: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        routing: list[int] | None = None,
        fp8_block_scale_dim: int = 0,
    ) -> None: ...
    def reject_combine(
        self, reason: str, stream: int, routing: list[int] | None = None
    ) -> None: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def combined_epoch(self) -> int: ...
    @property
    def combine_pending(self) -> bool: ...
    def max_resident_blocks(
        self, dispatch: bool, warps: int, fp8_wire: bool = False, fp8_blockwise: bool = False
    ) -> int: ...
    def timeline(self) -> str: ...

def heap_all_gather_i64(mine: list[int]) -> list[list[int]]:
    """Collective over the heap's bootstrap: every pe's int64 list, in pe order."""

def internode_buffer_layout(
    world_size: int,
    rank: int,
    max_tokens: int,
    top_k: int,
    hidden_dim: int,
    max_token_type_size: int,
    scale_bytes: int,
    num_experts_per_rank: int,
    recv_capacity: int,
    kind: int,
    local_size: int,
    device: bool = False,
) -> dict[str, int]: ...

class InterNodeCpu:
    """Inter-node dispatch/combine (kind 1 InterNode, 2 InterNodeV1, 3 InterNodeV1LL) on a
    host symmetric heap, ranks [n * local_size, (n + 1) * local_size) forming node n; the
    inter-node leg through mori-core's proxy (link "proxy") or the heap ("heap"). The
    calls take IntraNodeCpu's arguments."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        max_tokens: int,
        top_k: int,
        hidden_dim: int,
        max_token_type_size: int,
        scale_bytes: int,
        num_experts_per_rank: int,
        block: int,
        device: int,
        timeout_s: float,
        recv_capacity: int,
        kind: int,
        local_size: int,
        link: str = "proxy",
    ) -> None: ...
    def dispatch(
        self,
        tokens: int,
        token_row_bytes: int,
        weights: int,
        scales: int,
        indices: int,
        num_tokens: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
        rank_masks: int = 0,
        row_tag: int = 0,
    ) -> None: ...
    def reject_dispatch(self, reason: str, stream: int) -> None: ...
    def combine(
        self,
        input: int,
        input_row_stride: int,
        input_rows: int,
        dtype: int,
        weights: int,
        out: int,
        out_weights: int,
        fp8_cast: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        routing: list[int] | None = None,
        fp8_block_scale_dim: int = 0,
    ) -> None: ...
    def reject_combine(
        self, reason: str, stream: int, routing: list[int] | None = None
    ) -> None: ...
    def bytes(self, phase: str) -> dict[str, int]: ...
    def replay_link(self, phase: str) -> float: ...
    @property
    def link_name(self) -> str: ...
    @property
    def local_size(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def combined_epoch(self) -> int: ...
    @property
    def combine_pending(self) -> bool: ...

class InterNodeCuda:
    """Inter-node dispatch/combine kernels (the kinds of InterNodeCpu) on a CUDA symmetric
    heap (a CUDA build only): this node's ranks by load/store, other nodes through
    mori-core's proxy, the kernels pushing its commands. The calls take InterNodeCpu's
    arguments and enqueue on ``stream``; ``bytes`` synchronises the last call's stream."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        max_tokens: int,
        top_k: int,
        hidden_dim: int,
        max_token_type_size: int,
        scale_bytes: int,
        num_experts_per_rank: int,
        block: int,
        device: int,
        timeout_s: float,
        recv_capacity: int,
        kind: int,
        local_size: int,
    ) -> None: ...
    def dispatch(
        self,
        tokens: int,
        token_row_bytes: int,
        weights: int,
        scales: int,
        indices: int,
        num_tokens: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
        rank_masks: int = 0,
        row_tag: int = 0,
    ) -> None: ...
    def reject_dispatch(self, reason: str, stream: int) -> None: ...
    def combine(
        self,
        input: int,
        input_row_stride: int,
        input_rows: int,
        dtype: int,
        weights: int,
        out: int,
        out_weights: int,
        fp8_cast: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        routing: list[int] | None = None,
        fp8_block_scale_dim: int = 0,
    ) -> None: ...
    def reject_combine(
        self, reason: str, stream: int, routing: list[int] | None = None
    ) -> None: ...
    def bytes(self, phase: str) -> dict[str, int]: ...
    @property
    def link_name(self) -> str: ...
    @property
    def local_size(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def combined_epoch(self) -> int: ...
    @property
    def combine_pending(self) -> bool: ...

def ll_buffer_layout(
    world_size: int,
    rank: int,
    max_tokens: int,
    top_k: int,
    hidden_dim: int,
    max_token_type_size: int,
    scale_bytes: int,
    num_experts_per_rank: int,
    recv_capacity: int = 0,
) -> dict[str, int]: ...

class LowLatencyCpu:
    """Low-latency dispatch/combine (fixed slots, double-buffered) on a host heap. Its
    methods take the same arguments as :class:`LowLatencyCuda`'s; the launch shape,
    the stream, the device and ``fuse`` are ignored (a call has finished when it
    returns)."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        max_tokens: int,
        top_k: int,
        hidden_dim: int,
        max_token_type_size: int,
        scale_bytes: int,
        num_experts_per_rank: int,
        block: int,
        device: int,
        timeout_s: float,
        recv_capacity: int = 0,
    ) -> None: ...
    def dispatch_send(
        self,
        layout: int,
        tokens: int,
        token_row_bytes: int,
        weights: int,
        scales: int,
        indices: int,
        num_tokens: int,
        fp8_cast: bool,
        round_scale: bool,
        fuse: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        dtype_tag: int = 0,
    ) -> None: ...
    def reject_dispatch(self, reason: str, stream: int) -> None: ...
    def dispatch_recv_token_major(
        self,
        out_tokens: int,
        out_weights: int,
        out_scales: int,
        out_indices: int,
        out_src_pos: int,
        total_recv: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
    ) -> None: ...
    def dispatch_recv_expert_major(
        self,
        packed_x: int,
        packed_scales: int,
        ue8m0: bool,
        packed_count: int,
        src_info: int,
        src_info_stride: int,
        layout_range: int,
        slot_k: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
    ) -> None: ...
    def combine_send_token_major(
        self,
        input: int,
        input_row_stride: int,
        input_rows: int,
        dtype: int,
        weights: int,
        src_pos: int,
        total_recv: int,
        out: int,
        out_weights: int,
        fp8_cast: bool,
        fuse: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        fp8_block_scale_dim: int = 0,
    ) -> None: ...
    def combine_send_expert_major(
        self,
        input: int,
        input_row_stride: int,
        src_info: int,
        src_info_stride: int,
        layout_range: int,
        slot_k: int,
        topk_idx: int,
        topk_weights: int,
        num_tokens: int,
        out: int,
        fuse: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        pre_reduce: bool = False,
    ) -> None: ...
    def reject_combine(self, reason: str, stream: int) -> None: ...
    def combine_recv(self, block_num: int, warp_per_block: int, stream: int) -> None: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def pre_reduce(self) -> bool: ...
    @property
    def dispatch_calls(self) -> int: ...
    @property
    def combine_calls(self) -> int: ...
    @property
    def dispatch_recv_pending(self) -> bool: ...
    @property
    def combine_recv_pending(self) -> bool: ...

class LowLatencyCuda:
    """Low-latency dispatch/combine kernels (fixed slots, double-buffered) on a CUDA heap;
    present when mori.ep was built with CUDA."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        max_tokens: int,
        top_k: int,
        hidden_dim: int,
        max_token_type_size: int,
        scale_bytes: int,
        num_experts_per_rank: int,
        block: int,
        device: int,
        timeout_s: float,
        recv_capacity: int = 0,
    ) -> None: ...
    def dispatch_send(
        self,
        layout: int,
        tokens: int,
        token_row_bytes: int,
        weights: int,
        scales: int,
        indices: int,
        num_tokens: int,
        fp8_cast: bool,
        round_scale: bool,
        fuse: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        dtype_tag: int = 0,
    ) -> None: ...
    def reject_dispatch(self, reason: str, stream: int) -> None: ...
    def dispatch_recv_token_major(
        self,
        out_tokens: int,
        out_weights: int,
        out_scales: int,
        out_indices: int,
        out_src_pos: int,
        total_recv: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
    ) -> None: ...
    def dispatch_recv_expert_major(
        self,
        packed_x: int,
        packed_scales: int,
        ue8m0: bool,
        packed_count: int,
        src_info: int,
        src_info_stride: int,
        layout_range: int,
        slot_k: int,
        block_num: int,
        warp_per_block: int,
        stream: int,
    ) -> None: ...
    def combine_send_token_major(
        self,
        input: int,
        input_row_stride: int,
        input_rows: int,
        dtype: int,
        weights: int,
        src_pos: int,
        total_recv: int,
        out: int,
        out_weights: int,
        fp8_cast: bool,
        fuse: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        fp8_block_scale_dim: int = 0,
    ) -> None: ...
    def combine_send_expert_major(
        self,
        input: int,
        input_row_stride: int,
        src_info: int,
        src_info_stride: int,
        layout_range: int,
        slot_k: int,
        topk_idx: int,
        topk_weights: int,
        num_tokens: int,
        out: int,
        fuse: bool,
        block_num: int,
        warp_per_block: int,
        stream: int,
        pre_reduce: bool = False,
    ) -> None: ...
    def reject_combine(self, reason: str, stream: int) -> None: ...
    def combine_recv(self, block_num: int, warp_per_block: int, stream: int) -> None: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def pre_reduce(self) -> bool: ...
    @property
    def copy_engine(self) -> bool: ...
    def timeline(self) -> str: ...

# -- balanced mode (csrc/balanced/) ------------------------------------------------------
# A table set is 6 addresses in PlanTables order (alloc, expert_offsets, cu_seqlens,
# zero_fill, experts_to_copy, remote_stats); a rank plan 6 in RankPlan order (dst,
# experts_to_copy, zero_fill, dup_groups, dup_loffs, dup_counts).

def balanced_nvs(ranks: int, experts: int, tokens: int, top_k: int, token_padding: int) -> int: ...
def balanced_block_layout(
    ranks: int, experts: int, tokens: int, top_k: int, token_padding: int, hidden: int
) -> dict[str, int]: ...
def balanced_plan_tables_cpu(
    ranks: int, experts: int, tokens: int, top_k: int, token_padding: int, tpe: int,
    tables: list[int],
) -> None: ...  # fmt: skip
def balanced_plan_destinations_cpu(
    ranks: int, experts: int, tokens: int, top_k: int, token_padding: int, tpe: int,
    tables: list[int], rank: int, topk: int, dst: int,
) -> None: ...  # fmt: skip
def balanced_duplicate_tables_cpu(
    ranks: int, experts: int, tokens: int, top_k: int, token_padding: int, dst_all: int,
    dest: int, dup_src: int, groups: int, loffs: int, counts: int,
) -> None: ...  # fmt: skip
def balanced_plan_cuda(
    ranks: int, experts: int, tokens: int, top_k: int, token_padding: int, tpe: int, topk: int,
    rank: int, tables: list[int], dst: int, error: int, scratch: int, stream: int,
) -> None: ...  # fmt: skip
def balanced_planner_scratch_words(
    ranks: int, experts: int, tokens: int, top_k: int, token_padding: int
) -> int: ...

class BalancedCpu:
    """The balanced mode's data paths on a host heap (collective calls; a non-empty
    reason refuses the call on every rank). Its methods take the same arguments as
    :class:`BalancedCuda`'s; the device and the stream are ignored."""

    def __init__(
        self, ranks: int, experts: int, tokens: int, top_k: int, token_padding: int,
        hidden: int, rank: int, block: int, device: int, timeout_s: float,
    ) -> None: ...  # fmt: skip
    def plan(
        self, tpe: int, topk: int, reason: str, tables: list[int], dst: int, stream: int
    ) -> None: ...
    def dispatch(
        self, plan: list[int], hidden: int, row_stride: int, weights: int, fresh: bool,
        reason: str, stream: int,
    ) -> None: ...  # fmt: skip
    def combine(
        self, plan: list[int], hidden_nvsh: int, weights_nvs: int, out: int, out_weights: int,
        reason: str, stream: int,
    ) -> None: ...  # fmt: skip
    def prefetch(
        self, experts_to_copy: int, locals: list[int], pools: list[int], bytes: list[int],
        reason: str, copy_engine: bool, stream: int,
    ) -> None: ...  # fmt: skip
    def reduce_grad(
        self, experts_to_copy: int, locals: list[int], pools: list[int], elems: list[int],
        reason: str, stream: int,
    ) -> None: ...  # fmt: skip
    def refuse(self, op: str, reason: str, stream: int) -> None: ...
    @property
    def calls(self) -> int: ...

class BalancedCuda:
    """The balanced mode's data paths as CUDA kernels on `stream` (no host
    synchronisation; a refusal raises here and traps the other ranks' kernels)."""

    def __init__(
        self, ranks: int, experts: int, tokens: int, top_k: int, token_padding: int,
        hidden: int, rank: int, block: int, device: int, timeout_s: float,
    ) -> None: ...  # fmt: skip
    def plan(
        self, tpe: int, topk: int, reason: str, tables: list[int], dst: int, stream: int
    ) -> None: ...
    def dispatch(
        self, plan: list[int], hidden: int, row_stride: int, weights: int, fresh: bool,
        reason: str, stream: int,
    ) -> None: ...  # fmt: skip
    def combine(
        self, plan: list[int], hidden_nvsh: int, weights_nvs: int, out: int, out_weights: int,
        reason: str, stream: int,
    ) -> None: ...  # fmt: skip
    def prefetch(
        self, experts_to_copy: int, locals: list[int], pools: list[int], bytes: list[int],
        reason: str, copy_engine: bool, stream: int,
    ) -> None: ...  # fmt: skip
    def reduce_grad(
        self, experts_to_copy: int, locals: list[int], pools: list[int], elems: list[int],
        reason: str, stream: int,
    ) -> None: ...  # fmt: skip
    def refuse(self, op: str, reason: str, stream: int) -> None: ...
    @property
    def calls(self) -> int: ...
