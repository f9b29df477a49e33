# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Combine is bit-transparent for a token with one contributing row (-0.0, NaN
payloads, infinities come back unchanged; weights too), a sum of -0.0 parts is -0.0,
a token with no expert gives +0.0; DeepEP's weighted combine keeps the bits of a
single weight-1.0 part except NaNs. CPU implementation at world 2
(tests/workers/ep_bits_worker.py; the CUDA kernels: test_combine_bits_gpu.py)."""


def test_single_destination_tokens_combine_bit_for_bit(run_workers):
    run_workers("ep_bits_worker.py", "cpu", timeout_s=180)
