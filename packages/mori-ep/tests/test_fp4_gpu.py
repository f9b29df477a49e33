# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Packed fp4 (torch.float4_e2m1fn_x2) on the CUDA kernels of IntraNode, IntraNodeLL and
AsyncLL: rows of hidden_dim and of hidden_dim / 2 bytes dispatched bit for bit, a bf16
combine of their values exact, an fp4 combine refused on every rank
(tests/workers/ep_fp4_gpu_worker.py; its checks run on a host heap in test_fp4.py).

Skipped without a CUDA GPU or a mori build without CUDA.
"""

from mori.core.launch import NO_MULTICAST_ENV


def test_fp4_dispatch_on_cuda(gpu_placement, run_workers):
    run_workers("ep_fp4_gpu_worker.py", gpu_placement, env=NO_MULTICAST_ENV, timeout_s=300)
