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
