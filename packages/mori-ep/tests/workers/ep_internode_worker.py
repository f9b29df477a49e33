# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the inter-node dispatch/combine tests (test_internode.py on host heaps,
test_internode_gpu.py on CUDA heaps).
argv: mode seed kind local_size [iters] [nodes] [placement] [rows]

Creates a host heap over gloo; nodes are emulated by ``gpu_per_node = local_size``
(nodes "mapped", the default: one heap local group, the proxy's mapped path), or also
as separate hosts by MORI_SHMEM_NODE_ID (nodes "hosts": the proxy's same-host CMA or
TCP path; "tcp": TCP forced with MORI_PROXY_TRANSPORT).
  random  a bf16 op, an fp8 op (with scales) and a bf16 op with fp8_direct_cast, every
          routing kind of ep_reference in turn (ranks with no tokens, -1 slots, one
          token, full), fresh inputs per call: dispatch rows, weights, scales,
          indices and src positions equal to ep_internode_reference's bit for bit,
          combine equal to its stated summation order bit for bit, and every rank's
          byte counts equal to its accounting; the totals checked against DeepEP's
          formula (algo: every destination node; physical: other nodes only).
  routing two micro-batches dispatched with routing handles, combined by them in order,
          one replayed with a new payload and combined again: bit for bit.
  errors  one rank passes a bad expert id (dispatch) or a short combine input: every
          rank fails the call, then the op works again.
  weights one rank combines with weights and the others without (and the reverse): every
          rank fails the call naming a rank that passes the other and what each passes;
          then combines with weights on every rank, and with None on every rank, equal
          the first call's bit for bit.
  death   the last node's ranks exit after a dispatch (os._exit): every surviving rank's
          combine raises MoriTimeoutError (or, when the proxy's TCP connection drops
          first, TransportError) naming a rank of that node, its node and the stage.
  graph   dispatch a, dispatch b, expert, combine b (a dispatch right after a dispatch:
          V1LL's done-word exchange) with fresh inputs copied into static tensors: every
          call's rows, combine and byte counts equal the reference bit for bit. On a
          CUDA heap: once eagerly, then captured once in a CUDA graph and replayed
          `iters` times; then dispatch b and combine b captured in two graphs, replayed
          `iters` times as dispatch, dispatch, combine. On a host heap the same calls
          eagerly, `iters` rounds.
placement: "cpu" (the default, a host heap) or "shared" (a CUDA heap, every rank on
GPU 0: the kernels; inputs are made on the host as on CPU and moved to the GPU, the
results compared on the host with the same references; modes random and routing).
"""

import os
import sys

import torch
import torch.distributed as dist
from ep_internode_reference import InterNodeReference, deepep_rdma_bytes
from ep_reference import FP8, ROUTINGS, Routing, expert, factor, op_config

import mori.core as mc
from mori.core import shmem
from mori.core.dist_compat import all_gather_single
from mori.core.launch import expect_raises as expect
from mori.ep import EpDispatchCombineKernelType, EpDispatchCombineOp

mode, seed, kind, local = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
iters = int(sys.argv[5]) if len(sys.argv) > 5 else 8
nodes = sys.argv[6] if len(sys.argv) > 6 else "mapped"
# placement: "cpu" (host heap, the default) or the CUDA heap's placement; rows "large"
# (host heaps): DeepSeek-sized rows and more tokens, so that a call's link payload wraps
# the proxy link's send ring several times (its reuse and ordering under load).
extra = sys.argv[7:]
large = "large" in extra
placement = next((a for a in extra if a and a != "large"), "cpu")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if nodes in ("hosts", "tcp"):
    os.environ["MORI_SHMEM_NODE_ID"] = f"node{rank // local}"
if nodes == "tcp":
    os.environ["MORI_PROXY_TRANSPORT"] = "tcp"
DEV = torch.device("cpu") if placement == "cpu" else torch.device("cuda", 0)
if DEV.type == "cuda":
    torch.cuda.set_device(DEV)


def settled(*results):
    """``results`` once the op's kernels have ended (a CUDA heap: the stream is
    synchronized first). A copy to pageable host memory (``tensor.cpu()``) while an
    inter-node kernel runs would hold the CUDA context the proxy needs for the
    kernel's own commands (its add kernel, its copies): seen on an H200 as a combine
    stalled until its timeout. torch's ``.item()`` copies through pinned memory."""
    if DEV.type == "cuda":
        torch.cuda.current_stream().synchronize()
    return results


dist.init_process_group("gloo", init_method="env://")
shmem.init(
    device="cpu" if DEV.type == "cpu" else 0, heap_size="512M" if large else "64M", timeout_s=60
)

HIDDEN, M, EPR, K = (7168, 160, 4, 4) if large else (256, 24, 4, 4)
REF = Routing(world, rank, M, EPR, K)
print(f"rank {rank}: {kind}, {world // local} nodes x {local} ({nodes}, {placement}), seed {seed}")


def make_op(dtype, quant="none", timeout_s=30.0) -> EpDispatchCombineOp:
    cfg = op_config(
        rank, world, HIDDEN, M, EPR, K, dtype,
        kernel_type=EpDispatchCombineKernelType[kind], gpu_per_node=local, quant_type=quant,
    )  # fmt: skip
    return EpDispatchCombineOp(cfg, timeout_s=timeout_s)


def gather_inputs(n, x, w, sc, idx):
    counts = torch.zeros(world, dtype=torch.int64)
    all_gather_single(counts, torch.tensor([n], dtype=torch.int64))
    ax, aw = REF.gather(REF.padded(x, n)), REF.gather(REF.padded(w, n))
    ai = REF.gather(REF.padded(idx, n, -1))
    asc = REF.gather(REF.padded(sc, n)) if sc is not None else None
    ai = [ai[s][: int(counts[s])] for s in range(world)]
    return counts, ax, aw, asc, ai


def total_of(d: dict) -> dict:
    keys = sorted(d)
    t = torch.tensor([d[k] for k in keys], dtype=torch.int64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def run_random(dtype, quant, base_seed) -> tuple[int, int, str]:
    op = make_op(dtype, quant)
    link = op._impl.link_name
    fp8, fp8_cast = dtype == FP8, quant == "fp8_direct_cast"
    crossed = 0
    for it in range(iters):
        rkind = ROUTINGS[it % len(ROUTINGS)]
        gen = torch.Generator().manual_seed(base_seed * 1009 + it * 31 + rank)
        n = REF.num_tokens(rkind, gen, it)
        x = torch.randn(n, HIDDEN, generator=gen)
        x = x.to(FP8) if fp8 else x.to(torch.bfloat16)
        w = torch.rand(n, K, generator=gen)
        sc = torch.rand(n, HIDDEN // 128, generator=gen) + 0.5 if fp8 else None
        idx = REF.routing(rkind, n, gen, it)

        on = [t.to(DEV) if t is not None else None for t in (x, w, sc, idx)]
        out, out_w, out_s, out_idx, total = settled(*op.dispatch(*on))
        total = int(total.item())
        out, out_w, out_idx = out.cpu(), out_w.cpu(), out_idx.cpu()
        out_s = out_s.cpu() if out_s is not None else None
        counts, ax, aw, asc, ai = gather_inputs(n, x, w, sc, idx)
        ref = InterNodeReference(kind, world, local, EPR, K, ai)
        rows = ref.rows_at(rank)
        where = f"it {it} ({rkind}, {dtype}, {quant})"
        assert total == len(rows), f"{where}: total_recv {total}, expected {len(rows)}"
        want_pos = torch.tensor([s * world * M + t for s, t in rows], dtype=torch.int32)
        assert torch.equal(op.get_dispatch_src_token_pos().cpu(), want_pos), f"{where}: src pos"
        if rows:

            def sel(a, rows=rows):
                return torch.stack([a[s][t] for s, t in rows])

            assert torch.equal(out[:total].view(torch.uint8), sel(ax).view(torch.uint8)), where
            assert torch.equal(out_w[:total].view(torch.int32), sel(aw).view(torch.int32)), where
            assert torch.equal(out_idx[:total], sel(ai)), where
            if fp8:
                assert torch.equal(out_s[:total].view(torch.int32), sel(asc).view(torch.int32))
        row_bytes = HIDDEN * x.element_size()
        sb = (HIDDEN // 128) * 4 if fp8 else 0
        got = op._mode.bytes("dispatch")
        want = ref.dispatch_bytes(rank, row_bytes, sb)
        for key, v in want.items():
            assert got[key] == v, f"{where}: dispatch {key} {got[key]}, expected {v}"
        assert got["moved"] == got["link_token"] + got["link_meta"], got
        tot = total_of({k: got[k] for k in ("algo_token", "physical_token", "physical_rows")})
        hier = kind != "InterNode"
        if hier:  # DeepEP's num_rdma_token_sent * row bytes, all nodes / other nodes only
            assert tot["algo_token"] == deepep_rdma_bytes(ai, EPR, local, row_bytes, False)
            assert tot["physical_token"] == deepep_rdma_bytes(ai, EPR, local, row_bytes, True)
        crossed += tot["physical_rows"]

        # Combine: rank d's experts scale its rows by factor(d).
        y = expert(out[:total], out_s[:total] if fp8 else None, rank)
        yw = out_w[:total] * factor(rank)
        cout, cw = settled(*op.combine(y.to(DEV), yw.to(DEV), idx.to(DEV)))
        cout, cw = cout.cpu(), cw.cpu()
        assert cout.shape == (n, HIDDEN) and cw.shape == (n, K)
        for t in range(n):

            def row_of(d, t=t, x=x, sc=sc):
                return expert(x[t : t + 1], sc[t : t + 1] if fp8 else None, d)[0]

            def weights_of(d, t=t, w=w):
                return w[t] * factor(d)

            want_row, want_w = ref.combine(
                rank, t, row_of, weights_of, torch.bfloat16, fp8_cast, HIDDEN
            )
            assert torch.equal(cout[t].view(torch.int16), want_row.view(torch.int16)), (
                f"{where}: combine of token {t} differs from the reference order"
            )
            assert torch.equal(cw[t].view(torch.int32), want_w.view(torch.int32)), where
        got = op._mode.bytes("combine")
        want = ref.combine_bytes(rank, HIDDEN * 2, True)
        for key, v in want.items():
            assert got[key] == v, f"{where}: combine {key} {got[key]}, expected {v}"
        assert got["moved"] == got["link_token"] + got["link_meta"], got
        if hier:
            tot = total_of({"physical_token": got["physical_token"]})
            assert tot["physical_token"] == deepep_rdma_bytes(ai, EPR, local, HIDDEN * 2, True)
    op.close()
    return iters, crossed, link


def run_routing(base_seed) -> None:
    """Two micro-batches dispatched with return_routing=True, then combined by their
    handles in order; then the first replayed with a new payload and combined again:
    each combine equal to the reference bit for bit."""
    op = make_op(torch.bfloat16)
    batches = []
    for b in range(2):
        gen = torch.Generator().manual_seed(base_seed * 1009 + b * 31 + rank)
        n = REF.num_tokens("random", gen, b)
        x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16)
        w = torch.rand(n, K, generator=gen)
        idx = REF.routing("random", n, gen, b)
        out, out_w, _, _, total, handle = settled(
            *op.dispatch(x.to(DEV), w.to(DEV), None, idx.to(DEV), return_routing=True)
        )
        total = int(total.item())
        out, out_w = out.cpu(), out_w.cpu()
        _, _, _, _, ai = gather_inputs(n, x, w, None, idx)
        ref = InterNodeReference(kind, world, local, EPR, K, ai)
        # The experts' outputs, kept: the next dispatch rewrites the receive buffers.
        y = expert(out[:total], None, rank).clone()
        batches.append((n, x, w, idx, ref, handle, y, (out_w[:total] * factor(rank)).clone()))

    def check(b, x, w, idx, cout, cw, n, ref):
        for t in range(n):
            want_row, want_w = ref.combine(
                rank, t, lambda d, t=t: expert(x[t : t + 1], None, d)[0],
                lambda d, t=t: w[t] * factor(d), torch.bfloat16, False, HIDDEN,
            )  # fmt: skip
            assert torch.equal(cout[t].view(torch.int16), want_row.view(torch.int16)), (b, t)
            assert torch.equal(cw[t].view(torch.int32), want_w.view(torch.int32)), (b, t)

    for b, (n, x, w, idx, ref, handle, y, yw) in enumerate(batches):
        cout, cw = settled(*op.combine(y.to(DEV), yw.to(DEV), idx.to(DEV), routing=handle))
        check(b, x, w, idx, cout.cpu(), cw.cpu(), n, ref)
    n, x, w, idx, ref, handle, _, _ = batches[0]
    x2 = (x.float() * 2).to(torch.bfloat16)
    out, out_w, _, _, total = settled(
        *op.dispatch(x2.to(DEV), w.to(DEV), None, idx.to(DEV), routing=handle)
    )
    total = int(total.item())
    y, yw = expert(out[:total].cpu(), None, rank), out_w[:total].cpu() * factor(rank)
    cout, cw = settled(*op.combine(y.to(DEV), yw.to(DEV), idx.to(DEV), routing=handle))
    check("replay", x2, w, idx, cout.cpu(), cw.cpu(), n, ref)
    print(f"rank {rank}: 2 handles combined in order, one replayed")
    op.close()


def run_graph(base_seed) -> None:
    """Mode graph (see the module docstring). Shapes are static in a graph: each rank
    sends a fixed number of tokens per batch; the routing and payload change."""
    op = make_op(torch.bfloat16)
    sizes = {"a": M if rank == 0 else M // 2 + 3, "b": M // 3 + rank}
    static = {
        b: (
            torch.zeros(n, HIDDEN, dtype=torch.bfloat16, device=DEV),
            torch.zeros(n, K, device=DEV),
            torch.full((n, K), -1, dtype=torch.int32, device=DEV),
        )
        for b, n in sizes.items()
    }
    kinds = ["random", "one_rank", "round_robin", "dup", "one_expert"]

    def fill(rep):
        """Fresh inputs of both batches, copied into the static tensors (host copies
        kept for the reference)."""
        fresh = {}
        for i, (b, n) in enumerate(sizes.items()):
            gen = torch.Generator().manual_seed(base_seed * 1009 + rep * 31 + i * 7 + rank)
            rkind = kinds[(rep + i) % len(kinds)]
            x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16)
            w = torch.rand(n, K, generator=gen)
            idx = REF.routing(rkind, n, gen, rep)
            for dst, src in zip(static[b], (x, w, idx), strict=True):
                dst.copy_(src)
            fresh[b] = (x, w, idx, rkind)
        return fresh

    def keep(out, out_w, out_idx, total):
        """A dispatch's outputs, kept (the next dispatch rewrites the receive buffers)."""
        return [t.clone() for t in (out, out_w, out_idx, total, op._mode.recv_src_pos)]

    def experts(out, out_w):
        """Every receive row through the expert (rows past total_recv are not combined)."""
        return expert(out, None, rank), out_w * factor(rank)

    def step():
        xa, wa, ia = static["a"]
        out, out_w, _, out_idx, total = op.dispatch(xa, wa, None, ia)
        got_a = keep(out, out_w, out_idx, total)
        xb, wb, ib = static["b"]
        out, out_w, _, out_idx, total = op.dispatch(xb, wb, None, ib)
        got_b = keep(out, out_w, out_idx, total)
        cout, cw = op.combine(*experts(out, out_w), ib)
        return {"a": got_a, "b": got_b}, cout, cw

    def split_step():
        """Batch b dispatched twice, then combined: the calls of the split graphs."""
        xb, wb, ib = static["b"]
        op.dispatch(xb, wb, None, ib)
        out, out_w, _, out_idx, total = op.dispatch(xb, wb, None, ib)
        got_b = keep(out, out_w, out_idx, total)
        return {"b": got_b}, *op.combine(*experts(out, out_w), ib)

    # The torch kernels and allocations made between the op's launches (while its
    # kernel may wait for the proxy), done once on the op's own views first: on CUDA
    # none is then a first launch that loads a module under CUDA's lazy loading.
    out, out_w, _, out_idx = op._mode.dispatch_outputs(static["a"][0], None)
    settled(*keep(out, out_w, out_idx, op._mode.total_recv), *experts(out, out_w))

    def check(tag, fresh, kept, cout, cw):
        """The dispatches in `kept` (batch: its outputs) and the combine of batch b."""
        for b, got in kept.items():
            x, w, idx, rkind = fresh[b]
            out, out_w, out_idx, total, src_pos = (t.cpu() for t in got)
            total = int(total[0])
            _, ax, aw, _, ai = gather_inputs(sizes[b], x, w, None, idx)
            ref = InterNodeReference(kind, world, local, EPR, K, ai)
            rows = ref.rows_at(rank)
            where = f"{tag}, dispatch {b} ({rkind})"
            assert total == len(rows), f"{where}: total_recv {total}, expected {len(rows)}"
            want_pos = torch.tensor([s * M + t for s, t in rows], dtype=torch.int32)
            assert torch.equal(src_pos[:total], want_pos), f"{where}: src pos"
            if rows:
                sel = [ax[s][t] for s, t in rows], [aw[s][t] for s, t in rows]
                assert torch.equal(
                    out[:total].view(torch.int16), torch.stack(sel[0]).view(torch.int16)
                ), where
                assert torch.equal(
                    out_w[:total].view(torch.int32), torch.stack(sel[1]).view(torch.int32)
                ), where
                assert torch.equal(out_idx[:total], torch.stack([ai[s][t] for s, t in rows])), where
            if b == "a":
                continue
            got = op._mode.bytes("dispatch")  # the last dispatch: b
            for key, v in ref.dispatch_bytes(rank, HIDDEN * 2, 0).items():
                assert got[key] == v, f"{where}: dispatch {key} {got[key]}, expected {v}"
            cout, cw = cout.cpu(), cw.cpu()
            for t in range(sizes[b]):
                want_row, want_w = ref.combine(
                    rank, t, lambda d, t=t, x=x: expert(x[t : t + 1], None, d)[0],
                    lambda d, t=t, w=w: w[t] * factor(d), torch.bfloat16, False, HIDDEN,
                )  # fmt: skip
                assert torch.equal(cout[t].view(torch.int16), want_row.view(torch.int16)), (
                    f"{tag}: combine of token {t} differs from the reference order"
                )
                assert torch.equal(cw[t].view(torch.int32), want_w.view(torch.int32)), (tag, t)
            got = op._mode.bytes("combine")
            for key, v in ref.combine_bytes(rank, HIDDEN * 2, True).items():
                assert got[key] == v, f"{tag}: combine {key} {got[key]}, expected {v}"

    fresh = fill(0)
    result = settled(*step())  # eager first (and torch's lazy set-up) before the capture
    check("eager", fresh, *result)
    if DEV.type == "cpu":
        for rep in range(1, iters):
            fresh = fill(rep)
            check(f"eager round {rep}", fresh, *step())
            check(f"eager split round {rep}", fresh, *split_step())
        assert int(op._mode.epoch_tensor()[0]) == op._impl.epoch == 2 + 4 * (iters - 1)
        print(f"rank {rank}: {iters} eager rounds of dispatch, dispatch, combine checked")
        op.close()
        return
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    # Every rank's capture has ended before any replay pushes to its peers.
    dist.barrier()
    for rep in range(1, iters + 1):
        fresh = fill(rep)
        graph.replay()
        check(f"graph replay {rep}", fresh, *settled(*result))
    del graph

    # Dispatch and combine in graphs of their own (as the bench times them), the
    # dispatch graph replayed twice before the combine's: only the device can tell the
    # second replay (V1LL) that a dispatch came right before it.
    dist.barrier()
    xb, wb, ib = static["b"]
    graph_d, graph_c = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph_d):
        out, out_w, _, out_idx, total = op.dispatch(xb, wb, None, ib)
        kept = {"b": keep(out, out_w, out_idx, total)}
    with torch.cuda.graph(graph_c):
        cout, cw = op.combine(*experts(out, out_w), ib)
    dist.barrier()
    for rep in range(iters + 1, 2 * iters + 1):
        fresh = fill(rep)
        graph_d.replay()
        graph_d.replay()
        graph_c.replay()
        check(f"split graphs, replay {rep}", fresh, *settled(kept, cout, cw))
    del graph_d, graph_c
    # The kernels counted every replay's dispatches; the host saw the captured ones once.
    assert int(op._mode.epoch_tensor()[0]) == 2 + 4 * iters, op._mode.epoch_tensor()
    assert op._impl.epoch == 5, op._impl.epoch
    print(f"rank {rank}: {iters} replays of dispatch, dispatch, combine in one graph and in two")
    op.close()


def run_errors() -> None:
    op = make_op(torch.bfloat16)
    bad = world - 1
    n = 4
    x = torch.randn(n, HIDDEN).to(torch.bfloat16)
    w = torch.rand(n, K)
    idx = torch.tensor([[0, 1, -1, EPR * world - 1]] * n, dtype=torch.int32)
    over = idx.clone()
    over[2, 1] = 300
    for _ in range(2):
        if rank == bad:
            expect(mc.InvalidArgumentError, "expert id 300 out of range", op.dispatch, x, w, None,
                   over)  # fmt: skip
        else:
            expect(mc.InvalidArgumentError, f"dispatch rejected by rank {bad}", op.dispatch, x, w,
                   None, idx)  # fmt: skip
        out, out_w, _, _, total = op.dispatch(x, w, None, idx)
        total = int(total.item())
        y = out[:total].clone()
        if rank == bad:
            expect(mc.InvalidArgumentError, f"it needs total_recv {total}", op.combine, y[: total - 1],
                   out_w[:total], idx)  # fmt: skip
        else:
            expect(mc.InvalidArgumentError, f"combine rejected by rank {bad}", op.combine, y,
                   out_w[:total], idx)  # fmt: skip
        op.dispatch(x, w, None, idx)
        out2, _ = op.combine(y, None, idx)
        assert out2.shape == (n, HIDDEN)
    op.close()


def run_weights() -> None:
    op = make_op(torch.bfloat16)
    bad = world - 1
    n = 5
    torch.manual_seed(seed + rank)
    x = torch.randn(n, HIDDEN).to(torch.bfloat16)
    w = torch.rand(n, K)
    idx = torch.randint(0, EPR * world, (n, K), dtype=torch.int32)

    def dispatched(with_w: bool):
        out, out_w, _, _, total = op.dispatch(x, w, None, idx)
        total = int(total.item())
        return out[:total].clone(), (out_w[:total].clone() if with_w else None), idx

    def combined(with_w: bool):
        cout, cw = op.combine(*dispatched(with_w))
        return cout.clone(), (cw.clone() if cw is not None else None)

    want, want_w = combined(True)
    want_none, none_w = combined(False)
    assert none_w is None and torch.equal(want_none.view(torch.int16), want.view(torch.int16))
    for bad_has_weights in (False, True):
        mine = bad_has_weights if rank == bad else not bad_has_weights
        other = 0 if rank == bad else bad
        said = {True: "weights", False: "None"}
        expect(mc.InvalidArgumentError,
               f"combine weights differ between ranks: rank {other} passes {said[not mine]}, "
               f"this rank passes {said[mine]}", op.combine, *dispatched(mine))  # fmt: skip
        got, got_w = combined(True)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert torch.equal(got_w, want_w)
        got, got_w = combined(False)
        assert got_w is None and torch.equal(got.view(torch.int16), want.view(torch.int16))
    print(f"rank {rank}: combines with and without weights on disagreeing ranks failed every rank")
    op.close()


def run_death() -> None:
    op = make_op(torch.bfloat16, timeout_s=4.0)
    dead_node = world // local - 1
    n = 6
    x = torch.randn(n, HIDDEN).to(torch.bfloat16)
    idx = torch.arange(n * K, dtype=torch.int32).reshape(n, K) % (EPR * world)
    out, out_w, _, _, total = op.dispatch(x, None, None, idx)
    dist.barrier()
    if rank // local == dead_node:
        print(f"rank {rank} ok", flush=True)
        os._exit(0)  # the whole node goes away between dispatch and combine
    total = int(total.item())
    try:
        op.combine(out[:total], None, idx)
        raise AssertionError("combine succeeded without the last node")
    except (mc.MoriTimeoutError, mc.TransportError) as e:
        # A signal that never comes (timeout), or a proxy that lost its connection
        # first (TCP paths): either way the rank, its node and the stage are named.
        text = str(e)
        print(f"rank {rank}: {type(e).__name__}: {text}")
        assert f"(node {dead_node})" in text and "combine entry" in text, text
        assert isinstance(e, mc.MoriTimeoutError) or "the inter-node link failed" in text, text
    expect(mc.InvalidStateError, "earlier", op.dispatch, x, None, None, idx)
    print(f"rank {rank} ok", flush=True)
    os._exit(0)  # the heap's finalize would wait for the dead node


if mode == "random":
    calls = crossed = 0
    for i, (dtype, quant) in enumerate(
        [(torch.bfloat16, "none"), (FP8, "none"), (torch.bfloat16, "fp8_direct_cast")]
    ):
        c, x, link = run_random(dtype, quant, seed + i)
        calls, crossed = calls + c, crossed + x
    print(f"rank {rank}: {calls} calls checked, {crossed} rows crossed nodes over {link}")
elif mode == "routing":
    run_routing(seed)
elif mode == "errors":
    run_errors()
elif mode == "weights":
    run_weights()
elif mode == "death":
    run_death()
elif mode == "graph":
    run_graph(seed)
else:
    raise SystemExit(f"unknown mode {mode}")

shmem.finalize()
dist.destroy_process_group()
print(f"rank {rank} ok")
