# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the CUDA collectives tests. argv: mode placement seed [iters]

placement: shared   every rank on GPU 0;  per_gpu  rank r on GPU r.
mode:      random   `iters` calls cycling through every collective and algorithm
                    (one_shot, two_shot, auto; all-gather and all-to-all by SM and by
                    copy engine; reduce-scatter; broadcast; barrier), dtype and op, in
                    place and out of place, sizes that are not multiples of 16 bytes,
                    grids of 1 to 64 blocks, all-to-all-v with splits on the device;
                    then a burst of back-to-back calls with fresh inputs and no host
                    synchronisation between them, checked afterwards. Every rank builds
                    every rank's input from the seed, so each result is compared bit for
                    bit with a reference computed here (fp32 in rank order, one rounding);
                    integer-valued inputs also against the exact sum.
           ll       one_shot_ll alone (run_ll's docstring).
           zero_copy  symmetric inputs read in place (run_zero_copy's docstring).
           graph    all-reduce (one- and two-shot), all-gather and all-to-all-v captured
                    in one CUDA graph, each followed in the graph by a kernel that
                    overwrites its input; replayed with fresh inputs.
Prints "rank N ok" last; any failed check raises (non-zero exit).
"""

import sys

import torch
import torch.distributed as dist
from ccl_reference import DTYPES, OPS, make_inputs, reduce_ref, same

import mori.ccl as ccl
from mori.core.testing import start_rank

mode, placement, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
iters = int(sys.argv[4]) if len(sys.argv) > 4 else 60
rank, world, DEV = start_rank(placement, "256M", 120)

MAX_BYTES = 1 << 20
BLOCKS = [None, 1, 3, 64, 7]


KINDS = [
    "one_shot",
    "two_shot",
    "auto",
    "all_gather",
    "all_gather_ce",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_ce",
    "bcast",
    "barrier",
]


def one_call(comm, it: int, check: bool = True):
    """Enqueues call `it` (the same on every rank); returns (what, result, reference,
    exact reference or None, input copy to compare x with or None)."""
    gen = torch.Generator().manual_seed(seed * 7919 + it)
    kind = KINDS[it % len(KINDS)]
    dtype = DTYPES[(it // len(KINDS)) % len(DTYPES)]
    op = OPS[(it // (len(KINDS) * len(DTYPES))) % len(OPS)]
    in_place = it % 2 == 0
    integer = it % 5 == 0
    blocks = BLOCKS[it % len(BLOCKS)]
    es = torch.tensor([], dtype=dtype).element_size()
    per = world if kind in ("reduce_scatter", "all_to_all", "all_to_all_ce", "all_gather") else 1
    limit = MAX_BYTES // es // per
    # Odd element counts (sizes not a multiple of 16 bytes), now and then large ones.
    top = limit if it % 7 == 3 else min(limit, 5001)
    numel = int(torch.randint(1, top, (1,), generator=gen)) | 1
    what = f"call {it} {kind} {dtype} {op} numel={numel} in_place={in_place} blocks={blocks}"
    exact = keep = None
    if kind in ("one_shot", "two_shot", "auto"):
        inputs = make_inputs(gen, numel, dtype, integer)
        x = inputs[rank].to(DEV)
        out = None if in_place else torch.empty_like(x)
        got = comm.all_reduce(x, op=op, out=out, algorithm=kind, max_blocks=blocks)
        assert got is (x if in_place else out), what
        ref = reduce_ref(inputs, op)
        if integer and op == "sum" and dtype != torch.int32:
            exact = torch.stack(inputs).double().sum(0).to(dtype)
        if not in_place:
            keep = (x, inputs[rank])
    elif kind in ("all_gather", "all_gather_ce"):
        n = max(numel // 3, 1)
        inputs = make_inputs(gen, n * 3, dtype, integer)
        algo = "copy_engine" if kind.endswith("_ce") else "sm"
        if in_place:  # x is this rank's slot of out
            out = torch.empty((world * n, 3), dtype=dtype, device=DEV)
            x = out[rank * n : (rank + 1) * n]
            x.copy_(inputs[rank].view(n, 3))
        else:
            x, out = inputs[rank].view(n, 3).to(DEV), None
        got = comm.all_gather(x, out=out, algorithm=algo, max_blocks=blocks)
        ref = torch.cat([t.view(n, 3) for t in inputs])
    elif kind == "reduce_scatter":
        inputs = make_inputs(gen, numel * world, dtype, integer)
        x = inputs[rank].to(DEV)
        out = x[rank * numel : (rank + 1) * numel] if in_place else None
        got = comm.reduce_scatter(x, op=op, out=out, max_blocks=blocks)
        ref = reduce_ref([t[rank * numel : (rank + 1) * numel] for t in inputs], op)
    elif kind in ("all_to_all", "all_to_all_ce"):
        row = 5
        rows_max = max(MAX_BYTES // es // row // world // world, 1)
        split = torch.randint(0, min(rows_max, 40) + 1, (world, world), generator=gen)
        if kind == "all_to_all_ce" or it % 4 == 1:
            split[:, :] = split[0, 0]
        inputs = [
            make_inputs(gen, int(split[s].sum()) * row, dtype, integer)[0].view(-1, row)
            for s in range(world)
        ]
        x = inputs[rank].to(DEV)
        if kind == "all_to_all_ce":
            got = comm.all_to_all(x, algorithm="copy_engine")
        elif it % 3 == 0:
            # Device splits, out as a capacity with spare rows (graph-capturable form).
            total = int(split[:, rank].sum())
            out = torch.full((total + 3, row), 7, dtype=dtype, device=DEV)
            comm.all_to_all(
                x,
                out=out,
                in_splits=split[rank].to(DEV),
                out_splits=split[:, rank].to(device=DEV, dtype=torch.int32),
                max_blocks=blocks,
            )
            got = out[:total]
            keep = (out[total:], torch.full((3, row), 7, dtype=dtype))
        else:
            got = comm.all_to_all(
                x, in_splits=split[rank].tolist(), out_splits=split[:, rank], max_blocks=blocks
            )
        parts = []
        for s in range(world):
            begin = int(split[s, :rank].sum())
            parts.append(inputs[s][begin : begin + int(split[s, rank])])
        ref = torch.cat(parts)
    elif kind == "bcast":
        src = it % world
        inputs = make_inputs(gen, numel, dtype, integer)
        x = inputs[rank].to(DEV)
        got = comm.broadcast(x, src, max_blocks=blocks)
        assert got is x
        ref = inputs[src]
    else:
        comm.barrier()
        return what, None, None, None, None
    return what, got, ref, exact, keep


def verify(what, got, ref, exact, keep) -> None:
    if got is None:
        return
    same(got, ref, what)
    if exact is not None:
        same(got, exact, what + " exact")
    if keep is not None:
        same(keep[0], keep[1], what + " untouched")


def run_random() -> None:
    comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=60)
    counts: dict[str, int] = {}
    for it in range(iters):
        verify(*one_call(comm, it))
        k = KINDS[it % len(KINDS)]
        counts[k] = counts.get(k, 0) + 1
    torch.cuda.synchronize()
    # Back-to-back: every call's inputs are fresh tensors and nothing synchronises
    # until all are enqueued (a call overwriting a buffer a peer still reads shows).
    burst = [one_call(comm, 100000 + it) for it in range(max(iters, 2 * len(KINDS)))]
    torch.cuda.synchronize()
    for call in burst:
        verify(*call)
    assert comm.calls == iters + len(burst), (comm.calls, iters, len(burst))
    print(f"rank {rank}: {iters} checked calls {sorted(counts.items())}, {len(burst)} back to back")


def run_graph() -> None:
    comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=60)
    n1, n2, rows = 1001, 70001, 6
    x1 = torch.zeros(n1, dtype=torch.bfloat16, device=DEV)
    x2 = torch.zeros(n2, dtype=torch.float32, device=DEV)
    xg = torch.zeros(333, dtype=torch.int32, device=DEV)
    splits = torch.zeros(world, world, dtype=torch.int64, device=DEV)
    xa = torch.zeros(world * 8, rows, dtype=torch.float16, device=DEV)
    outa = torch.zeros(world * 8, rows, dtype=torch.float16, device=DEV)

    def step():
        y1 = comm.all_reduce(x1, out=torch.empty_like(x1), algorithm="one_shot")
        x1.fill_(-1)  # overwrites the input right after the collective
        y2 = comm.all_reduce(x2, out=torch.empty_like(x2), algorithm="two_shot")
        x2.mul_(3)
        g = comm.all_gather(xg)
        xg.zero_()
        comm.all_to_all(xa, out=outa, in_splits=splits[rank], out_splits=splits[:, rank])
        xa.fill_(5)
        return y1, y2, g

    step()  # eager warm-up, the same calls on every rank
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1, y2, g = step()
    for rep in range(iters):
        gen = torch.Generator().manual_seed(seed * 31 + rep)
        i1 = make_inputs(gen, n1, torch.bfloat16, rep % 2 == 0)
        i2 = make_inputs(gen, n2, torch.float32, False)
        ig = make_inputs(gen, 333, torch.int32, True)
        sp = torch.randint(0, 5, (world, world), generator=gen)
        ia = [
            make_inputs(gen, int(sp[s].sum()) * rows, torch.float16, True)[0].view(-1, rows)
            for s in range(world)
        ]
        x1.copy_(i1[rank])
        x2.copy_(i2[rank])
        xg.copy_(ig[rank])
        splits.copy_(sp)
        xa.zero_()
        xa[: ia[rank].shape[0]].copy_(ia[rank])
        outa.fill_(9)
        graph.replay()
        if rep % 3 == 2:
            graph.replay()  # back to back: the same inputs were overwritten by the first
            torch.cuda.synchronize()
            continue
        torch.cuda.synchronize()
        tag = f"graph replay {rep}"
        same(y1, reduce_ref(i1, "sum"), tag + " one_shot")
        same(y2, reduce_ref(i2, "sum"), tag + " two_shot")
        same(g, torch.cat(ig), tag + " all_gather")
        parts = []
        for s in range(world):
            begin = int(sp[s, :rank].sum())
            parts.append(ia[s][begin : begin + int(sp[s, rank])])
        want = torch.cat(parts)
        same(outa[: want.shape[0]], want, tag + " all_to_all")
        same(outa[want.shape[0] :], torch.full_like(outa[want.shape[0] :].cpu(), 9), tag + " spare")
    print(f"rank {rank}: {iters} graph replays ok")
    del graph


def run_ll() -> None:
    """one_shot_ll alone: every dtype and op, odd sizes up to its bound, grids of 1 to
    64 blocks, in and out of place; half the calls checked at once, half back to back
    and checked at the end; then a CUDA graph of two calls, each followed by a kernel
    overwriting its input, replayed back to back."""
    comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=60)
    cap = comm._impl.ll_max_bytes
    later = []
    for it in range(iters):
        gen = torch.Generator().manual_seed(seed * 104729 + it)
        dtype, op = DTYPES[it % len(DTYPES)], OPS[(it // len(DTYPES)) % len(OPS)]
        es = torch.tensor([], dtype=dtype).element_size()
        top = cap // es if it % 7 == 3 else min(cap // es, 5001)
        numel = min(int(torch.randint(1, top + 1, (1,), generator=gen)) | 1, cap // es)
        inputs = make_inputs(gen, numel, dtype, it % 3 == 0)
        x = inputs[rank].to(DEV)
        out = None if it % 2 == 0 else torch.empty_like(x)
        what = f"ll call {it} {dtype} {op} numel={numel} in_place={out is None}"
        got = comm.all_reduce(
            x, op=op, out=out, algorithm="one_shot_ll", max_blocks=BLOCKS[it % len(BLOCKS)]
        )
        call = (what, got, reduce_ref(inputs, op), None, None if out is None else (x, inputs[rank]))
        if it % 4 < 2:
            verify(*call)
        else:
            later.append(call)
    torch.cuda.synchronize()
    for call in later:
        verify(*call)
    x1 = torch.zeros(777, dtype=torch.bfloat16, device=DEV)
    x2 = torch.zeros(cap // 4, dtype=torch.float32, device=DEV)

    def step():
        y1 = comm.all_reduce(x1, out=torch.empty_like(x1), algorithm="one_shot_ll")
        x1.fill_(-1)
        y2 = comm.all_reduce(x2, out=torch.empty_like(x2), algorithm="one_shot_ll", op="max")
        x2.fill_(-1)
        return y1, y2

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1, y2 = step()
    for rep in range(8):
        gen = torch.Generator().manual_seed(seed * 13 + rep)
        i1 = make_inputs(gen, 777, torch.bfloat16, False)
        i2 = make_inputs(gen, cap // 4, torch.float32, False)
        x1.copy_(i1[rank])
        x2.copy_(i2[rank])
        graph.replay()
        torch.cuda.synchronize()
        same(y1, reduce_ref(i1, "sum"), f"ll graph replay {rep} sum")
        same(y2, reduce_ref(i2, "max"), f"ll graph replay {rep} max")
        graph.replay()  # back to back, on the overwritten inputs
    torch.cuda.synchronize()
    print(f"rank {rank}: {iters} one_shot_ll calls and 16 graph replays ok")


ZC_KINDS = ["one_shot", "two_shot", "all_gather", "reduce_scatter", "all_to_all", "bcast"]


class ZeroCopyCase:
    """Call `it` of run_zero_copy on every rank: its inputs (from the seed), where its
    symmetric input lies and its reference."""

    def __init__(self, it: int):
        gen = torch.Generator().manual_seed(seed * 65537 + it)
        self.it = it
        self.kind = ZC_KINDS[it % len(ZC_KINDS)]
        self.dtype = DTYPES[(it // len(ZC_KINDS)) % len(DTYPES)]
        self.op = OPS[(it // (len(ZC_KINDS) * len(DTYPES))) % len(OPS)]
        self.in_place = (it // 2) % 2 == 0
        # Sometimes the output overlaps what the peers read (all-gather: x in the next
        # rank's slot of out; reduce-scatter: out is the next rank's segment of x).
        self.other_slot = it % 3 == 2
        self.blocks = BLOCKS[it % len(BLOCKS)]
        es = torch.tensor([], dtype=self.dtype).element_size()
        self.es = es
        # The symmetric input's byte offset in the pool: the same on every rank, or
        # shifted by rank (peers find it at the offset each rank publishes), now and
        # then off a 16-byte boundary (the reduction's scalar path).
        self.shift = [0, 4096 * rank, 4096 * rank + es][it % 3] if it % 4 else 0
        per = world if self.kind in ("reduce_scatter", "all_to_all", "all_gather") else 1
        limit = MAX_BYTES // es // per // 2
        top = limit if it % 7 == 3 else min(limit, 5001)
        self.numel = int(torch.randint(1, top, (1,), generator=gen)) | 1
        self.integer = it % 5 == 0
        self.what = (
            f"zero-copy call {it} {self.kind} {self.dtype} {self.op} numel={self.numel} "
            f"in_place={self.in_place} other_slot={self.other_slot} shift={self.shift} "
            f"blocks={self.blocks}"
        )
        n = self.numel
        if self.kind in ("one_shot", "two_shot", "bcast"):
            self.inputs = make_inputs(gen, n, self.dtype, self.integer)
            self.src = it % world
            self.ref = (
                self.inputs[self.src] if self.kind == "bcast" else reduce_ref(self.inputs, self.op)
            )
        elif self.kind == "all_gather":
            self.inputs = make_inputs(gen, n, self.dtype, self.integer)
            self.ref = torch.cat(self.inputs)
        elif self.kind == "reduce_scatter":
            self.inputs = make_inputs(gen, n * world, self.dtype, self.integer)
            self.ref = reduce_ref([t[rank * n : (rank + 1) * n] for t in self.inputs], self.op)
        else:
            self.split = torch.randint(0, 40, (world, world), generator=gen)
            self.inputs = [
                make_inputs(gen, int(self.split[s].sum()) * 5, self.dtype, self.integer)[0]
                for s in range(world)
            ]
            parts = []
            for s in range(world):
                begin = int(self.split[s, :rank].sum()) * 5
                parts.append(self.inputs[s][begin : begin + int(self.split[s, rank]) * 5])
            self.ref = torch.cat(parts).view(-1, 5)

    def place(self, pool: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x's values in the symmetric pool at this case's shift (enqueued)."""
        nbytes = x.numel() * x.element_size()
        t = pool[self.shift : self.shift + nbytes].view(self.dtype).view(x.shape)
        t.copy_(x)
        return t

    def call(self, comm, pool: torch.Tensor | None, out_pool: torch.Tensor | None):
        """Enqueues the call on comm with its input in `pool` (None: an ordinary tensor);
        returns (result, the input when the call must leave it unchanged)."""
        x = self.inputs[rank].to(DEV)
        n, kind = self.numel, self.kind
        if kind == "all_gather":
            if self.in_place:
                # x is a slot of out, itself symmetric when out_pool is given.
                total = world * n * self.es
                buf = (
                    out_pool[:total].view(self.dtype)
                    if out_pool is not None
                    else torch.empty(world * n, dtype=self.dtype, device=DEV)
                )
                slot = (rank + 1) % world if self.other_slot else rank
                buf[slot * n : (slot + 1) * n].copy_(x)
                return comm.all_gather(
                    buf[slot * n : (slot + 1) * n], out=buf, max_blocks=self.blocks
                ), None
            xs = self.place(pool, x) if pool is not None else x
            return comm.all_gather(xs, max_blocks=self.blocks), xs
        xs = self.place(pool, x) if pool is not None else x
        if kind in ("one_shot", "two_shot"):
            out = None if self.in_place else torch.empty_like(xs)
            got = comm.all_reduce(xs, op=self.op, out=out, algorithm=kind, max_blocks=self.blocks)
            assert got is (xs if self.in_place else out), self.what
            return got, None if self.in_place else xs
        if kind == "reduce_scatter":
            k = (rank + 1) % world if self.other_slot else rank
            out = xs[k * n : (k + 1) * n] if self.in_place else None
            got = comm.reduce_scatter(xs, op=self.op, out=out, max_blocks=self.blocks)
            return got, None if self.in_place else xs
        if kind == "all_to_all":
            xs = xs.view(-1, 5)
            out = torch.empty((int(self.split[:, rank].sum()), 5), dtype=self.dtype, device=DEV)
            if self.it % 2:  # device splits (the graph-capturable form)
                comm.all_to_all(
                    xs,
                    out=out,
                    in_splits=self.split[rank].to(DEV),
                    out_splits=self.split[:, rank].to(DEV),
                    max_blocks=self.blocks,
                )
            else:
                comm.all_to_all(
                    xs,
                    out=out,
                    in_splits=self.split[rank].tolist(),
                    out_splits=self.split[:, rank].tolist(),
                    max_blocks=self.blocks,
                )
            return out, xs
        got = comm.broadcast(xs, self.src, max_blocks=self.blocks)
        assert got is xs
        return got, None


def run_zero_copy() -> None:
    """Symmetric inputs (views of comm.empty tensors) read in place by the peers, on
    every SM algorithm (one-shot, two-shot, all-gather, reduce-scatter, all-to-all(v),
    broadcast), every dtype and op, in and out of place (including outputs that
    overlap what the peers read), inputs at the same and at per-rank offsets. Each
    call is compared bit for bit with the same call on a zero_copy=False communicator
    (on an ordinary or on a symmetric input) and with the reference, and an
    out-of-place input must be left unchanged. Then back-to-back calls that all use one
    symmetric input, overwritten right after each call with nothing synchronising
    (a missing end-of-call wait lets a peer read the next values), and a CUDA graph
    of zero-copy calls each followed by a kernel overwriting its input."""
    comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=60)
    staged = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=60, zero_copy=False)
    assert comm._impl.zero_copy and not staged._impl.zero_copy
    pool = comm.empty((2 * MAX_BYTES,), torch.uint8)
    pool_staged = comm.empty((2 * MAX_BYTES,), torch.uint8)
    out_pool = comm.empty((MAX_BYTES,), torch.uint8)
    for it in range(iters):
        case = ZeroCopyCase(it)
        before = comm._impl.zero_copy_calls
        got, keep = case.call(comm, pool, out_pool)
        assert comm._impl.zero_copy_calls == before + 1, case.what
        # The staged path, on an ordinary input or on a symmetric one it must stage.
        ordinary = it % 2 == 0
        want, _ = case.call(staged, None if ordinary else pool_staged, None)
        assert staged._impl.zero_copy_calls == 0
        torch.cuda.synchronize()
        same(got, want.cpu(), case.what + " vs staged")
        same(got, case.ref, case.what)
        if keep is not None:
            same(keep.reshape(-1), case.inputs[rank], case.what + " input untouched")
    # Back to back: every call's symmetric input is the same pool bytes, refilled by
    # the next call (or overwritten at once) while nothing waits on the host.
    burst = []
    for it in range(max(iters, 4 * len(ZC_KINDS))):
        case = ZeroCopyCase(100000 + it)
        case.shift = 0
        got, _ = case.call(comm, pool, out_pool)
        got = got.clone()  # in place, the result is the pool itself
        pool.fill_(0x7F)
        out_pool.fill_(0x7F)
        burst.append((case, got))
    torch.cuda.synchronize()
    for case, got in burst:
        same(got, case.ref, case.what + " back to back")
    run_zero_copy_graph(comm)
    print(f"rank {rank}: {iters} zero-copy calls, {len(burst)} back to back, graph ok")


def run_zero_copy_graph(comm) -> None:
    n1, n2, n3 = 1001, 70001, 333
    x1 = comm.empty((n1,), torch.bfloat16)
    x2 = comm.empty((n2,), torch.float32)
    xg = comm.empty((world * n3,), torch.int32)  # all-gather in place: x is rank's slot
    xr = comm.empty((world * n3,), torch.float16)
    xb = comm.empty((n3,), torch.float32)
    y1 = torch.empty(n1, dtype=torch.bfloat16, device=DEV)
    y2 = torch.empty(n2, dtype=torch.float32, device=DEV)
    yb = torch.empty(n3, dtype=torch.float32, device=DEV)
    calls = comm._impl.zero_copy_calls

    def step():
        comm.all_reduce(x1, out=y1, algorithm="one_shot")
        x1.fill_(-1)  # overwrites the input right after the collective
        comm.all_reduce(x2, algorithm="two_shot")  # in place
        y2.copy_(x2)
        x2.fill_(-1)
        g = comm.all_gather(xg[rank * n3 : (rank + 1) * n3], out=xg).clone()
        xg.fill_(-1)
        r = comm.reduce_scatter(xr)
        xr.fill_(-1)
        comm.broadcast(xb, 1 % world)
        yb.copy_(xb)
        xb.fill_(-1)
        return g, r

    step()  # eager warm-up, the same calls on every rank
    torch.cuda.synchronize()
    assert comm._impl.zero_copy_calls == calls + 5
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g, r = step()
    for rep in range(8):
        gen = torch.Generator().manual_seed(seed * 97 + rep)
        i1 = make_inputs(gen, n1, torch.bfloat16, rep % 2 == 0)
        i2 = make_inputs(gen, n2, torch.float32, False)
        ig = make_inputs(gen, n3, torch.int32, True)
        ir = make_inputs(gen, world * n3, torch.float16, False)
        ib = make_inputs(gen, n3, torch.float32, False)
        x1.copy_(i1[rank])
        x2.copy_(i2[rank])
        xg[rank * n3 : (rank + 1) * n3].copy_(ig[rank])
        xr.copy_(ir[rank])
        xb.copy_(ib[rank])
        graph.replay()
        if rep % 3 == 2:
            graph.replay()  # back to back, on the overwritten inputs
            torch.cuda.synchronize()
            continue
        torch.cuda.synchronize()
        tag = f"zero-copy graph replay {rep}"
        same(y1, reduce_ref(i1, "sum"), tag + " one_shot")
        same(y2, reduce_ref(i2, "sum"), tag + " two_shot in place")
        same(g, torch.cat(ig), tag + " all_gather")
        same(r, reduce_ref([t[rank * n3 : (rank + 1) * n3] for t in ir], "sum"), tag + " rs")
        same(yb, ib[1 % world], tag + " broadcast")
    del graph


if mode == "random":
    run_random()
elif mode == "graph":
    run_graph()
elif mode == "ll":
    run_ll()
elif mode == "zero_copy":
    run_zero_copy()
else:
    raise SystemExit(f"unknown mode {mode!r}")
torch.cuda.synchronize()
dist.barrier()
# gloo without destroy_process_group can abort at exit (pytorch/pytorch#190489).
dist.destroy_process_group()
print(f"rank {rank} ok")
