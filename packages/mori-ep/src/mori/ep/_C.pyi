# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Type stubs for mori.ep._C (pointers are integers: tensor.data_ptr())."""

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
        rank_masks: int = 0,
        row_tag: int = 0,
    ) -> int: ...
    def reject_dispatch(self, reason: str) -> None: ...
    def combine(
        self,
        input: int,
        input_row_stride: int,
        input_rows: int,
        dtype: int,
        weights: int,
        out: int,
        out_weights: int,
        fp8_cast: bool = False,
        routing: list[int] | None = None,
    ) -> None: ...
    def reject_combine(self, reason: str, routing: list[int] | None = None) -> None: ...
    @property
    def total_recv(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def combined_epoch(self) -> int: ...
    @property
    def combine_pending(self) -> bool: ...

class IntraNodeCuda:
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
    ) -> None: ...
    def reject_combine(
        self, reason: str, stream: int, routing: list[int] | None = None
    ) -> None: ...
    def max_resident_blocks(self, dispatch: bool, warps: int, fp8_wire: bool = False) -> int: ...
    def timeline(self) -> str: ...
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
) -> dict[str, int]: ...

class LowLatencyCpu:
    """Low-latency dispatch/combine (fixed slots, double-buffered) on a host heap."""

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
        timeout_s: float,
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
    ) -> None: ...
    def reject_dispatch(self, reason: str) -> None: ...
    def dispatch_recv_token_major(
        self,
        out_tokens: int,
        out_weights: int,
        out_scales: int,
        out_indices: int,
        out_src_pos: int,
        total_recv: int,
    ) -> int: ...
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
    ) -> int: ...
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
    ) -> None: ...
    def reject_combine(self, reason: str) -> None: ...
    def combine_recv(self) -> None: ...
    @property
    def dispatch_calls(self) -> int: ...
    @property
    def combine_calls(self) -> int: ...
    @property
    def dispatch_recv_pending(self) -> bool: ...
    @property
    def combine_recv_pending(self) -> bool: ...
    @property
    def num_tokens(self) -> int: ...

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
        rank_masks: int = 0,
        row_tag: int = 0,
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
    ) -> int: ...
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
    ) -> int: ...
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
        routing: list[int] | None = None,
    ) -> None: ...
    def reject_combine(
        self, reason: str, stream: int, routing: list[int] | None = None
    ) -> None: ...
    def combine_recv(self, block_num: int, warp_per_block: int, stream: int) -> None: ...
    @property
    def num_tokens(self) -> int: ...
