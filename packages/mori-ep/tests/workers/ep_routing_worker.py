# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the routing-handle tests (MORI's return_routing= / routing=).

argv: placement scenarios seed. placement: cpu (host heap, the CPU implementation),
shared (every rank on GPU 0) or per_gpu (rank r on GPU r); scenarios: names below,
separated by commas. Every dispatch is checked bit for bit against a reference built
from an all-gather of every rank's inputs, every combine exactly (its reduction order
is defined). Prints "rank N ok" last.
  parity    dispatch(return_routing=True) returns MORI's 6-tuple and a handle with
            MORI's fields; combine(routing=handle) gives the bits combine() gives
  replay    dispatch(routing=handle) with new payloads and a different routing lays
            rows out as the handle's dispatch did (the new indices travel as data);
            the handle is unchanged and combines again
  inflight  two micro-batches dispatched before either is combined; each combine by
            its handle gives its own reference; a third round without handles after
  order     combine order rules (each dispatch once, in dispatch order) and a handle
            of another op, refused on every rank with InvalidStateError, the op still
            usable; from_tensors handles are replayed on another op, then combined
  inconsistent  a handle whose map marks tokens sent to this rank that have no row
            here, and holds -1 for "not sent": combine reads neither as sent
  errors    (cpu) routing= with return_routing=, a replay with the wrong token
            count, and a combine by a non-contiguous handle, on one rank: every rank
            raises in that call, the op still works;
            the low-latency kernel types refuse routing handles
"""

import sys

import torch
import torch.distributed as dist
from ep_reference import Routing, expert, factor

import mori.core as mc
from mori.core.dist_compat import all_gather_single
from mori.core.launch import expect_raises as expect
from mori.core.testing import start_rank
from mori.ep import (
    EpDispatchCombineConfig,
    EpDispatchCombineKernelType,
    EpDispatchCombineOp,
    EpDispatchRoutingHandle,
)

placement, scenario, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank, world, dev = start_rank(placement, "128M" if placement == "cpu" else "512M", 60)
HIDDEN, M, EPR, K = 128, 20, 2, 3
REF = Routing(world, rank, M, EPR, K)
gen = torch.Generator().manual_seed(seed * 7919 + rank)
print(f"rank {rank}: seed {seed}, generator seed {seed * 7919 + rank}", flush=True)


def make_op(**kw) -> EpDispatchCombineOp:
    cfg = EpDispatchCombineConfig(torch.bfloat16, rank, world, HIDDEN, 0, 4, 2, M, EPR, K, **kw)
    return EpDispatchCombineOp(cfg, timeout_s=30)


class Batch:
    """One rank's fresh dispatch inputs and the reference of what it receives."""

    def __init__(self, n: int | None = None, lo: int = 0):
        self.n = n = int(torch.randint(lo, M + 1, (1,), generator=gen)) if n is None else n
        self.x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16)
        self.w = torch.rand(n, K, generator=gen)
        self.idx = REF.routing("random", n, gen, 0)
        counts = torch.zeros(world, dtype=torch.int64)
        all_gather_single(counts, torch.tensor([n], dtype=torch.int64))
        self.counts = counts.tolist()
        pad = REF.padded
        self.ax = REF.gather(pad(self.x, n))
        self.aw = REF.gather(pad(self.w, n))
        self.ai = REF.gather(pad(self.idx, n, -1))

    def dests(self, s: int, t: int, ai=None) -> list[int]:
        ai = self.ai if ai is None else ai
        return sorted({int(e) // EPR for e in ai[s][t] if e >= 0})

    def rows(self, ai=None) -> list[tuple[int, int]]:
        """(source rank, token) of every row this rank receives, in order."""
        return [
            (s, t)
            for s in range(world)
            for t in range(self.counts[s])
            if rank in self.dests(s, t, ai)
        ]

    def args(self):
        return self.x.to(dev), self.w.to(dev), None, self.idx.to(dev)


def check_dispatch(b: Batch, res, rows) -> torch.Tensor:
    """The received rows equal the reference's `rows` of `b` bit for bit; returns them."""
    out, out_w, out_s, out_idx, total = res[:5]
    total = int(total.item())
    assert out_s is None
    assert total == len(rows), f"total_recv {total}, expected {len(rows)}"
    out, out_w, out_idx = out.cpu()[:total], out_w.cpu()[:total], out_idx.cpu()[:total]
    if rows:
        sel = lambda a: torch.stack([a[s][t] for s, t in rows])  # noqa: E731
        assert torch.equal(out.view(torch.int16), sel(b.ax).view(torch.int16)), "tokens differ"
        assert torch.equal(out_w.view(torch.int32), sel(b.aw).view(torch.int32)), "weights"
        assert torch.equal(out_idx, sel(b.ai)), "indices differ"
    return out


def check_combine(b: Batch, res, sets_of=None) -> None:
    """combine's outputs: per token the bf16 of the fp32 sum, ascending rank, of
    bf16(x * factor(d)) over the ranks d the token went to (``sets_of``: b's own
    routing, or another batch's whose layout was replayed)."""
    cout, cw = res
    sets_of = b if sets_of is None else sets_of
    assert cout.shape == (b.n, HIDDEN), cout.shape
    want = torch.zeros(b.n, HIDDEN)
    want_w = torch.zeros(b.n, K)
    for t in range(b.n):
        for d in sets_of.dests(rank, t):
            want[t] += expert(b.x[t : t + 1], None, d)[0].float()
            want_w[t] += b.w[t] * factor(d)
    assert torch.equal(cout.cpu().view(torch.int16), want.to(torch.bfloat16).view(torch.int16)), (
        "combine differs from the reference"
    )
    if cw is not None:
        assert torch.equal(cw.cpu(), want_w), "combined weights differ"


def expert_of(out: torch.Tensor, out_w: torch.Tensor, total: int):
    y = expert(out[:total].cpu(), None, rank).to(dev)
    yw = (out_w[:total].cpu() * factor(rank)).to(dev)
    return y, yw


def round_trip(op, b: Batch, **kw):
    """A checked dispatch (kw: return_routing / routing) and the expert outputs."""
    res = op.dispatch(*b.args(), **kw)
    total = int(res[4].item())
    check_dispatch(b, res, b.rows())
    return res, expert_of(res[0], res[1], total)


def run_parity() -> None:
    op = make_op()
    b = Batch()
    res = op.dispatch(*b.args(), return_routing=True)
    assert len(res) == 6, len(res)
    h = res[5]
    assert isinstance(h, EpDispatchRoutingHandle) and h.cur_rank_num_token == b.n
    assert res[4] is h.total_recv_token_num
    check_dispatch(b, res, b.rows())
    assert len(h.tensors()) == 5 and all(t.dtype == torch.int32 for t in h.tensors())
    assert h.inter_node_disp_dest_tok_id_map.numel() == 0
    sent = h.disp_dest_tok_id_map.view(M, world).cpu()
    for t in range(M):
        want = [int(d in b.dests(rank, t)) for d in range(world)] if t < b.n else [0] * world
        assert sent[t].tolist() == want, (t, sent[t])
    rows = b.rows()
    src = h.disp_tok_id_to_src_tok_id_local.cpu()
    assert src[: len(rows)].tolist() == [s * M + t for s, t in rows]
    assert (src[len(rows) :] == -1).all()
    y, yw = expert_of(res[0], res[1], len(rows))
    by_handle = [t.cpu().clone() for t in op.combine(y, yw, b.idx.to(dev), routing=h)]
    check_combine(b, by_handle)
    # The same dispatch without a handle combines to the same bits.
    _, (y, yw) = round_trip(op, b)
    plain = op.combine(y, yw, b.idx.to(dev))
    assert torch.equal(plain[0].cpu().view(torch.int16), by_handle[0].view(torch.int16))
    assert torch.equal(plain[1].cpu(), by_handle[1])
    op.close()


def run_replay() -> None:
    op = make_op()
    b1 = Batch()
    (res, (y, yw)) = round_trip(op, b1, return_routing=True)
    h = res[5]
    check_combine(b1, op.combine(y, yw, b1.idx.to(dev), routing=h))
    before = [t.clone() for t in h.tensors()]
    # Same token count, new payload, a different routing: the layout is b1's.
    b2 = Batch(n=b1.n)
    res2 = op.dispatch(*b2.args(), routing=h)
    assert len(res2) == 5
    assert res2[4] is h.total_recv_token_num
    check_dispatch(b2, res2, b1.rows())
    for a, c in zip(before, h.tensors(), strict=True):
        assert torch.equal(a, c), "replay changed the handle"
    y2, yw2 = expert_of(res2[0], res2[1], len(b1.rows()))
    check_combine(b2, op.combine(y2, yw2, b2.idx.to(dev), routing=h), sets_of=b1)
    # And once more, replayed twice in a row before combining the second.
    b3 = Batch(n=b1.n)
    res3 = op.dispatch(*b3.args(), routing=h)
    check_dispatch(b3, res3, b1.rows())
    res4 = op.dispatch(*b3.args(), routing=h)
    y4, yw4 = expert_of(res4[0], res4[1], len(b1.rows()))
    check_combine(b3, op.combine(y4, yw4, None, routing=h), sets_of=b1)
    op.close()


def run_inflight() -> None:
    op = make_op()
    ba, bb = Batch(), Batch()
    ra, (ya, ywa) = round_trip(op, ba, return_routing=True)
    rb, (yb, ywb) = round_trip(op, bb, return_routing=True)
    # Batch a's rows were copied out (expert_of) before b's dispatch overwrote them.
    ca = [t.cpu().clone() for t in op.combine(ya, ywa, ba.idx.to(dev), routing=ra[5])]
    cb = op.combine(yb, ywb, bb.idx.to(dev), routing=rb[5])
    check_combine(ba, ca)
    check_combine(bb, cb)
    # Three at once, the last combined without its handle (the op's last dispatch).
    bs = [Batch() for _ in range(3)]
    rs = [round_trip(op, bs[0], return_routing=True), round_trip(op, bs[1], return_routing=True)]
    rs.append(round_trip(op, bs[2]))
    for i, (b, (res, (y, yw))) in enumerate(zip(bs, rs, strict=True)):
        kw = {"routing": res[5]} if i < 2 else {}
        check_combine(b, op.combine(y, yw, b.idx.to(dev), **kw))
    op.close()


def run_order() -> None:
    op, other = make_op(), make_op()
    ba, bb = Batch(lo=1), Batch()
    ra, (ya, ywa) = round_trip(op, ba, return_routing=True)
    rb, (yb, ywb) = round_trip(op, bb, return_routing=True)
    check_combine(bb, op.combine(yb, ywb, None, routing=rb[5]))
    # a's dispatch precedes the combined b's: refused locally, on every rank alike.
    expect(mc.InvalidStateError, "combines follow the order of their dispatches",
           op.combine, ya, ywa, None, routing=ra[5])  # fmt: skip
    expect(mc.InvalidStateError, "the last combine was of epoch",
           op.combine, yb, ywb, None, routing=rb[5])  # fmt: skip
    expect(mc.InvalidStateError, "combine needs a successful dispatch", op.combine, yb, ywb, None)
    # A handle of another op.
    _, (yo, ywo) = round_trip(other, bb, return_routing=False)
    expect(mc.InvalidStateError, "not made or replayed by a dispatch of this op",
           other.combine, yo, ywo, None, routing=ra[5])  # fmt: skip
    check_combine(bb, other.combine(yo, ywo, None))
    # MORI's from_tensors: a handle rebuilt from a's tensors, replayed on the other op.
    h = EpDispatchRoutingHandle.from_tensors(ra[5].tensors(), ra[5].cur_rank_num_token)
    res = other.dispatch(*ba.args(), routing=h)
    check_dispatch(ba, res, ba.rows())
    y, yw = expert_of(res[0], res[1], len(ba.rows()))
    check_combine(ba, other.combine(y, yw, None, routing=h))
    # The op still works after the refusals.
    _, (y, yw) = round_trip(op, ba)
    check_combine(ba, op.combine(y, yw, None))
    op.close()
    other.close()


def run_inconsistent() -> None:
    op = make_op()
    b = Batch(lo=1)
    res, (y, yw) = round_trip(op, b, return_routing=True)
    h = res[5]
    # Tokens not sent here marked 1 at this rank (no row of theirs came back), and -1
    # (MORI's "not sent") wherever a token was not sent: combine reads neither as sent.
    sent = h.disp_dest_tok_id_map.view(M, world)
    absent_here = sent[:, rank] == 0
    sent[sent == 0] = -1
    sent[absent_here, rank] = 1
    check_combine(b, op.combine(y, yw, None, routing=h))
    op.close()


def run_errors() -> None:
    op = make_op()
    b = Batch()
    res, (y, yw) = round_trip(op, b, return_routing=True)
    h = res[5]
    check_combine(b, op.combine(y, yw, None, routing=h))
    others = "dispatch rejected by rank 0"
    if rank == 0:
        expect(mc.InvalidArgumentError, "pass either `routing=` (replay) or `return_routing=True`",
               op.dispatch, *b.args(), routing=h, return_routing=True)  # fmt: skip
    else:
        expect(mc.InvalidArgumentError, others, op.dispatch, *b.args())
    # A replay whose token count is not the handle's, on rank 0 only.
    wrong = b.n - 1 if b.n > 0 else b.n + 1
    if rank == 0:
        msg = f"replay dispatch input has {wrong} tokens but routing.cur_rank_num_token={b.n}"
        expect(mc.InvalidArgumentError, msg, op.dispatch, *Batch(n=wrong).args(), routing=h)
    else:
        Batch(n=b.n)  # the all-gathers rank 0's Batch makes
        expect(mc.InvalidArgumentError, others, op.dispatch, *b.args(), routing=h)
    # A from_tensors handle without a token count is refused as MORI refuses it.
    bare = EpDispatchRoutingHandle.from_tensors(h.tensors())
    expect(mc.InvalidArgumentError, "cur_rank_num_token 0", op.dispatch, *b.args(), routing=bare)
    # The op still replays and combines.
    res = op.dispatch(*b.args(), routing=h)
    check_dispatch(b, res, b.rows())
    y, yw = expert_of(res[0], res[1], len(b.rows()))
    check_combine(b, op.combine(y, yw, None, routing=h))
    # A combine by a handle whose map is not contiguous, on rank 0 only: every rank
    # raises in that call (its dispatch counts as combined), the op still works.
    res, (y, yw) = round_trip(op, b, return_routing=True)
    h = res[5]
    if rank == 0:
        strided = torch.zeros(2 * M * world, dtype=torch.int32, device=dev)[::2]
        strided.copy_(h.disp_dest_tok_id_map)
        h.disp_dest_tok_id_map = strided
        expect(mc.InvalidArgumentError, "disp_dest_tok_id_map must be contiguous",
               op.combine, y, yw, None, routing=h)  # fmt: skip
    else:
        expect(mc.InvalidArgumentError, "combine rejected by rank 0",
               op.combine, y, yw, None, routing=h)  # fmt: skip
    _, (y, yw) = round_trip(op, b)
    check_combine(b, op.combine(y, yw, None))
    op.close()
    ll = make_op(kernel_type=EpDispatchCombineKernelType.IntraNodeLL)
    expect(mc.NotSupportedError, "implemented for kernel_type IntraNode, not IntraNodeLL",
           ll.dispatch, *b.args(), return_routing=True)  # fmt: skip
    ll.close()


SCENARIOS = {"parity": run_parity, "replay": run_replay, "inflight": run_inflight,
             "order": run_order, "inconsistent": run_inconsistent,
             "errors": run_errors}  # fmt: skip
for name in scenario.split(","):
    SCENARIOS[name]()
dist.barrier()
print(f"rank {rank} ok", flush=True)
dist.destroy_process_group()
