# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Type stubs for mori.ccl._C (pointers are integers: tensor.data_ptr())."""

__mori_core_version_compiled__: str

def reduce_sum_cpu(dtype: str, dst: int, srcs: list[int], count: int) -> None: ...
