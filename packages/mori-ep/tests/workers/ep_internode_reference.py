# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The inter-node protocols (InterNode, InterNodeV1, InterNodeV1LL) in plain Python:
what every rank receives, in which order, what combine returns bit for bit, and how
many bytes each rank puts on its inter-node link, from every rank's inputs. The
workers compare mori.ep's CPU implementation with it; csrc/internode/protocol.hpp is
the protocol it follows.

Nodes: rank r is on node r // L. D(t): the ranks owning an expert of token t.
Dispatch rows at rank d: (s, t) for every source s (ascending) and token t of s
(ascending) with d in D(t). Combine of token t of rank s, y_d the row rank d returns:
  InterNode   fp32 sum over d in D(t) ascending, rounded once
  V1, V1LL    partial_n = that sum over d in D(t) on node n, rounded to the row dtype;
              then the fp32 sum of the partials over the nodes of D(t), ascending
(fp8_direct_cast rounds each y_d to fp8 e4m3 first; a single part is copied).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FLAT, V1, V1LL = "InterNode", "InterNodeV1", "InterNodeV1LL"


def dests(idx_row: torch.Tensor, epr: int) -> list[int]:
    """D(t): ascending ranks owning one of the token's experts (-1 slots skipped)."""
    return sorted({int(e) // epr for e in idx_row.tolist() if e >= 0})


def fp8_value(row: torch.Tensor) -> torch.Tensor:
    """A bf16 row's fp32 values after rounding to fp8 e4m3 (saturating at 448)."""
    return row.float().clamp(-448.0, 448.0).to(FP8).float()


def combine_rows(parts: list[torch.Tensor], dtype: torch.dtype, fp8_cast: bool, cols: int):
    """The CPU reduction of one token (common/numeric.hpp's CombineTokenRow): no part
    gives zeros, one part (not fp8_cast) its bits, else an fp32 sum from -0.0 in
    order, rounded once to dtype."""
    if not parts:
        return torch.zeros(cols, dtype=dtype)
    if len(parts) == 1 and not fp8_cast:
        return parts[0].clone()
    acc = torch.full((cols,), -0.0, dtype=torch.float32)
    for p in parts:
        acc += fp8_value(p) if fp8_cast else p.float()
    return acc.to(dtype)


def combine_weights(parts: list[torch.Tensor], k: int) -> torch.Tensor:
    """CombineTokenWeights: zeros, one part's bits, or an fp32 sum from -0.0 in order."""
    if not parts:
        return torch.zeros(k, dtype=torch.float32)
    if len(parts) == 1:
        return parts[0].clone()
    acc = torch.full((k,), -0.0, dtype=torch.float32)
    for p in parts:
        acc += p
    return acc


class InterNodeReference:
    """One call's reference for every rank. ``idx[s]``: rank s's int32 [n_s, k] routing;
    ``row_bytes``: dispatch token row bytes; ``scale_bytes``; ``k``."""

    def __init__(self, kind: str, world: int, local: int, epr: int, k: int, idx: list):
        self.kind, self.world, self.local, self.epr, self.k = kind, world, local, epr, k
        self.nodes = world // local
        self.idx = idx
        self.d = [[dests(row, epr) for row in idx[s]] for s in range(world)]

    def node(self, r: int) -> int:
        return r // self.local

    def gateway(self, r: int, n: int) -> int:
        return n * self.local + r % self.local

    def rows_at(self, d: int) -> list[tuple[int, int]]:
        """The (source rank, source token) of each dispatch row at rank d, in order."""
        return [(s, t) for s in range(self.world) for t, ds in enumerate(self.d[s]) if d in ds]

    def combine(self, s: int, t: int, row_of, weights_of, dtype, fp8_cast: bool, cols: int):
        """Token t of rank s combined: row_of(d) / weights_of(d) what rank d returns."""
        ds = self.d[s][t]
        if self.kind == FLAT:
            parts = [row_of(d) for d in ds]
            w = None if weights_of is None else [weights_of(d) for d in ds]
            return combine_rows(parts, dtype, fp8_cast, cols), (
                None if w is None else combine_weights(w, self.k)
            )
        partials, partial_w = [], []
        for n in range(self.nodes):
            on = [d for d in ds if self.node(d) == n]
            if not on:
                continue
            partials.append(combine_rows([row_of(d) for d in on], dtype, fp8_cast, cols))
            if weights_of is not None:
                partial_w.append(combine_weights([weights_of(d) for d in on], self.k))
        out = combine_rows(partials, dtype, False, cols)
        return out, (None if weights_of is None else combine_weights(partial_w, self.k))

    # ------------------------------------------------------------ byte accounting
    def dispatch_bytes(self, r: int, row_bytes: int, scale_bytes: int) -> dict[str, int]:
        """What rank r puts on its link in dispatch, and its algo/physical counts."""
        w, k, local = self.world, self.k, self.local
        remote_pes = w - local
        hier = self.kind != FLAT
        row_meta = 8 * k + scale_bytes + 4 + (4 if hier else 0)  # weights, indices, src, mask
        algo = physical_rows = 0
        for ds in self.d[r]:
            nodes = {self.node(d) for d in ds}
            if hier:
                algo += len(nodes) * row_bytes
                physical_rows += len(nodes - {self.node(r)})
            else:
                algo += len(ds) * row_bytes
                physical_rows += sum(1 for d in ds if self.node(d) != self.node(r))
        forwarded = 0
        if hier:  # rows r forwards as the gateway of its node for each other node's source
            for n in range(self.nodes):
                if n == self.node(r):
                    continue
                s = self.gateway(r, n)
                for ds in self.d[s]:
                    forwarded += sum(1 for d in ds if self.node(d) == self.node(r))
        signals = 0
        meta = physical_rows * row_meta
        if self.kind != V1LL:
            meta += remote_pes * (w - 1) * 8  # count rows: all but the signal word
            signals += remote_pes * 2  # last count word, done
        if hier:
            signals += self.nodes - 1  # staged-rows word to each other node's gateway
        return {
            "algo_token": algo,
            "physical_token": physical_rows * row_bytes,
            "physical_rows": physical_rows,
            "forwarded_rows": forwarded,
            "link_token": physical_rows * row_bytes,
            "link_meta": meta,
            "link_signal": 8 * signals,
            "link_signals": signals,
        }

    def combine_bytes(self, r: int, row_bytes: int, with_weights: bool) -> dict[str, int]:
        """What rank r puts on its link in combine, and its algo/physical counts."""
        w, k, local = self.world, self.k, self.local
        wb = 4 * k if with_weights else 0
        signals = w - local  # the entry vote
        if self.kind == FLAT:
            rows = self.rows_at(r)
            physical = sum(1 for s, _ in rows if self.node(s) != self.node(r))
            algo = len(rows) * row_bytes
            signals += w - local  # combine rows done
        else:
            physical = 0
            for n in range(self.nodes):
                if n == self.node(r):
                    continue
                s = self.gateway(r, n)
                physical += sum(
                    1 for ds in self.d[s] if any(self.node(d) == self.node(r) for d in ds)
                )
            algo = sum(len({self.node(d) for d in ds}) for ds in self.d[r]) * row_bytes
            signals += self.nodes - 1  # partials done
        return {
            "algo_token": algo,
            "physical_token": physical * row_bytes,
            "physical_rows": physical,
            "forwarded_rows": 0,
            "link_token": physical * row_bytes,
            "link_meta": physical * wb,
            "link_signal": 8 * signals,
            "link_signals": signals,
        }


def deepep_rdma_bytes(idx: list, epr: int, local: int, row_bytes: int, cross_only: bool) -> int:
    """DeepEP's internode accounting (tests/test_internode.py: num_rdma_token_sent *
    row bytes, num_rdma_token_sent = the (token, destination node) pairs over every
    rank's tokens): with ``cross_only`` only the pairs whose node is not the sender's."""
    pairs = 0
    for s, rows in enumerate(idx):
        for row in rows:
            nodes = {int(e) // epr // local for e in row.tolist() if e >= 0}
            if cross_only:
                nodes.discard(s // local)
            pairs += len(nodes)
    return pairs * row_bytes
