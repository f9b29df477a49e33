# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Type stubs for mori.ccl._C (pointers are integers: tensor.data_ptr())."""

__mori_core_version_compiled__: str
with_cuda: bool

def reduce_sum_cpu(dtype: str, dst: int, srcs: list[int], count: int) -> None: ...
def ccl_block_bytes(world_size: int, max_bytes: int) -> int: ...
def ccl_cuda_block_bytes(world_size: int, max_bytes: int) -> int: ...

cuda_max_blocks: int
cuda_max_world_size: int

class CommunicatorCpu:
    def __init__(
        self,
        block: int,
        max_bytes: int,
        timeout_s: float,
        pes: list[int] = ...,
        zero_copy: bool = ...,
    ) -> None: ...
    def all_reduce(
        self, src: int, dst: int, count: int, dtype: str, op: str, algorithm: str
    ) -> None: ...
    def all_gather(self, src: int, dst: int, bytes: int, dtype: str) -> None: ...
    def reduce_scatter(self, src: int, dst: int, count: int, dtype: str, op: str) -> None: ...
    def all_to_all(
        self,
        src: int,
        dst: int,
        row_bytes: int,
        in_rows: list[int],
        out_rows: list[int],
        dtype: str,
    ) -> None: ...
    def broadcast(self, buf: int, bytes: int, dtype: str, root: int) -> None: ...
    def barrier(self) -> None: ...
    def reject(self, kind: str, reason: str) -> None: ...
    @property
    def epoch(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...

# Built only with CUDA (with_cuda is True).
class CommunicatorCuda:
    def __init__(
        self,
        block: int,
        max_bytes: int,
        device: int,
        timeout_s: float,
        max_blocks: int,
        pes: list[int] = ...,
        zero_copy: bool = ...,
    ) -> None: ...
    def all_reduce(
        self,
        src: int,
        dst: int,
        count: int,
        dtype: str,
        op: str,
        algorithm: str,
        max_blocks: int,
        stream: int,
    ) -> None: ...
    def all_gather(
        self,
        src: int,
        dst: int,
        bytes: int,
        dtype: str,
        algorithm: str,
        max_blocks: int,
        stream: int,
    ) -> None: ...
    def reduce_scatter(
        self, src: int, dst: int, count: int, dtype: str, op: str, max_blocks: int, stream: int
    ) -> None: ...
    def all_to_all(
        self,
        src: int,
        dst: int,
        row_bytes: int,
        src_rows: int,
        dst_rows: int,
        in_splits: int,
        out_splits: int,
        dtype: str,
        algorithm: str,
        max_blocks: int,
        stream: int,
    ) -> None: ...
    def broadcast(
        self, buf: int, bytes: int, dtype: str, root: int, max_blocks: int, stream: int
    ) -> None: ...
    def barrier(self, stream: int) -> None: ...
    def reject(self, reason: str, stream: int) -> None: ...
    def blocks_for(self, bytes: int, max_blocks: int) -> int: ...
    @property
    def calls(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def max_blocks(self) -> int: ...
    @property
    def ll_max_bytes(self) -> int: ...
    @property
    def zero_copy(self) -> bool: ...
    @property
    def zero_copy_calls(self) -> int: ...
