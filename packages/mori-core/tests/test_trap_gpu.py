# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A kernel that fails its launch as mori's kernels do (prints why, then traps) is seen
by its host as a CUDA error within seconds — also when two processes sharing the GPU
trap at the same moment, and while another stream of the process copies and waits,
as a proxy's lane does (tests/workers/trap_probe_worker.py). The inter-node EP trap
tests saw a rank whose kernel had printed its trap while its host's synchronize
never returned. On 1 x H200 (driver 580.159.04) the "together" cases do the same with
this bare kernel: the process that trapped first may never see it
(mori.core.testing.SHARED_GPU_LOST_TRAP). Such a trial is counted and the case ends
as xfail naming it; any other failure fails. Skipped
without a CUDA GPU or a libmori_core built without CUDA."""

from pathlib import Path

import pytest

from mori.core.launch import WorkersFailed
from mori.core.testing import (
    SHARED_GPU_LOST_TRAP,
    lost_trap_on_shared_gpu,
    outcome_of,
    require_cuda,
    run_ranks,
    seconds_of,
)

pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "trap_probe_worker.py")
TRIALS = 4


@pytest.mark.parametrize("case", ["alone", "together", "together_copies"])
def test_a_trap_reaches_its_host_within_seconds(case):
    require_cuda()
    lost = 0
    for trial in range(TRIALS):
        try:
            # Past the worker's 45 s stack dump, so a hung rank shows where it waits.
            results = run_ranks([WORKER, case], 2, timeout_s=50)
        except WorkersFailed as e:
            probes = {r: f"mori trap probe {r}: trapping at" for r in (0, 1)}
            if case != "alone" and lost_trap_on_shared_gpu(e, probes):
                lost += 1
                continue
            raise
        for r in results:
            outcome = outcome_of(r)
            if case == "alone" and r.rank == 1:
                assert outcome == "no trap", (trial, outcome)
                continue
            assert outcome.startswith("CUDA error"), (trial, r.output)
            assert f"mori trap probe {r.rank}: trapping at" in r.output, (trial, r.output)
            assert seconds_of(outcome) < 10.0, (trial, outcome)
    if lost:
        # Below mori (a bare trap kernel): recorded, not failed; every other trial
        # and every rank's message were checked above.
        pytest.xfail(f"{lost} of {TRIALS} trials: {SHARED_GPU_LOST_TRAP}")


def test_the_probe_names_what_it_needs_on_a_build_without_cuda():
    import mori.core as mc

    if mc.build_info().get("with_cuda"):
        pytest.skip("this libmori_core has CUDA")
    with pytest.raises(mc.NotSupportedError, match="trap probe kernel needs CUDA"):
        mc._C._trap_probe(0, 0)
    with pytest.raises(mc.NotSupportedError, match="global timer kernel needs CUDA"):
        mc._C._gpu_globaltimer_ns(0)
