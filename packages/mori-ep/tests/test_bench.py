# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Smoke test of ``python -m mori.ep.bench``: tiny sizes, 2 processes.

Runs the CPU implementation and the gloo all_to_all baseline (``--device cpu``), or,
when 2 GPUs and a CUDA build are present, the CUDA kernels and the NCCL baseline.
Checks the JSON: every case measured on both ranks, both implementations received
the same rows, and the baseline's combine output equals mori's.
"""

import json
import sys

import pytest

from mori.core.launch import NO_MULTICAST_ENV, launch_local
from mori.core.testing import cuda_skip_reason

torch = pytest.importorskip("torch")


def _device() -> str:
    import mori.ep

    return "cuda" if cuda_skip_reason(mori.ep._C, min_gpus=2) is None else "cpu"


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    device = _device()
    cmd = [
        sys.executable,
        "-m",
        "mori.ep.bench",
        "--device",
        device,
        "--world-size",
        "2",
        "--max-tokens",
        "16",
        "--tokens",
        "0,16",
        "--hidden-dim",
        "256",
        "--num-experts-per-token",
        "4",  # = 2 x world: standard-moe pre-reduces per rank, standard-moe-rows does not
        "--num-experts-per-rank",
        "4",
        "--dtype",
        "bf16,fp8",
        "--block-num",
        "4",
        "--warp-per-block",
        "4",
        "--iters",
        "2",
        "--reps",
        "3",
        "--json",
        str(out),
        "--kernel-type",
        # On a GPU the low-latency kernels' bench run is test_low_latency_gpu.py's.
        "IntraNode,IntraNodeLL,AsyncLL,standard-moe,standard-moe-rows,deepep-ll"
        if device == "cpu"
        else "IntraNode",
    ] + (["--overlap"] if device == "cpu" else [])
    # The ranks directly (what `python -m mori.ep.bench` spawns), saving a torch import.
    stdout = launch_local(cmd, 2, timeout_s=90, env=NO_MULTICAST_ENV)[0].output
    print(stdout[-4000:])
    assert "baseline combine output matches mori's: yes" in stdout
    if device == "cpu":
        assert "token-major kernel types' combine outputs identical: yes" in stdout
        assert "AsyncLL overlap" in stdout
    data = json.loads(out.read_text())
    recs = data["records"]
    assert data["meta"]["world_size"] == 2
    a2a = data["meta"]["a2a_reference"]  # the all_to_all_single bus-bandwidth reference
    assert a2a["backend"] == ("nccl" if device == "cuda" else "gloo") and a2a["us"] > 0
    assert a2a["busbw_gbps"] == pytest.approx(a2a["algbw_gbps"] / 2)
    assert "all_to_all_single reference" in stdout
    assert "floors, same run" in stdout
    empty = data["meta"]["floor_empty_us"]
    assert (empty is None) if device == "cpu" else (empty > 0), empty
    for tokens in (0, 16):
        for dtype in ("bf16", "fp8"):
            case = [r for r in recs if r["tokens"] == tokens and r["dtype"] == dtype]
            mori = {r["rank"]: r for r in case if r["impl"] == "mori"}
            base = {r["rank"]: r for r in case if r["impl"].startswith("a2a")}
            lls = ("mori IntraNodeLL", "mori AsyncLL", "mori standard-moe", "mori deepep-ll")
            for impl in lls[: 4 if device == "cpu" else 0]:
                ll = {r["rank"]: r for r in case if r["impl"] == impl}
                assert set(ll) == {0, 1}, (impl, case)
                assert all(r["dispatch_us"] > 0 and r["combine_us"] > 0 for r in ll.values())
                if impl in ("mori IntraNodeLL", "mori AsyncLL"):  # the intra-node kernels' rows
                    assert all(ll[r]["recv_rows"] == mori[r]["recv_rows"] for r in (0, 1))
                    assert all(r["matches_intranode"] for r in ll.values()), impl
            if device == "cpu":
                # Both expert-major entry points receive one row per (token, expert) pair.
                pairs = {
                    impl: {r["rank"]: r["recv_rows"] for r in case if r["impl"] == impl}
                    for impl in ("mori standard-moe", "mori deepep-ll")
                }
                assert pairs["mori standard-moe"] == pairs["mori deepep-ll"], pairs
                # What combine sends back: one bf16 row per (token, expert), or with the
                # per-rank pre-reduction one fp32 row per received token, never more at
                # top-k = 2 x world (a token's n >= 2 rows on a rank become one).
                sent = {
                    impl: {r["rank"]: r for r in case if r["impl"] == impl}
                    for impl in ("mori standard-moe", "mori standard-moe-rows")
                }
                for rank in (0, 1):
                    part, rows = (
                        sent["mori standard-moe"][rank],
                        sent["mori standard-moe-rows"][rank],
                    )
                    assert part["pre_reduce"] and not rows["pre_reduce"]
                    assert rows["combine_wire_bytes"] == rows["recv_rows"] * 256 * 2
                    assert part["combine_wire_bytes"] % (256 * 4) == 0
                    assert part["combine_wire_bytes"] <= rows["combine_wire_bytes"]
                    assert (part["combine_wire_bytes"] > 0) == (tokens > 0)
                overlap = [
                    r for r in data["meta"]["overlap"]
                    if r["tokens"] == tokens and r["dtype"] == dtype
                ]  # fmt: skip
                assert {(r["phase"], r["rank"]) for r in overlap} == {
                    (p, r) for p in ("dispatch", "combine") for r in (0, 1)
                }, overlap
                for r in overlap:
                    assert r["transfer_us"] > 0 and r["gemm_us"] > 0 and r["overlapped_us"] > 0
                    assert 0.0 <= r["hidden"] <= 1.0 and r["gemm_size"] >= 128, r
            assert set(mori) == set(base) == {0, 1}, case
            for rank in (0, 1):
                assert mori[rank]["recv_rows"] == base[rank]["recv_rows"]
                assert base[rank]["matches_mori"]
                assert mori[rank]["dispatch_us"] > 0 and mori[rank]["combine_us"] > 0
                # Kernel times come from the profiler's CUDA records; none on CPU.
                for key in ("dispatch_kernel_us", "combine_kernel_us"):
                    k_us = mori[rank][key]
                    assert (k_us is None) if device == "cpu" else (k_us > 0), (key, k_us)
            # The floors (floors.py) beside every mori row: a copy of its bytes and the
            # same call in plain torch, timed; on a GPU also an empty kernel.
            for r in case:
                if r["impl"].startswith("mori"):
                    for phase in ("dispatch", "combine"):
                        for floor in ("copy", "torch"):
                            us = r[f"floor_{phase}_{floor}_us"]
                            assert us > 0, (r["impl"], phase, floor, us)
            if tokens == 0:
                assert all(r["recv_rows"] == 0 for r in case)


def test_replot_draws_from_an_earlier_json_without_running(tmp_path, capsys):
    import json

    from mori.ep import bench

    meta = {"world_size": 2, "device": "cpu", "peer_copy_gbps": None}
    rec = {"impl": "mori", "dtype": "bf16", "block_num": 24, "tokens": 128, "rank": 0,
           "dispatch_cross_gbps": 1.0, "combine_cross_gbps": 2.0}  # fmt: skip
    src = tmp_path / "run.json"
    src.write_text(json.dumps({"meta": meta, "records": [rec]}))
    with pytest.raises(SystemExit, match="--replot needs --plot"):
        bench.main(["--replot", str(src)])
    bench.main(["--replot", str(src), "--plot", str(tmp_path / "p.png")])
    out = capsys.readouterr().out
    assert ("wrote" in out) or ("matplotlib is not installed" in out)


def test_bench_combine_quant_rows(tmp_path):
    """``--combine-quant none,fp8_blockwise``: for each token-major kernel type an
    fp8_blockwise op beside the bf16 one; its combine bytes are what crosses (hidden
    256 with 56 scale blocks: 256 fp8 bytes and 56 fp32 scales, 480 bytes per row
    against bf16's 512), its output agrees across kernel types and stays within e4m3's
    rounding of the bf16 combine's, and the table compares the two."""
    out = tmp_path / "bench.json"
    device = _device()
    kinds = "IntraNode,IntraNodeLL,AsyncLL"
    cmd = [
        sys.executable, "-m", "mori.ep.bench", "--device", device, "--world-size", "2",
        "--max-tokens", "16", "--tokens", "16", "--hidden-dim", "256",
        "--num-experts-per-token", "4", "--num-experts-per-rank", "4", "--dtype", "bf16",
        "--block-num", "4", "--warp-per-block", "4", "--iters", "2", "--reps", "3",
        "--no-baseline", "--no-floors", "--json", str(out), "--kernel-type", kinds,
        "--combine-quant", "none,fp8_blockwise",
    ]  # fmt: skip
    env = {k: v for k, v in NO_MULTICAST_ENV.items()}
    stdout = launch_local(cmd, 2, timeout_s=120, env=env)[0].output
    print(stdout[-4000:])
    assert "combine by quant type, same run" in stdout
    recs = json.loads(out.read_text())["records"]
    for kt in kinds.split(","):
        for rank in (0, 1):
            bf16, fp8 = (
                next(r for r in recs if r["kernel_type"] == kt and r["rank"] == rank
                     and r["combine_quant"] == q)
                for q in ("none", "fp8_blockwise")
            )  # fmt: skip
            assert fp8["impl"].endswith(" fp8_blockwise"), fp8["impl"]
            assert bf16["recv_rows"] == fp8["recv_rows"] > 0
            assert bf16["combine_sent_bytes"] == bf16["recv_rows"] * 512
            assert fp8["combine_sent_bytes"] == fp8["recv_rows"] * (256 + 4 * 56)
            assert fp8["matches_intranode"] and bf16["matches_intranode"], kt
            # randn rows (|v| < 448: scale 1): each part within 2^-4 of itself, summed
            # over at most 2 ranks, then bf16; relative to the largest bf16 value.
            assert 0.0 < fp8["combine_rel_diff_vs_bf16"] < 2.0**-3, fp8
            assert fp8["combine_us"] > 0


INTER_KINDS = ("InterNode", "InterNodeV1", "InterNodeV1LL")


def _internode_bench(tmp_path, device, world, local, extra=(), timeout_s=120):
    """Rank 0's output and the JSON of the bench over the inter-node kinds, ``world``
    ranks as nodes of ``local``, the proxy forced to TCP, tiny sizes."""
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "mori.ep.bench", "--device", device, "--world-size", str(world),
        "--gpu-per-node", str(local), "--max-tokens", "16", "--tokens", "16", "--hidden-dim",
        "256", "--num-experts-per-token", "4", "--num-experts-per-rank", "4", "--dtype", "bf16",
        "--iters", "2", "--reps", "2", "--no-floors", "--json", str(out),
        "--kernel-type", ",".join(INTER_KINDS), *extra,
    ]  # fmt: skip
    stdout = launch_local(cmd, world, timeout_s=timeout_s, env=NO_MULTICAST_ENV)[0].output
    print(stdout[-5000:])
    assert f"inter-node kernel types, {local} rank(s) per emulated node, proxy transport tcp" in (
        stdout
    )
    assert "token-major kernel types' combine outputs identical: yes" in stdout
    data = json.loads(out.read_text())
    assert data["meta"]["gpu_per_node"] == local and data["meta"]["proxy_transport"] == "tcp"
    return stdout, data


def _check_internode_records(data, world, cuda):
    """Every rank's row of every kind: what the link reports it moved is what the op
    wrote on it, physical <= algo, and the call, the raw streams (on CUDA staged through
    pinned memory) and the copy floor of the same bytes timed; on 2 nodes of one rank
    every crossing lands one row, so the physical bytes add up to the rows received
    from the other rank. Returns the records by kind and rank."""
    recs = data["records"]
    row = 256 * 2
    by_kind = {}
    for kt in INTER_KINDS:
        rs = {r["rank"]: r for r in recs if r.get("kernel_type") == kt}
        assert set(rs) == set(range(world)), (kt, recs)
        by_kind[kt] = rs
        cross = sum(r["recv_rows"] - r["local_rows"] for r in rs.values())
        assert cross > 0, rs
        for phase in ("dispatch", "combine"):
            b = {rank: r[f"{phase}_bytes"] for rank, r in rs.items()}
            if world == 2:
                assert sum(x["physical_token"] for x in b.values()) == cross * row, (kt, phase, b)
            for rank, r in rs.items():
                x = b[rank]
                assert x["physical_token"] <= x["algo_token"], (kt, x)
                if world == 2:
                    assert x["link_token"] == x["physical_token"], (kt, x)
                # moved: the transport's write bytes (the signals are atomic adds).
                assert x["moved"] == x["link_token"] + x["link_meta"], (kt, phase, rank, x)
                assert r[f"{phase}_link_bytes"] == x["moved"] + x["link_signal"], (kt, x)
                assert r[f"{phase}_us"] > 0 and r[f"{phase}_copy_us"] > 0
                assert r[f"{phase}_raw_us"] > 0 and r[f"{phase}_raw_host_us"] > 0
                kern = r[f"{phase}_kernel_us"]
                assert (kern > 0) if cuda else (kern is None), (kt, phase, kern)
                assert r["raw_staged"] == cuda
                assert r["link"].startswith("proxy (") and "tcp" in r["link"], r["link"]
    return by_kind


def test_bench_internode_kinds_on_emulated_nodes(tmp_path):
    """The inter-node kernel types on host heaps, 2 emulated nodes of one rank
    (MORI_SHMEM_NODE_ID), the proxy forced to TCP: the byte counts, the raw TCP stream
    and the copy floor of the same bytes (_check_internode_records); the all_to_all
    baseline's combine output equals mori's."""
    stdout, data = _internode_bench(tmp_path, "cpu", 2, 1)
    assert "baseline combine output matches mori's: yes" in stdout
    assert data["meta"]["shared_gpu"] is False
    for rs in _check_internode_records(data, 2, cuda=False).values():
        for r in rs.values():
            assert r["link"] == "proxy (tcp)"
            assert r["dispatch_raw_host_us"] == r["dispatch_raw_us"]  # one figure on CPU


# On CUDA: the kernels pushing into the proxy's queues, 2 processes as 2 nodes x 1 and
# 4 as 2 x 2, every rank on GPU 0 when there are fewer GPUs than ranks (then no
# all_to_all baseline: NCCL cannot put two ranks on one GPU, and the output says what
# the figures measure).
@pytest.mark.parametrize(("world", "local"), [(2, 1), (4, 2)])
def test_bench_internode_kinds_on_cuda(world, local, cuda_gpus, tmp_path):
    extra = ("--block-num", "4", "--op-timeout-s", "30")
    stdout, data = _internode_bench(tmp_path, "cuda", world, local, extra, timeout_s=300)
    shared = cuda_gpus < world
    assert data["meta"]["shared_gpu"] is shared
    assert ("not a NIC" in stdout) == shared
    assert ("all_to_all_single reference" in stdout) == (not shared)
    by_kind = _check_internode_records(data, world, cuda=True)
    for rs in by_kind.values():
        for r in rs.values():
            assert r["mori_io_memory"] in (None, "gpu", "host"), r["mori_io_memory"]
