# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The low-latency CUDA kernels (IntraNodeLL, AsyncLL, the expert-major layout,
DeepEP's entry points) among real processes: 2 processes on one GPU, and one per GPU
when two are visible; the scenarios of test_low_latency.py (the same worker and
references, bit for bit) and CUDA-graph replays with fresh inputs. Skipped without a
CUDA GPU or a mori build without CUDA."""

import json
import sys
from pathlib import Path

import pytest

from mori.core.launch import NO_MULTICAST_ENV, launch_local
from mori.core.testing import new_seed, run_ranks

WORKER = str(Path(__file__).parent / "workers" / "ep_ll_worker.py")


def _run(mode, placement, world, iters, timeout_s=240, env=None):
    argv = [WORKER, mode, str(new_seed()), str(iters), placement]
    run_ranks(argv, world, timeout_s=timeout_s, env=env)


@pytest.mark.parametrize("mode", ["token", "expert", "graph", "cap"])
def test_two_processes_one_gpu(mode, cuda_gpus):
    _run(mode, "shared", 2, 8)


# MORI_EP_LL_COPY_ENGINE=1: every dispatch of the worker's ops moves its rows to the
# other rank with copy-engine copies (single-buffered area, consumed words): the same
# references bit for bit, eager, with receive hooks, and replayed in CUDA graphs.
@pytest.mark.parametrize("mode", ["token", "expert", "graph"])
def test_copy_engine_dispatch_two_processes_one_gpu(mode, cuda_gpus):
    _run(mode, "shared", 2, 8, env={"MORI_EP_LL_COPY_ENGINE": "1"})


# "cap": max_total_recv_tokens at, above and below the worst case (at capacity and every
# routing within the slots), on at most 4 GPUs (its "spread" routing sends a token to
# every rank, one of its 4 experts each); a rank past its slots is a trap:
# test_device_traps_gpu.py.
@pytest.mark.parametrize("mode", ["token", "expert", "graph", "cap"])
def test_one_process_per_gpu(mode, cuda_gpus):
    if cuda_gpus < 2:
        pytest.skip("needs 2 GPUs")
    world = min(cuda_gpus, 4) if mode == "cap" else cuda_gpus
    iters = {"graph": 16, "cap": 8}.get(mode, 50)  # 50 fresh-input calls
    _run(mode, "per_gpu", world, iters)


def test_bench_low_latency_kernel_types(cuda_gpus, tmp_path):
    """python -m mori.ep.bench with the low-latency kernel types beside IntraNode (graph
    replays, profiler kernel times); the token-major types' combine outputs must equal
    IntraNode's."""
    world = 2
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "mori.ep.bench", "--device", "cuda", "--world-size", str(world),
        "--max-tokens", "128", "--tokens", "1,128", "--hidden-dim", "7168",
        "--num-experts-per-token", "8", "--num-experts-per-rank", "8", "--dtype", "bf16,fp8",
        "--block-num", "24", "--iters", "3", "--reps", "3", "--no-baseline", "--json", str(out),
        "--kernel-type",
        "IntraNode,IntraNodeLL,AsyncLL,AsyncLL-ce,deepep-ll,standard-moe,standard-moe-rows",
        "--overlap",
    ]  # fmt: skip
    stdout = launch_local(cmd, world, timeout_s=420, env=dict(NO_MULTICAST_ENV))[0].output
    print(stdout[-6000:])
    assert "token-major kernel types' combine outputs identical: yes" in stdout
    recs = json.loads(out.read_text())["records"]
    impls = {r["impl"] for r in recs}
    assert {
        "mori",
        "mori IntraNodeLL",
        "mori AsyncLL",
        "mori AsyncLL-ce",
        "mori deepep-ll",
    } <= impls
    assert all(r["matches_intranode"] for r in recs if r["impl"] == "mori AsyncLL-ce")
    # top-8 on 2 ranks: standard-moe's combine sends per-rank fp32 partials, fewer
    # bytes than the bf16 expert rows of standard-moe-rows.
    for n in (1, 128):
        for dt in ("bf16", "fp8"):
            for rank in range(world):
                sel = {r["impl"]: r for r in recs
                       if r["tokens"] == n and r["dtype"] == dt and r["rank"] == rank}  # fmt: skip
                part, rows = sel["mori standard-moe"], sel["mori standard-moe-rows"]
                assert part["pre_reduce"] and not rows["pre_reduce"]
                assert part["combine_wire_bytes"] < rows["combine_wire_bytes"] or n == 1, sel


def test_bench_one_rank_timeline_and_floors(cuda_gpus, tmp_path):
    """One rank: MORI_EP_TIMELINE=1 makes the bench print each kernel type's per-phase
    stamps (the low-latency kernels' four parts: dispatch send/recv, combine send/recv,
    fused or not), and every mori row carries its floors (an empty kernel, a copy of its
    bytes, the call in plain torch), all measured on the GPU."""
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "mori.ep.bench", "--device", "cuda", "--world-size", "1",
        "--max-tokens", "16", "--tokens", "16", "--hidden-dim", "1024",
        "--num-experts-per-token", "4", "--num-experts-per-rank", "16", "--dtype", "bf16,fp8",
        "--block-num", "8", "--iters", "2", "--reps", "3", "--no-baseline", "--json", str(out),
        "--kernel-type", "IntraNode,IntraNodeLL,AsyncLL,standard-moe,deepep-ll",
    ]  # fmt: skip
    env = {**NO_MULTICAST_ENV, "MORI_EP_TIMELINE": "1"}
    stdout = launch_local(cmd, 1, timeout_s=300, env=env)[0].output
    print(stdout[-8000:])
    for impl in ("mori IntraNodeLL", "mori AsyncLL", "mori standard-moe", "mori deepep-ll"):
        at = stdout.index(f"timeline, {impl}, 16 tokens bf16")
        block = stdout[at : at + 2000]
        for part in ("dispatch send", "dispatch recv", "combine send", "combine recv"):
            assert part in block, (impl, part, block)
        assert "  flags " in block and "  rows " in block, block
    # IntraNode's own parts (at one rank its combine stamps only start and end).
    at = stdout.index("timeline, mori, 16 tokens bf16")
    assert "  quiet " in stdout[at : at + 2000] and "combine (" in stdout[at : at + 2000]
    data = json.loads(out.read_text())
    assert data["meta"]["floor_empty_us"] > 0
    for r in data["records"]:
        for phase in ("dispatch", "combine"):
            for floor in ("copy", "torch"):
                assert r[f"floor_{phase}_{floor}_us"] > 0, (r["impl"], phase, floor)
    assert "floors, same run" in stdout
