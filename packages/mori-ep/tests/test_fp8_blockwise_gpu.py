# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""quant_type="fp8_blockwise" on the CUDA kernels: IntraNode (every combine path, both
thread builds, aligned and unaligned input), IntraNodeLL (with and without the copy
engines) and AsyncLL, on shapes that take every kernel path (word-parallel blocks of
128 and 256 columns, a short last block, the column-by-column kernels), bit for bit
against the torch reference the CPU implementation matches bit for bit
(test_fp8_blockwise.py); the bytes a row crosses as; dispatch + combine captured in a
CUDA graph and replayed (tests/workers/ep_fp8_blockwise_gpu_worker.py).

Skipped without a CUDA GPU or a mori build without CUDA.
"""

from mori.core.launch import NO_MULTICAST_ENV


def test_fp8_blockwise_combine_on_cuda(gpu_placement, run_workers):
    run_workers("ep_fp8_blockwise_gpu_worker.py", gpu_placement, env=NO_MULTICAST_ENV,
                timeout_s=600)  # fmt: skip
