# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ep._C against its stubs, and the CPU and CUDA implementations of each mode
against each other: the modes call either with one signature."""

import ast
import re
from pathlib import Path

import pytest

import mori.ep as ep
from mori.core.testing import parse_stub

CUDA_ONLY = {
    "IntraNodeCuda",
    "LowLatencyCuda",
    "dispatch_layout_cuda",
    "local_expert_count_cuda",
    "balanced_plan_cuda",
    "balanced_planner_scratch_words",
    "BalancedCuda",
    "InterNodeCuda",
}
# Each mode's (CPU, CUDA) native classes; what one has beyond the shared methods.
TWINS = [
    ("IntraNodeCpu", "IntraNodeCuda"),
    ("LowLatencyCpu", "LowLatencyCuda"),
    ("BalancedCpu", "BalancedCuda"),
]
EXTRAS = {
    "IntraNodeCuda": {"max_resident_blocks", "timeline"},
    "LowLatencyCpu": {
        "dispatch_calls",
        "combine_calls",
        "dispatch_recv_pending",
        "combine_recv_pending",
    },  # fmt: skip
    "LowLatencyCuda": {"copy_engine", "timeline"},
}


def _stub():
    return parse_stub(Path(ep.__file__).parent / "_C.pyi")


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stubs_match_the_module():
    names, classes = _stub()
    module = {n for n in dir(ep._C) if not n.startswith("_") or n.startswith("__mori")}
    assert names - (set() if ep._C.with_cuda else CUDA_ONLY) == module
    for cls, methods in classes.items():
        if cls in CUDA_ONLY and not ep._C.with_cuda:
            continue
        assert set(methods) - {"__init__"} == _public(getattr(ep._C, cls)), cls


def _params(fn: ast.FunctionDef) -> list[tuple[str, str | None]]:
    args = fn.args.args[1:]  # without self
    defaults = [None] * (len(args) - len(fn.args.defaults)) + [
        ast.unparse(d) for d in fn.args.defaults
    ]
    return [(a.arg, d) for a, d in zip(args, defaults, strict=True)]


@pytest.mark.parametrize(("cpu", "cuda"), TWINS)
def test_cpu_and_cuda_stubs_share_signatures(cpu, cuda):
    _, classes = _stub()
    shared = set(classes[cpu]) - EXTRAS.get(cpu, set())
    assert shared == set(classes[cuda]) - EXTRAS.get(cuda, set())
    for name in shared:
        a, b = classes[cpu][name], classes[cuda][name]
        assert (a and _params(a)) == (b and _params(b)), f"{cpu}.{name}"


def _bound_params(method) -> str:
    """The parameter list pybind11 writes first in a method's docstring, self's type
    left out."""
    first = method.__doc__.splitlines()[0]
    return re.sub(r"^\w+\(self: [\w.]+,? ?", "(", first)


@pytest.mark.parametrize(("cpu", "cuda"), TWINS)
def test_cpu_and_cuda_bindings_share_signatures(cpu, cuda):
    if not ep._C.with_cuda:
        pytest.skip("mori.ep was built without CUDA: no CUDA class to compare")
    a, b = getattr(ep._C, cpu), getattr(ep._C, cuda)
    shared = _public(a) - EXTRAS.get(cpu, set())
    assert shared == _public(b) - EXTRAS.get(cuda, set())
    for name in sorted(shared | {"__init__"}):
        ma, mb = getattr(a, name), getattr(b, name)
        if isinstance(ma, property):
            continue
        assert _bound_params(ma) == _bound_params(mb), f"{cpu}.{name}"
