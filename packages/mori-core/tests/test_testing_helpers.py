# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.core.testing, the helpers every package's tests use: GPU skips that name why,
the rank launcher (multicast off, every rank checked, a hang fails the test) and the
device-trap harness."""

import sys

import pytest

from mori.core.launch import WorkersFailed
from mori.core.testing import (
    cuda_skip_reason,
    needs_cuda,
    new_seed,
    require_cuda,
    run_ranks,
    seconds_of,
    trap_outcomes,
    visible_gpus,
)


def test_gpu_skips_name_their_reason():
    reason = cuda_skip_reason()
    assert reason is None or reason  # a reason is never empty
    mark = needs_cuda()
    assert mark.mark.name == "skipif" and mark.mark.kwargs["reason"] == (reason or "")
    if reason is None:
        assert require_cuda() >= 1 and visible_gpus() >= 1
    else:
        with pytest.raises(pytest.skip.Exception, match=reason):
            require_cuda()
    many = cuda_skip_reason(min_gpus=1 << 20)
    assert many  # nobody has a million GPUs
    if reason is None:
        assert "needs 1048576 GPUs" in many


def test_run_ranks_checks_every_rank_and_turns_multicast_off(capsys):
    assert 0 <= new_seed() < 1 << 30
    code = (
        "import os; r = os.environ['RANK']; "
        "print('nvls', os.environ['NCCL_NVLS_ENABLE'], os.environ['EXTRA']); print(f'rank {r} ok')"
    )
    results = run_ranks([sys.executable, "-c", code], 3, timeout_s=60, env={"EXTRA": "x"})
    assert [r.rank for r in results] == [0, 1, 2]
    assert all("nvls 0 x" in r.output for r in results)
    assert "----- rank 2 -----" in capsys.readouterr().out
    pe = "import os; print(f\"pe {os.environ['RANK']} ok\")"
    run_ranks([sys.executable, "-c", pe], 2, timeout_s=60, who="pe")
    quiet = "import os; print('rank', os.environ['RANK'], 'done')"
    with pytest.raises(AssertionError, match="done"):
        run_ranks([sys.executable, "-c", quiet], 2, timeout_s=60)


def test_run_ranks_fails_a_hung_rank_within_its_timeout():
    code = "import os, time; time.sleep(60) if os.environ['RANK'] == '1' else print('rank 0 ok')"
    with pytest.raises(WorkersFailed, match="timed out after 2s"):
        run_ranks([sys.executable, "-c", code], 2, timeout_s=2)


def test_trap_outcomes_read_each_ranks_report(tmp_path):
    worker = tmp_path / "fake_trap_worker.py"
    worker.write_text(
        "import os, sys\n"
        "from mori.core.testing import trap_report\n"
        "rank = int(os.environ['RANK'])\n"
        "trap_report(rank, f'CUDA error after {rank + 0.5}s: {sys.argv[1]} {sys.argv[2]}')\n"
        "print('never printed')\n"
    )
    (o0, out0), (o1, out1) = trap_outcomes(worker, "some_case", gpus=0)
    assert o0 == "CUDA error after 0.5s: some_case shared" and "never printed" not in out0
    assert o1.startswith("CUDA error after 1.5s") and out1.strip().endswith("rank 1 ok")
    assert (seconds_of(o0), seconds_of(o1)) == (0.5, 1.5)
    _, (o1, _) = trap_outcomes(worker, "other", gpus=2)
    assert o1.endswith("other per_gpu")


def test_start_rank_joins_the_group_on_a_host_heap():
    pytest.importorskip("torch")
    code = (
        "import torch.distributed as dist; from mori.core import shmem; "
        "from mori.core.testing import start_rank; "
        "rank, world, dev = start_rank('cpu', '4M', 30); "
        "assert (world, dev.type, dist.get_world_size()) == (2, 'cpu', 2); "
        "assert shmem.initialized(); shmem.barrier_all(); shmem.finalize(); "
        "dist.destroy_process_group(); print(f'rank {rank} ok')"
    )
    run_ranks([sys.executable, "-c", code], 2, timeout_s=120)
