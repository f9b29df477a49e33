# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The inter-node kernels' failures end in a trap that names them, on every rank, within
the op's timeout (3 s in the worker) — never a hang: 2 processes on GPU 0 as 2 nodes x
1 (tests/workers/ep_internode_trap_worker.py), so every byte between them goes through
the proxy. Skipped without a CUDA GPU or a mori build without CUDA."""

from pathlib import Path

import pytest

from mori.core.testing import seconds_of, trap_outcomes

WORKER = str(Path(__file__).parent / "workers" / "ep_internode_trap_worker.py")
KINDS = ["InterNode", "InterNodeV1", "InterNodeV1LL"]


def _outcomes(case: str, kind: str, expected=None) -> list[tuple[str, str]]:
    """[(outcome, output)] per rank, both ranks on GPU 0 (two emulated nodes). expected:
    {rank: message} for cases where both ranks trap (trap_outcomes: the driver's lost
    trap ends the test as xfail)."""
    return trap_outcomes(WORKER, case, 1, timeout_s=60, args=(kind,), expected=expected)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_expert_id_traps_on_both_ranks_naming_it(kind, cuda_gpus):
    bad, rejected = (
        "expert id 8 out of range [-1, 8) at token 3 slot 2",
        "dispatch rejected by rank 0",
    )
    (o0, out0), (o1, out1) = _outcomes("bad_expert", kind, {0: bad, 1: rejected})
    assert o0.startswith("CUDA error") and o1.startswith("CUDA error"), (o0, o1)
    assert bad in out0, out0
    assert rejected in out1, out1


# The first word rank 0 waits for: the count words (InterNode, V1), the staging word
# at the gateway (V1LL: rank 0 is the gateway of rank 1's rows to node 0).
@pytest.mark.parametrize(
    ("kind", "stage"),
    [
        ("InterNode", "count words"),
        ("InterNodeV1", "count words"),
        ("InterNodeV1LL", "staged rows at the gateway"),
    ],
)
def test_an_absent_node_is_named_with_its_stage(kind, stage, cuda_gpus):
    (o0, out0), (o1, _) = _outcomes("absent_peer", kind)
    assert o1 == "stayed away", o1
    assert o0.startswith("CUDA error"), o0
    want = f"{kind} dispatch (call 1) on rank 0 (node 0): rank 1 (node 1) did not arrive ({stage})"
    assert want in out0, out0
    assert seconds_of(o0) < 10.0, o0


@pytest.mark.parametrize("kind", KINDS)
def test_a_node_absent_from_combine_is_named(kind, cuda_gpus):
    (o0, out0), (o1, _) = _outcomes("combine_absent", kind)
    assert o1 == "stayed away", o1
    assert o0.startswith("CUDA error"), o0
    want = f"{kind} combine (call 1) on rank 0 (node 0): rank 1 (node 1) did not arrive (combine"
    assert want in out0, out0


@pytest.mark.parametrize("kind", KINDS)
def test_ranks_combining_with_and_without_weights_trap_on_both_ranks(kind, cuda_gpus):
    # Rank 0 combines with weights, rank 1 with None: the entry vote traps on both.
    want = "combine weights differ between ranks: rank {} passes {}, this rank passes {}"
    m0, m1 = want.format(1, "None", "weights"), want.format(0, "weights", "None")
    (o0, out0), (o1, out1) = _outcomes("weights_differ", kind, {0: m0, 1: m1})
    assert o0.startswith("CUDA error") and o1.startswith("CUDA error"), (o0, o1)
    assert m0 in out0, out0
    assert m1 in out1, out1
