# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The CUDA kernels' receive cap (max_total_recv_tokens), combine of fp8 e4m3 input
and MORI's fp8_direct_cast, bit for bit against torch's conversions (the references
the CPU implementation matches in test_mori_compat.py), on every combine path and
both dispatch kernels (tests/workers/ep_fp8_cap_worker.py). A dispatch past the cap
is a trap: test_device_traps_gpu.py.

Skipped without a CUDA GPU or a mori build without CUDA.
"""

from mori.core.launch import NO_MULTICAST_ENV


def test_cap_fp8_combine_and_cast(gpu_placement, run_workers):
    run_workers("ep_fp8_cap_worker.py", gpu_placement, env=NO_MULTICAST_ENV)
