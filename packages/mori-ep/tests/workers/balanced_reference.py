# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""A pure-Python reference of the balanced planner and data paths (plain lists, no
mori code), written from the algorithm's statement: the tests compare
mori.ep.balanced's planner, dispatch and combine with it. Also the routings of the
case matrix."""

from __future__ import annotations

import random


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def nvs(S: int, K: int, epn: int, pad: int) -> int:
    return align_up(S * K + (pad - 1) * 2 * epn, pad)


def _first_max(v):
    return max(range(len(v)), key=lambda i: (v[i], -i))


def _first_min(v):
    return min(range(len(v)), key=lambda i: (v[i], i))


def plan_tables(tpe: list[list[int]], S: int, K: int, pad: int) -> dict:
    """Every rank's tables from tpe [R][E] (lists)."""
    R, E = len(tpe), len(tpe[0])
    epn, cap, NvS = E // R, S * K, nvs(S, K, E // R, pad)
    count = [sum(tpe[r][e] for r in range(R)) for e in range(E)]
    balance = [sum(count[h * epn : (h + 1) * epn]) - cap for h in range(R)]
    quota = [[0] * R for _ in range(R)]
    while True:
        h, u = _first_max(balance), _first_min(balance)
        if balance[h] <= 0:
            break
        quota[h][u] = -balance[u]
        balance[h] += balance[u]
        balance[u] = 0
    alloc = [[0] * E for _ in range(R)]  # [dest][expert]
    for e in range(E):
        alloc[e // epn][e] = count[e]
    for h in range(R):
        left = count[h * epn : (h + 1) * epn]
        q = list(quota[h])
        while True:
            d = _first_max(q)
            if q[d] <= 0:
                break
            i = _first_max(left)
            take = min(left[i], q[d])
            assert take > 0
            alloc[d][h * epn + i] += take
            alloc[h][h * epn + i] -= take
            left[i] -= take
            q[d] -= take
    copy = [[-1] * epn for _ in range(R)]
    stats = [[0, 0] for _ in range(R)]
    offsets = [[0] * E for _ in range(R)]
    cu = [[0] * (2 * epn) for _ in range(R)]
    fill = [[[0, 0] for _ in range(2 * epn)] for _ in range(R)]
    for d in range(R):
        remote = [e for e in range(E) if e // epn != d and alloc[d][e] > 0]
        assert len(remote) <= epn
        copy[d][: len(remote)] = remote
        stats[d][0] = len(remote)
        for e in remote:
            stats[e // epn][1] += 1
        start = 0
        for g in range(2 * epn):
            e = d * epn + g if g < epn else copy[d][g - epn]
            rows = alloc[d][e] if e >= 0 else 0
            padded = align_up(rows, pad) if rows else 0
            if rows:
                offsets[d][e] = start
                if padded > rows:
                    fill[d][g] = [start + rows, padded - rows]
            start += padded
            cu[d][g] = start
        assert start <= NvS
    return dict(alloc=alloc, expert_offsets=offsets, cu_seqlens=cu, zero_fill_ranges=fill,
                experts_to_copy=copy, remote_stats=stats, nvs=NvS)  # fmt: skip


def destinations(tpe, tables, topk_rank: list[list[int]], rank: int) -> list[int]:
    """dst [S*K] of source `rank` (topk_rank [S][K])."""
    E = len(tpe[0])
    NvS, alloc, offs = tables["nvs"], tables["alloc"], tables["expert_offsets"]
    nxt = [sum(tpe[r][e] for r in range(rank)) for e in range(E)]
    out = []
    for row in topk_rank:
        seen = []
        for e in row:
            g = nxt[e]
            nxt[e] += 1
            d = 0
            while g >= alloc[d][e]:
                g -= alloc[d][e]
                d += 1
            raw = d * NvS + offs[d][e] + g
            out.append(-raw - 1 if d in seen else raw)
            seen.append(d)
    return out


def duplicate_groups(dst_all: list[list[int]], K: int, NvS: int, dest: int):
    """(groups [(primary, [dups ascending])] ascending primary) of rank dest."""
    by_primary: dict[int, list[int]] = {}
    for dst in dst_all:
        for t in range(len(dst) // K):
            primary = None
            for v in dst[t * K : (t + 1) * K]:
                raw = v if v >= 0 else -v - 1
                if raw // NvS != dest:
                    continue
                if primary is None:
                    primary = raw % NvS
                else:
                    by_primary.setdefault(primary, []).append(raw % NvS)
    return [(p, sorted(by_primary[p])) for p in sorted(by_primary)]


# -- routings ---------------------------------------------------------------------------

KINDS = ("balanced", "biased", "all_local", "all_remote", "duplicate", "single")


def routing(kind: str, R: int, E: int, S: int, K: int, rng: random.Random) -> list:
    """topk [R][S][K] of one routing kind."""
    epn = E // R
    out = []
    # Hot experts for "biased": lognormal weights, drawn once per routing.
    hot = [rng.lognormvariate(0, 2) for _ in range(E)] if kind == "biased" else None
    for r in range(R):
        rows = []
        for _ in range(S):
            if kind == "balanced":
                row = rng.sample(range(E), K) if K <= E else [rng.randrange(E) for _ in range(K)]
            elif kind == "biased":
                row = rng.choices(range(E), weights=hot, k=K)
            elif kind == "all_local":
                row = [r * epn + rng.randrange(epn) for _ in range(K)]
            elif kind == "all_remote":
                home = (r + 1) % R
                row = [home * epn + rng.randrange(epn) for _ in range(K)]
            elif kind == "duplicate":
                e = rng.randrange(E)
                row = [e] * K
            elif kind == "single":
                row = [0] * K
            else:
                raise ValueError(kind)
            rows.append(row)
        out.append(rows)
    return out


def counts(topk_rank: list[list[int]], E: int) -> list[int]:
    c = [0] * E
    for row in topk_rank:
        for e in row:
            c[e] += 1
    return c
