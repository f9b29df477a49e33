# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.ep.balanced.plan (the C++ planner, no communication) against the pure-Python
reference (tests/workers/balanced_reference.py) over a case matrix, with the plan's
invariants checked on every case."""

import random
import sys
from pathlib import Path

import pytest
import torch

import mori.core as mc
from mori.core.testing import new_seed
from mori.ep import balanced

sys.path.insert(0, str(Path(__file__).parent / "workers"))
import balanced_reference as ref  # noqa: E402

# (R, epn, S, K, token_padding, routing kind): S 1-2048, K 1-8, epn 1-1025, padding 1-128.
CASES = [
    (1, 4, 16, 2, 128, "balanced"),
    (2, 1, 1, 1, 1, "balanced"),
    (2, 1, 7, 1, 3, "single"),
    (2, 3, 5, 8, 128, "duplicate"),
    (2, 1025, 4, 2, 1, "biased"),
    (2, 1025, 3, 8, 128, "single"),
    (2, 8, 2048, 8, 128, "biased"),
    (3, 5, 33, 3, 7, "all_remote"),
    (4, 2, 64, 1, 16, "all_local"),
    (4, 4, 100, 4, 32, "biased"),
    (4, 16, 256, 8, 128, "balanced"),
    (4, 16, 256, 8, 128, "duplicate"),
    (4, 6, 512, 6, 64, "all_remote"),
    (5, 7, 129, 5, 2, "single"),
    (8, 1, 9, 1, 1, "biased"),
    (8, 3, 1, 8, 128, "biased"),
    (8, 48, 128, 8, 128, "biased"),
    (8, 48, 128, 8, 128, "single"),
    (8, 4, 64, 7, 5, "duplicate"),
    (8, 2, 31, 3, 128, "all_local"),
    (6, 9, 40, 4, 1, "all_remote"),
]


def _case(R, epn, S, K, pad, kind, seed):
    rng = random.Random(seed)
    E = R * epn
    topk = ref.routing(kind, R, E, S, K, rng)
    tpe = [ref.counts(topk[r], E) for r in range(R)]
    return E, topk, tpe


def _check_invariants(tables, tpe, S, K, epn):
    R, E = len(tpe), len(tpe[0])
    alloc = tables["alloc"]
    for e in range(E):  # every expert's pairs are placed, none twice
        assert sum(alloc[d][e] for d in range(R)) == sum(tpe[r][e] for r in range(R)), e
    for d in range(R):
        assert sum(alloc[d]) == S * K, (d, sum(alloc[d]))  # exactly S*K rows per rank
        remote = [e for e in range(E) if alloc[d][e] and e // epn != d]
        assert len(remote) <= epn
        assert len({e // epn for e in remote}) <= 1  # one remote home group at most
        assert tables["cu_seqlens"][d][-1] <= tables["nvs"]


@pytest.mark.parametrize("case", CASES, ids=[f"R{c[0]}-epn{c[1]}-S{c[2]}-K{c[3]}-p{c[4]}-{c[5]}"
                                             for c in CASES])  # fmt: skip
def test_plan_matches_reference(case):
    R, epn, S, K, pad, kind = case
    seed = new_seed()
    E, topk, tpe = _case(R, epn, S, K, pad, kind, seed)
    want = ref.plan_tables(tpe, S, K, pad)
    _check_invariants(want, tpe, S, K, epn)
    got = balanced.plan(torch.tensor(tpe, dtype=torch.int32), S, K, pad,
                        topk=torch.tensor(topk, dtype=torch.int32))  # fmt: skip
    assert got.nvs == want["nvs"] == ref.nvs(S, K, epn, pad)
    for name in ("alloc", "expert_offsets", "cu_seqlens", "zero_fill_ranges",
                 "experts_to_copy", "remote_stats"):  # fmt: skip
        assert getattr(got, name).tolist() == want[name], name
    dst_all = []
    for r in range(R):
        dst = ref.destinations(tpe, want, topk[r], r)
        assert got.dst[r].tolist() == dst, f"dst of rank {r}"
        dst_all.append(dst)
    # Every slot is reached by one pair at most, inside its expert's segment.
    NvS = want["nvs"]
    raws = [v if v >= 0 else -v - 1 for dst in dst_all for v in dst]
    assert len(set(raws)) == len(raws) == R * S * K
    for d in range(R):
        groups = ref.duplicate_groups(dst_all, K, NvS, d)
        n = int(got.dup_counts[d][0])
        assert n == len(groups)
        assert int(got.dup_counts[d][1]) == sum(len(g[1]) for g in groups)
        for i, (primary, dups) in enumerate(groups):
            p, start, cnt = got.dup_groups[d][i].tolist()
            assert (p, cnt) == (primary, len(dups))
            assert got.dup_loffs[d][start : start + cnt].tolist() == dups


def test_plan_is_deterministic_and_independent_of_topk():
    seed = new_seed()
    E, topk, tpe = _case(4, 8, 64, 4, 16, "biased", seed)
    t = torch.tensor(tpe, dtype=torch.int32)
    a = balanced.plan(t, 64, 4, 16)
    b = balanced.plan(t.to(torch.int64), 64, 4, 16, topk=torch.tensor(topk))
    for name in ("alloc", "cu_seqlens", "experts_to_copy", "zero_fill_ranges"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert a.dst is None and b.for_rank(2).dst.shape == (64 * 4,)


def test_skewed_plan_balances_where_routing_does_not():
    # Every pair to expert 0: without balancing rank 0 would receive R*S*K rows.
    R, S, K, epn = 8, 64, 8, 4
    tpe = torch.zeros(R, R * epn, dtype=torch.int32)
    tpe[:, 0] = S * K
    p = balanced.plan(tpe, S, K, 128)
    assert p.alloc.sum(dim=1).tolist() == [S * K] * R
    assert p.alloc[:, 0].tolist() == [S * K] * R
    assert p.experts_to_copy[1:, 0].tolist() == [0] * (R - 1)
    assert p.remote_stats[0].tolist() == [0, R - 1]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(S=0), "S 0 must be an int >= 1"),
        (dict(K=0), "K 0 must be an int >= 1"),
        (dict(token_padding=0), "token_padding 0 must be an int >= 1"),
        (dict(tpe=torch.zeros(2, 3, dtype=torch.int32)), "E 3 must be a positive multiple"),
        (dict(tpe=torch.ones(2, 4)), "tpe dtype torch.float32 must be an integer dtype"),
        (
            dict(tpe=torch.tensor([[4, 0, 0, 0], [2, 2, 0, 1]], dtype=torch.int32)),
            "tokens_per_expert of rank 1 sums to 5, expected S*K = 4",
        ),
        (
            dict(tpe=torch.tensor([[4, 0, 0, 0], [6, -2, 0, 0]], dtype=torch.int32)),
            "tokens_per_expert of rank 1 is -2 for expert 1 (negative)",
        ),
        (
            dict(topk=torch.tensor([[[0, 0], [0, 9]], [[0, 0], [0, 0]]])),
            "expert id 9 out of range [0, 4) at token 1, k 1",
        ),
        (
            dict(topk=torch.tensor([[[0, 0], [0, 1]], [[0, 0], [0, 0]]])),
            "tokens_per_expert[0] is 4 but topk_experts routes 3 tokens to expert 0 on rank 0",
        ),
        (
            dict(topk=torch.zeros(2, 2, 3, dtype=torch.int32)),
            "topk shape (2, 2, 3) must be (2, 2, 2)",
        ),
        (dict(S=(1 << 28) + 1, K=8, tpe=torch.zeros(2, 4, dtype=torch.int32)), "exceeds 2^31"),
    ],
)
def test_bad_plan_input_is_refused_naming_the_value(kw, message):
    args = dict(tpe=torch.tensor([[4, 0, 0, 0], [4, 0, 0, 0]], dtype=torch.int32), S=2, K=2,
                token_padding=4)  # fmt: skip
    args.update(kw)
    with pytest.raises(mc.InvalidArgumentError) as e:
        balanced.plan(**args)
    assert message in str(e.value)
