# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""MORI's routing handles on the CUDA kernels: the scenarios of test_routing_handles.py
that raise no device-side rejection (a rejection traps the peers' kernels), on each
combine path (forced through the environment the op reads when it is built).

Skipped without a CUDA GPU or a mori build without CUDA.
"""

import random
from pathlib import Path

import pytest

from mori.core.launch import NO_MULTICAST_ENV, launch_local

WORKER = str(Path(__file__).parent / "workers" / "ep_routing_worker.py")


def run_scenario(placement: str, scenario: str, env: dict) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    results = launch_local([WORKER, placement, scenario, str(seed)], 2, timeout_s=300, env=env)
    for r in results:
        print(f"----- rank {r.rank} -----\n{r.output}")
        assert r.output.strip().endswith(f"rank {r.rank} ok"), r.output


PATHS = {
    "onepass": {"MORI_EP_COMBINE_ONEPASS_ROWS": "1000000"},
    "stream": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0"},
    "tiled": {"MORI_EP_COMBINE_ONEPASS_ROWS": "0", "MORI_EP_COMBINE_STREAM": "0"},
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("scenario", ["parity", "replay", "inflight", "order"])
def test_two_processes_one_gpu(cuda_gpus, scenario, path):
    run_scenario("shared", scenario, {**NO_MULTICAST_ENV, **PATHS[path]})


@pytest.mark.parametrize("scenario", ["parity", "replay", "inflight", "order"])
def test_one_process_per_gpu(cuda_gpus, scenario):
    if cuda_gpus < 2:
        pytest.skip("needs 2 GPUs")
    run_scenario("per_gpu", scenario, NO_MULTICAST_ENV)
