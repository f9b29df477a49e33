# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MORI's routing handles on the CUDA kernels: the scenarios of test_routing_handles.py
that raise no device-side rejection (a rejection traps the peers' kernels), on each
combine path (forced through the environment the op reads when it is built).

Skipped without a CUDA GPU or a mori build without CUDA.
"""

import pytest

from mori.core.launch import NO_MULTICAST_ENV

PATHS = {
    "onepass": {"MORI_EP_COMBINE_ONEPASS_ROWS": "1000000"},
    "stream": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0"},
    "tiled": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0", "MORI_EP_COMBINE_STREAM": "0"},
}
SCENARIOS = "parity,replay,inflight,order"


@pytest.mark.parametrize("path", sorted(PATHS))
def test_routing_handles(gpu_placement, run_workers, path):
    env = {**NO_MULTICAST_ENV, **PATHS[path]}
    run_workers("ep_routing_worker.py", gpu_placement, SCENARIOS, env=env)
