# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The CUDA balanced planner (one launch) against the CPU planner, table for table, over
the planner's case matrix; its time for R=8, E=384, S=8192, K=8 (printed: the target
is 20 us on an H200); the Buffer's data-path kernels with 2 processes (and 1) against
the CPU tests' references; bench_balanced's CUDA path at small sizes. Skips without a
GPU."""

import random
import sys
from pathlib import Path

import pytest
import torch

import mori.core as mc
from mori.core.testing import new_seed, run_ranks
from mori.ep import balanced

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "workers"))
import balanced_reference as ref  # noqa: E402
from test_balanced_planner import CASES  # noqa: E402

TABLES = ("alloc", "expert_offsets", "cu_seqlens", "zero_fill_ranges", "experts_to_copy",
          "remote_stats")  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[f"R{c[0]}-epn{c[1]}-S{c[2]}-K{c[3]}-p{c[4]}-{c[5]}"
                                             for c in CASES])  # fmt: skip
def test_cuda_planner_equals_cpu(case, cuda_gpus):
    R, epn, S, K, pad, kind = case
    rng = random.Random(new_seed())
    E = R * epn
    topk = torch.tensor(ref.routing(kind, R, E, S, K, rng), dtype=torch.int32)
    tpe = torch.stack([torch.bincount(topk[r].flatten(), minlength=E) for r in range(R)])
    want = balanced.plan(tpe.int(), S, K, pad, topk=topk)
    for rank in range(R):
        got, _ = balanced.planning.plan_cuda(tpe.int().cuda(), topk[rank].cuda().contiguous(),
                                             rank, S, K, pad)  # fmt: skip
        for name in TABLES:
            assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), (name, rank)
        assert torch.equal(got.dst[0].cpu(), want.dst[rank]), rank


def test_cuda_planner_refuses_bad_ids(cuda_gpus):
    tpe = torch.tensor([[4, 0, 0, 0], [4, 0, 0, 0]], dtype=torch.int32).cuda()
    topk = torch.tensor([[0, 0], [0, 9]], dtype=torch.int32).cuda()
    with pytest.raises(mc.InvalidArgumentError, match="expert id 9 out of range at pair 3"):
        balanced.planning.plan_cuda(tpe, topk, 0, 2, 2, 4)


def test_cuda_planner_time(cuda_gpus):
    R, E, S, K = 8, 384, 8192, 8
    g = torch.Generator().manual_seed(new_seed())
    hot = torch.distributions.LogNormal(0.0, 2.0).sample((E,))
    topk = torch.multinomial(hot.expand(R * S, E), K, generator=g).view(R, S, K).int()
    tpe = torch.stack([torch.bincount(topk[r].flatten(), minlength=E) for r in range(R)]).int()
    tpe_d, topk_d = tpe.cuda(), topk[3].cuda().contiguous()
    for _ in range(5):
        balanced.planning.plan_cuda(tpe_d, topk_d, 3, S, K, 128, check=False)
    torch.cuda.synchronize()
    n = 50
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(n):
            got, err = balanced.planning.plan_cuda(tpe_d, topk_d, 3, S, K, 128, check=False)
        torch.cuda.synchronize()
    kern = [e for e in prof.events() if "PlannerKernel" in e.name]
    assert len(kern) == n, [e.name for e in prof.events()][:10]
    us = sum(e.device_time for e in kern) / n
    print(f"CUDA planner kernel R={R} E={E} S={S} K={K}: {us:.1f} us (target 20 us on an H200)")
    assert int(err[0]) == 0
    want = balanced.plan(tpe, S, K, 128, topk=topk)
    assert torch.equal(got.dst[0].cpu(), want.dst[3])


@pytest.mark.parametrize(
    ("S", "H", "K", "epn", "pad"),
    [(24, 64, 4, 3, 8), (9, 32, 8, 1, 1), (16, 256, 6, 2, 128), (5, 20, 3, 2, 4)],
)
def test_buffer_kernels(S, H, K, epn, pad, gpu_placement):
    # The CPU tests' "paths" scenario on a CUDA heap: the data-path kernels against the
    # same references, bit for bit, 2 processes.
    worker = str(Path(__file__).parent / "workers" / "balanced_worker.py")
    argv = [worker, "paths", str(new_seed()), *(str(v) for v in (S, H, K, epn, pad)),
            gpu_placement]  # fmt: skip
    run_ranks(argv, 2, timeout_s=300)


def test_buffer_kernels_one_rank(cuda_gpus):
    # One process (python -m mori.ep.bench_balanced --world-size 1): every expert local,
    # no prefetch slot, the same checks.
    worker = str(Path(__file__).parent / "workers" / "balanced_worker.py")
    run_ranks([worker, "paths", str(new_seed()), "24", "64", "4", "3", "8", "shared"], 1,
              timeout_s=300)  # fmt: skip


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("mode", ["maxvio", "prefetch"])
def test_bench_runs_on_cuda(mode, world, cuda_gpus, tmp_path):
    # bench_balanced's CUDA path end to end at small sizes (ranks share GPU 0 unless
    # there are more): maxvio checks S*K real rows per rank at every MaxVio itself.
    import json
    import subprocess

    out = tmp_path / "b.json"
    cmd = [sys.executable, "-m", "mori.ep.bench_balanced", mode, "--device", "cuda",
           "--world-size", str(world), "--iters", "2", "--timeout-s", "240",
           "--json", str(out)]  # fmt: skip
    if mode == "maxvio":
        cmd += ["--tokens", "256", "--hidden", "1024", "--ffn", "64"]
    else:
        cmd += ["--configs", "slots_1,epn16_mixed,thin_7168x128,tiny_512x512"]
    subprocess.run(cmd, check=True, timeout=300)
    doc = json.loads(out.read_text())
    assert doc["meta"]["ranks"] == world
    rows = doc["records"]
    if mode == "maxvio":
        assert [r["target"] for r in rows] == [0.2, 1.0, 10.0, 20.0]
        assert all(r["rows_min"] == r["rows_max"] == 256 * 8 for r in rows)
        keys = ("dispatch_us", "combine_us", "intranode_dc_us")
        assert all(r[k] > 0 for r in rows for k in keys)
    else:
        assert sorted({r["engine"] for r in rows}) == ["copy", "sm"] and len(rows) == 8
        assert all(r["worst_us"] > 0 and r["copy_us"] > 0 for r in rows)
