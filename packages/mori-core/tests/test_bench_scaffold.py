# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.core.bench, the scaffolding every package's benchmark uses: sizes, lists, tables,
the --json/--plot/--replot flags, machine metadata and launching the ranks."""

import argparse
import json

import pytest

from mori.core import bench as scaffold


def test_sizes_parse_in_binary_units_and_print_back():
    cases = {"4096": 4096, "4K": 4 << 10, "4kb": 4 << 10, "1.5M": 3 << 19, "2G": 2 << 30,
             "1MiB": 1 << 20, " 8 ": 8}  # fmt: skip
    for text, n in cases.items():
        assert scaffold.parse_size(text) == n, text
    with pytest.raises(ValueError):
        scaffold.parse_size("4X")
    assert [scaffold.format_size(n) for n in (1 << 10, 3 << 20, 2 << 30, 1536, 7)] == [
        "1K", "3M", "2G", "1536", "7",
    ]  # fmt: skip
    assert scaffold.comma_list(" a, b,,c ,") == ["a", "b", "c"]


def test_table_is_tabulates_with_one_decimal():
    from tabulate import tabulate

    rows, headers = [["1K", 1.25, 3], ["4M", 10.0, None]], ["size", "GB/s", "n"]
    assert scaffold.table(rows, headers) == tabulate(rows, headers=headers, floatfmt=".1f")
    github = scaffold.table(rows, headers, tablefmt="github", disable_numparse=True)
    assert github.splitlines()[0].startswith("| size")


def test_output_flags_and_replot(tmp_path, capsys):
    p = argparse.ArgumentParser()
    scaffold.add_output_args(p, plot_help="a plot")
    assert scaffold.replot(p.parse_args([]), lambda doc, path: None) is False
    src = tmp_path / "run.json"
    scaffold.write_json(str(src), {"rows": [1, 2]})
    assert f"wrote {src}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--replot needs --plot"):
        scaffold.replot(p.parse_args(["--replot", str(src)]), lambda doc, path: None)
    drawn = []
    args = p.parse_args(["--replot", str(src), "--plot", "out.png"])
    assert scaffold.replot(args, lambda doc, path: drawn.append((doc, path))) is True
    assert drawn == [({"rows": [1, 2]}, "out.png")]
    q = argparse.ArgumentParser()
    scaffold.add_output_args(q)  # no plot: --json alone
    assert vars(q.parse_args(["--json", "x"])) == {"json": "x"}
    assert json.loads(src.read_text()) == {"rows": [1, 2]}


def test_machine_and_heap_and_world_size():
    m = scaffold.machine()
    assert set(m) == {"cpu", "cores", "kernel", "host"} and m["cores"] >= 1 and m["cpu"]
    assert scaffold.compilers_running() >= 0
    assert scaffold.heap_bytes(1) == scaffold.heap_bytes(2 << 20) == 2 << 20
    assert scaffold.heap_bytes((2 << 20) + 1) == 4 << 20
    assert scaffold.default_world_size("cpu") == 2
    assert 2 <= scaffold.default_world_size("auto") <= 8


def test_launch_ranks_prints_rank_0_or_every_rank_on_failure(capsys):
    assert scaffold.launch_ranks("platform", [], 2, timeout_s=60) == 0
    out = capsys.readouterr()
    assert out.out.strip() and "Linux" in out.out and not out.err
    assert scaffold.launch_ranks("mori_no_such_module", [], 2, timeout_s=60) == 1
    err = capsys.readouterr().err
    assert "----- rank 0" in err and "----- rank 1" in err and "No module named" in err


def test_run_or_launch_runs_the_worker_in_a_rank_and_the_ranks_otherwise(monkeypatch, capsys):
    args = argparse.Namespace(timeout_s=60.0, world_size=None, device="cpu")
    ran = []
    monkeypatch.delenv("RANK", raising=False)
    assert scaffold.run_or_launch("platform", [], args, ran.append) == 0
    assert "Linux" in capsys.readouterr().out and not ran
    monkeypatch.setenv("RANK", "0")
    assert scaffold.run_or_launch("platform", [], args, ran.append) == 0
    assert ran == [args]
