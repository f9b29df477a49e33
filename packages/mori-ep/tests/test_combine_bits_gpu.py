# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""test_combine_bits.py's scenarios on the CUDA kernels: the intra-node combine on every
combine path, with aligned and unaligned rows, the low-latency token-major combine and
DeepEP's weighted combine (tests/workers/ep_bits_worker.py).

Skipped without a CUDA GPU or a mori build without CUDA.
"""

from mori.core.launch import NO_MULTICAST_ENV


def test_single_destination_tokens_combine_bit_for_bit(gpu_placement, run_workers):
    run_workers("ep_bits_worker.py", gpu_placement, env=NO_MULTICAST_ENV)
