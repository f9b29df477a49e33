# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The benchmark and its native baseline run end to end at tiny sizes (so they cannot
rot), its presets are MORI's regimes, its P2P limit is the copy the run's GPUs can do
(a same-device copy when both engines share one GPU), and batch offsets given as numpy
arrays move the same bytes as lists."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import mori.core
from mori.core.testing import visible_gpus
from mori.io import _C, BackendType, IOEngine, StatusCode, TcpBackendConfig
from mori.io.bench import (
    baseline_of,
    expand_preset,
    format_table,
    gpu_copy_limit,
    p2p_copy_pair,
    parse_args,
    sizes_of,
)


def test_raw_socket_stream_moves_every_byte():
    for ack in (False, True):
        r = _C.raw_socket_stream(3000, 50, ack)
        assert r["bytes"] == 3000 * 50
        assert r["seconds"] > 0 and r["sender_cpu_s"] >= 0 and r["receiver_cpu_s"] >= 0


# MORI's profile-guided hot-path change ran its benchmark with these argument vectors
# (written from that change's description, not from bench.py).
_COMMON = ["--op-type", "write", "--enable-sess", "--enable-batch-transfer"]
MORI_REGIMES = {
    "mw-chunkoff": _COMMON + ["--disable-chunking", "--transfer-batch-size", "64", "--all",
                              "--sweep-start-size", "1K", "--sweep-max-size", "16M",
                              "--iters", "128", "--num-worker-threads", "2",
                              "--num-qp-per-transfer", "4"],
    "mw-chunkon": _COMMON + ["--transfer-batch-size", "64", "--all", "--sweep-start-size",
                             "1K", "--sweep-max-size", "16M", "--iters", "256",
                             "--num-worker-threads", "4", "--num-qp-per-transfer", "4"],
    "hi-iops": _COMMON + ["--disable-chunking", "--buffer-size", "512",
                          "--transfer-batch-size", "256", "--iters", "512",
                          "--num-worker-threads", "8", "--num-qp-per-transfer", "8",
                          "--num-initiator-dev", "8", "--num-target-dev", "8"],
}  # fmt: skip


def _options(argv: list[str]) -> dict[str, str | bool]:
    """{flag: value, or True for a switch}: an argument vector without its order."""
    out, i = {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]], i = argv[i + 1], i + 2
        else:
            out[argv[i]], i = True, i + 1
    return out


@pytest.mark.parametrize("name", sorted(MORI_REGIMES))
def test_presets_are_moris_argument_vectors(name):
    expanded = expand_preset(name)
    assert _options(expanded) == _options(MORI_REGIMES[name])
    assert len(expanded) == len(MORI_REGIMES[name])  # no flag given twice
    # The preset parses to exactly what MORI's command line parses to.
    assert vars(parse_args(["--preset", name])) == {
        **vars(parse_args(MORI_REGIMES[name])),
        "preset": name,
    }
    if "--all" in MORI_REGIMES[name]:
        assert sizes_of(parse_args(["--preset", name])) == [1 << k for k in range(10, 25)]


def test_command_line_flags_override_a_preset():
    a = parse_args(["--preset", "mw-chunkon", "--num-worker-threads", "1", "--iters", "7"])
    assert (a.num_worker_threads, a.iters) == (1, 7)
    assert (a.num_qp_per_transfer, a.transfer_batch_size) == (4, 64)
    assert a.enable_batch_transfer and a.enable_sess and not a.disable_chunking
    # Wherever the flag stands relative to --preset.
    a = parse_args(["--buffer-size", "4K", "--preset", "hi-iops", "--num-target-dev", "2"])
    assert (a.buffer_size, a.num_target_dev, a.num_initiator_dev) == (4096, 2, 8)
    assert (a.transfer_batch_size, a.iters) == (256, 512)
    # Switches a preset leaves off are still the command line's to set.
    assert parse_args(["--preset", "mw-chunkon", "--disable-chunking"]).disable_chunking
    assert parse_args(["--chunk-bytes", "64K"]).chunk_size == 64 << 10  # MORI's name


def test_p2p_limit_is_a_same_device_copy_when_both_engines_share_a_gpu():
    # One GPU: the initiator's and the target's buffers are both on cuda:0.
    for op in ("write", "read"):
        assert p2p_copy_pair(op, 1, 1) == (0, 0)
    # hi-iops on 8 GPUs: the target's first buffer wraps onto cuda:0 as well.
    assert p2p_copy_pair("write", 8, 8) == (0, 0)
    for backend in ("p2p", "xgmi"):
        same = baseline_of(backend, 0, 0)
        assert (same.kind, same.label) == ("same_device_copy", "same-device D2D copy")
        assert "cuda:0" in same.detail
    # Two GPUs: a peer copy, in the direction the bytes move.
    assert p2p_copy_pair("write", 1, 2) == (0, 1)
    assert p2p_copy_pair("read", 1, 2) == (1, 0)
    peer = baseline_of("p2p", 0, 1)
    assert (peer.kind, peer.label) == ("peer_copy", "cudaMemcpyPeerAsync")
    assert baseline_of("tcp").kind == "tcp_stream" and baseline_of("shm").kind == "memcpy"


def test_gpu_copy_limit_moves_each_iteration_as_one_copy():
    """The reported 11.9 GB/s RawBW at 1024 x 64 KiB was 1024 copy calls per iteration:
    ~5.5 us per call is 64 KiB / 5.5 us = 11.9 GB/s, the runtime's call rate, while the
    engine moves the batch with one kernel. The limit copies each iteration's bytes as
    one copy; the per-call figure is kept apart. Modelled runtime: 5.5 us per call plus
    the bytes at 2 TB/s."""
    calls = []

    def copy_seconds(src, dst, size, batch, iters, sync_each, per_transfer):
        calls.append((src, dst, size, batch, iters, sync_each, per_transfer))
        per_round = batch if per_transfer else 1
        return iters * (per_round * 5.5e-6 + size * batch / 2e12)

    size, batch, iters = 64 << 10, 1024, 128
    got = gpu_copy_limit(size, batch, iters, 3, 3, copy_seconds)
    assert calls == [
        (3, 3, size, batch, iters, False, False),
        (3, 3, size, batch, iters, True, False),
        (3, 3, size, batch, iters, False, True),
    ]
    total = size * batch
    assert got["raw_bw"] == pytest.approx(total / (5.5e-6 + total / 2e12) / 1e9)
    assert got["raw_ack_bw"] == got["raw_bw"]
    assert got["raw_per_copy_bw"] == pytest.approx(size / (5.5e-6 + size / 2e12) / 1e9)
    assert round(size / 5.5e-6 / 1e9, 1) == 11.9  # the figure that was reported
    # Small iterations stream at least 256 MiB; one transfer per iteration has no
    # separate per-copy figure.
    calls.clear()
    got = gpu_copy_limit(1024, 1, 16, 0, 1, copy_seconds)
    assert calls[0] == (0, 1, 1024, 1, 256 << 10, False, False)
    assert len(calls) == 2 and "raw_per_copy_bw" not in got


def test_table_header_names_the_baseline():
    row = {"msg_size": 65536, "batch_size": 1024, "total_size": 64 << 20, "avg_bw": 874.0,
           "raw_bw": 1900.0, "pct_raw": 46.0}  # fmt: skip
    plain = format_table([row], 1)
    assert "| RawBW(GB/s) " in plain and "[" not in plain
    row["baseline"] = baseline_of("p2p", 0, 0).label
    assert "RawBW(GB/s) [same-device D2D copy]" in format_table([row], 1)
    row["baseline"] = baseline_of("p2p", 0, 1).label
    assert "RawBW(GB/s) [cudaMemcpyPeerAsync]" in format_table([row], 1)


@pytest.mark.parametrize(
    "extra",
    [
        ["--op-type", "write", "--enable-batch-transfer", "--enable-sess"],
        ["--op-type", "read", "--reps", "2", "--disable-chunking"],
    ],
)
def test_bench_smoke(tmp_path, extra):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "mori.io.bench", "--all", "--sweep-start-size", "1K",
        "--sweep-max-size", "4K", "--transfer-batch-size", "4", "--iters", "3", "--warmup", "1",
        "--timeout-s", "60", "--json", str(out), "--plot", str(tmp_path / "bench.png"), *extra,
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "AvgBW(GB/s)" in p.stdout and "RawBW(GB/s) [loopback TCP stream]" in p.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["msg_size"] for r in rows] == [1024, 2048, 4096]
    for r in rows:
        assert r["baseline_kind"] == "tcp_stream"
        assert r["total_size"] == 4 * r["msg_size"]
        assert r["avg_bw"] > 0 and r["raw_bw"] > 0 and r["cpu_us_init"] > 0
        assert r["min_lat_us"] <= r["avg_lat_us"]
        assert r["min_lat_us"] <= r["p50_lat_us"] <= r["p99_lat_us"]


def test_batch_offsets_as_numpy_arrays():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    a, b = IOEngine("np-a"), IOEngine("np-b")
    for e in (a, b):
        e.create_backend(BackendType.TCP)
    a.register_remote_engine(b.get_engine_desc())
    src = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    dst = np.zeros_like(src)
    ms, md = a.register_array(src), b.register_array(dst)
    lo = np.arange(0, 1 << 16, 4096, dtype=np.int64)
    ro = lo[::-1].astype(np.uint32)  # any integer dtype; reversed placement
    sizes = np.full(len(lo), 4096, np.uint64)
    st = a.batch_write(ms, lo, md, ro, sizes, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    for lo_i, ro_i in zip(lo, ro, strict=True):
        assert np.array_equal(dst[ro_i : ro_i + 4096], src[lo_i : lo_i + 4096])
    with pytest.raises(mori.core.InvalidArgumentError, match="negative"):
        a.batch_write(ms, -lo - 1, md, ro, sizes, 1)
    with pytest.raises(mori.core.InvalidArgumentError, match="integers"):
        a.batch_write(ms, lo.astype(np.float64), md, ro, sizes, 1)


@pytest.mark.parametrize("size", [1, 2, 4096, (1 << 20) + 3])
def test_chunking_off_moves_every_byte(size):
    """Regression: with chunking off, the part count once wrapped to zero and a
    transfer 'succeeded' without moving a byte (found by the benchmark's check)."""
    rng = np.random.default_rng(size)
    a, b = IOEngine("nochunk-a"), IOEngine("nochunk-b")
    for e in (a, b):
        e.create_backend(BackendType.TCP, TcpBackendConfig(enable_chunking=False))
    a.register_remote_engine(b.get_engine_desc())
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros_like(src)
    back = np.zeros_like(src)
    ms, md, mb = a.register_array(src), b.register_array(dst), a.register_array(back)
    st = a.write(ms, 0, md, 0, size, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(dst, src)
    st = a.read(mb, 0, md, 0, size, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(back, src)


def test_replot_draws_from_an_earlier_json_without_running(tmp_path, capsys):
    import json

    from mori.io import bench

    rows = [{"total_size": 1 << 20, "avg_bw": 1.0, "avg_bw_sd": 0.1, "raw_bw": 2.0}]
    src = tmp_path / "run.json"
    src.write_text(json.dumps({"rows": rows}))
    with pytest.raises(SystemExit, match="--replot needs --plot"):
        bench.main(["--replot", str(src)])
    assert bench.main(["--replot", str(src), "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    # Drawn where matplotlib is installed, a clear skip where it is not; never a run.
    assert ("plot written to" in out) or ("matplotlib is not installed" in out)
    assert "MsgSize" not in out


def test_lanes_spread_transfers_round_robin():
    from mori.io.bench import lanes_of

    assert lanes_of(4, 1, 1) == {(0, 0): [0, 1, 2, 3]}
    lanes = lanes_of(7, 2, 3)
    assert sorted(j for js in lanes.values() for j in js) == list(range(7))
    assert all(li == j % 2 and ri == j % 3 for (li, ri), js in lanes.items() for j in js)


def test_several_buffers_per_side_are_verified(capsys):
    from mori.io import bench

    # Host buffers here (GPUs with --backend p2p); the run checks every destination range.
    assert bench.main(["--num-initiator-dev", "2", "--num-target-dev", "3", "--buffer-size",
                       "4K", "--transfer-batch-size", "6", "--enable-batch-transfer",
                       "--enable-sess", "--iters", "4", "--warmup", "1", "--no-baseline"]) == 0  # fmt: skip
    assert "| 4K" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.parse_args(["--num-target-dev", "0"])


@pytest.mark.skipif(visible_gpus() == 0, reason="needs a CUDA GPU")
def test_p2p_bench_compares_with_the_copy_its_gpus_can_do(tmp_path):
    """On one GPU the limit is a same-device copy (not a peer copy), on two a peer copy;
    either way the whole iteration is one copy, so the limit is not the runtime's call
    rate and the engine is not reported at thousands of percent of it."""
    ngpu = visible_gpus()
    out = tmp_path / "p2p.json"
    cmd = [
        sys.executable, "-m", "mori.io.bench", "--backend", "p2p", "--enable-batch-transfer",
        "--enable-sess", "--transfer-batch-size", "256", "--buffer-size", "64K", "--iters", "16",
        "--warmup", "2", "--timeout-s", "120", "--json", str(out),
    ]  # fmt: skip
    from mori.core.launch import NO_MULTICAST_ENV

    env = {**os.environ, **NO_MULTICAST_ENV}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    want = baseline_of("p2p", *p2p_copy_pair("write", 1, ngpu))
    assert want.kind == ("same_device_copy" if ngpu == 1 else "peer_copy")
    assert f"RawBW(GB/s) [{want.label}]" in p.stdout, p.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert row["baseline_kind"] == want.kind
    assert row["raw_bw"] > row["raw_per_copy_bw"], row
    # The engine's own copies share the GPU with Python's issue time: below the limit
    # (the margin covers timing noise, not the 7334% of a per-call baseline).
    assert row["pct_raw"] < 150, row


def test_ablation_points_keep_the_presets_flags_without_their_sweep():
    from mori.io.bench_ablation import ABLATION_POINTS, preset_point

    for name in ABLATION_POINTS:
        argv = preset_point(name, iters=3)
        args = parse_args(argv)
        assert not args.all and args.iters == 3, argv
        preset = parse_args(["--preset", name])
        for key in (
            "transfer_batch_size",
            "num_worker_threads",
            "num_qp_per_transfer",
            "disable_chunking",
            "num_initiator_dev",
            "num_target_dev",
            "enable_sess",
        ):
            assert getattr(args, key) == getattr(preset, key), (name, key)  # fmt: skip


def _runs(xfer, cpu: float = 1.0, n: int = 5) -> list[dict]:
    xfers = xfer if isinstance(xfer, list) else [xfer] * n
    return [{"xfer_per_s": x, "p50_lat_us": 1e6 / x, "cpu_us_init": cpu, "cpu_us_target": cpu}
            for x in xfers]  # fmt: skip


def test_ablation_verdicts_follow_the_maintainers_bar():
    """Keep: >= 10 % more transfers/s somewhere, or >= 20 % less CPU at equal
    transfers/s, and >= 10 % fewer transfers/s nowhere; a change counts only beyond the
    cell's noise floor (what a switch that cannot act there moved) and when at least
    4 of 5 repetitions agree in sign."""
    from mori.io.bench_ablation import DEFAULT, summarize, verdicts

    results = {
        "tcp / a": {
            DEFAULT: _runs(100), "TCP waiter reads off": _runs(80),
            "TCP busy poll off": _runs(100, 1.5),
            "CMA grant cache off": _runs(88),  # cannot act over TCP: a 12 % noise floor
        },
        "shm-map / b": {
            DEFAULT: _runs(100), "notice ring off": _runs(130), "SHM mapping off": _runs(97, 1.1),
            "CMA grant cache off": _runs(99),  # cannot act on mapped memory: 1 %
        },
        "shm-cma / c": {
            DEFAULT: _runs(100), "notice ring off": _runs(50),
            "liveness word off": _runs([50, 150, 50, 150, 50]),  # 3 of 5 agree: no verdict
            "CMA grant cache off": _runs(90),
            "SHM mapping off": _runs(88),  # cannot act on numpy buffers: a 12 % noise floor
        },
    }  # fmt: skip
    summary = summarize(results)
    assert summary["tcp / a"]["noise"] == pytest.approx(0.12)
    assert summary["shm-cma / c"]["noise"] == pytest.approx(0.12)
    got = {v["env"]: v["verdict"] for v in verdicts(summary) if v["best"] is not None}
    assert got == {
        "MORI_IO_TCP_WAITER_READS": "keep",  # +25 % transfers/s in one cell
        "MORI_IO_TCP_BUSY_POLL_US": "keep",  # 33 % less CPU at equal transfers/s
        "MORI_IO_SHM_MAP": "remove",  # 3 %, 9 % CPU: below the bar
        "MORI_IO_CMA_CACHE": "remove",  # +11 %: under the cell's 12 % noise floor
        "MORI_IO_NOTICE_RING": "mixed",  # doubles one cell, costs 23 % in another
        "MORI_IO_SHM_LIVENESS_WORD": "remove",  # inconsistent across repetitions
    }


def test_ablation_runs_and_verifies_bytes(tmp_path):
    """One repetition at a tiny size: every variant's bench pair moved and checked its
    bytes (a wrong byte fails the run, and a failed run fails the ablation)."""
    out = tmp_path / "ablate.json"
    cmd = [
        sys.executable, "-m", "mori.io.bench", "--ablate", "--ablate-reps", "1",
        "--ablate-backends", "tcp", "--ablate-presets", "hi-iops",
        "--ablate-switches", "MORI_IO_TCP_WAITER_READS", "--ablate-iters", "2", "--timeout-s", "60",
        "--json", str(out),
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    runs = doc["results"]["tcp / hi-iops"]
    assert set(runs) == {"defaults", "TCP waiter reads off", "all off"}
    for name, rows in runs.items():
        (row,) = rows
        assert "error" not in row, (name, row)
        assert row["batch_size"] == 256 and row["msg_size"] == 512 and row["xfer_per_s"] > 0
    assert [v["env"] for v in doc["verdicts"]] == ["MORI_IO_TCP_WAITER_READS"]
    assert "| TCP waiter reads | `MORI_IO_TCP_WAITER_READS` |" in p.stdout
