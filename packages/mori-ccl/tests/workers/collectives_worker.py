# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the CPU collectives tests. argv: mode seed [iters]

Creates a gloo group; the first Communicator creates the heap, a host heap because
the test hides the GPUs (CUDA_VISIBLE_DEVICES=""; checked below). Prints "rank N ok"
last.
  random   `iters` calls on one communicator cycling through every collective,
           algorithm, dtype and op, in place and out of place, staged and symmetric
           (zero-copy) inputs, sizes not a multiple of 16 bytes. Every rank builds
           every rank's input from the seed, so each result is compared bit for bit
           with a reference computed here (fp32 in rank order, one rounding).
  errors   mismatches across ranks and one rank's invalid input fail the call on
           every rank, naming the problem; the communicator works afterwards; the
           functional shortcuts.
  timeout  rank 1 never calls: rank 0 raises MoriTimeoutError naming rank 1, then
           refuses later calls.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from ccl_reference import DTYPES, OPS, make_inputs, reduce_ref, same

import mori.ccl as ccl
import mori.core as mc
from mori.core.launch import expect_raises as expect

mode, seed = sys.argv[1], int(sys.argv[2])
iters = int(sys.argv[3]) if len(sys.argv) > 3 else 20
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://")

MAX_BYTES = 64 << 10


def host_heap(comm: ccl.Communicator) -> ccl.Communicator:
    kind = mc.shmem.info()["kind"]
    assert kind == "host" and not comm.cuda, f"these tests need a host heap, got a {kind} heap"
    return comm


def run_random(comm: ccl.Communicator) -> None:
    sym = comm.empty((MAX_BYTES,), torch.uint8)
    kinds = ["one_shot", "two_shot", "auto", "all_gather", "reduce_scatter", "all_to_all", "bcast"]
    counts = {}
    for it in range(iters):
        gen = torch.Generator().manual_seed(seed * 7919 + it)
        kind = kinds[it % len(kinds)]
        dtype = DTYPES[(it // len(kinds)) % len(DTYPES)]
        op = OPS[(it // (len(kinds) * len(DTYPES))) % len(OPS)]
        in_place = it % 2 == 0
        zero_copy = it % 3 == 0
        integer = it % 5 == 0
        es = torch.tensor([], dtype=dtype).element_size()
        # Odd element counts: sizes that are not multiples of 16 bytes.
        limit = MAX_BYTES // es // (world if kind in ("reduce_scatter", "all_to_all") else 1)
        numel = int(torch.randint(1, min(limit, 3001), (1,), generator=gen)) | 1
        if it % 20 == 0:
            # Skew: each rank in turn enters late, so every arrival order occurs.
            time.sleep(0.003 if rank == (it // 20) % world else 0)
        what = f"call {it} {kind} {dtype} {op} numel={numel} in_place={in_place} zc={zero_copy}"

        def staged(t: torch.Tensor, zero_copy=zero_copy) -> torch.Tensor:
            """A fresh copy of t, or t copied into the symmetric buffer (zero-copy)."""
            if not zero_copy:
                return t.clone()
            view = sym[: t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            return view

        if kind in ("one_shot", "two_shot", "auto"):
            inputs = make_inputs(gen, numel, dtype, integer)
            x = staged(inputs[rank].view(numel))
            out = None if in_place else torch.empty_like(x)
            got = comm.all_reduce(x, op=op, out=out, algorithm=kind)
            assert got is (x if in_place else out), what
            ref = reduce_ref(inputs, op)
            same(got, ref, what)
            if integer and op == "sum" and dtype != torch.int32:
                # |sum| <= 30 * 8 < 256: exact in every dtype, bf16 included.
                same(got, torch.stack(inputs).double().sum(0).to(dtype), what + " exact")
            if not in_place:
                same(x, inputs[rank], what + " input untouched")
        elif kind == "all_gather":
            n = max(numel // 3, 1)
            inputs = make_inputs(gen, n * 3, dtype, integer)
            x = staged(inputs[rank].view(n, 3))
            out = None if in_place else torch.empty((world * n, 3), dtype=dtype)
            got = comm.all_gather(x, out=out)
            same(got, torch.cat([t.view(n, 3) for t in inputs]), what)
        elif kind == "reduce_scatter":
            inputs = make_inputs(gen, numel * world, dtype, integer)
            x = staged(inputs[rank])
            out = None if in_place else torch.empty(numel, dtype=dtype)
            got = comm.reduce_scatter(x, op=op, out=out)
            same(got, reduce_ref([t[rank * numel : (rank + 1) * numel] for t in inputs], op), what)
        elif kind == "all_to_all":
            # Row splits: split[s][d] rows from s to d, some zero.
            row = 5
            rows_max = max(MAX_BYTES // es // row // world // world, 1)
            split = torch.randint(0, rows_max + 1, (world, world), generator=gen)
            if it % 4 == 1:
                split[:, :] = split[0, 0]  # equal splits: the default path
            inputs = [
                make_inputs(gen, int(split[s].sum()) * row, dtype, integer)[0].view(-1, row)
                for s in range(world)
            ]
            x = staged(inputs[rank])
            equal = bool((split == split[0, 0]).all())
            if equal and it % 8 == 1:
                got = comm.all_to_all(x)
            else:
                out = torch.empty((int(split[:, rank].sum()), row), dtype=dtype)
                got = comm.all_to_all(
                    x, out=out, in_splits=split[rank].clone(), out_splits=split[:, rank].clone()
                )
            parts = []
            for s in range(world):
                begin = int(split[s, :rank].sum())
                parts.append(inputs[s][begin : begin + int(split[s, rank])])
            same(got, torch.cat(parts), what)
        else:
            src = it % world
            inputs = make_inputs(gen, numel, dtype, integer)
            x = staged(inputs[rank])
            got = comm.broadcast(x, src)
            assert got is x
            same(got, inputs[src], what)
        counts[kind] = counts.get(kind, 0) + 1
    assert comm.calls == iters + 0, (comm.calls, iters)
    print(f"rank {rank}: {iters} calls {sorted(counts.items())}")


def run_errors(comm: ccl.Communicator) -> None:
    x = torch.arange(100, dtype=torch.float32)
    n = 100 if rank == 0 else 96
    for call, pattern in [
        (lambda: comm.all_reduce(x[:n].clone()), "rank 0 calls all_reduce of 400 bytes"),
        (lambda: comm.all_reduce(x.to(torch.int32 if rank == 1 else torch.float32)), "int32"),
        (lambda: comm.all_reduce(x.clone(), op="max" if rank == 1 else "sum"), "op max"),
        (
            lambda: comm.all_reduce(x.clone(), algorithm="two_shot" if rank else "one_shot"),
            "two_shot",
        ),
        (lambda: comm.broadcast(x.clone(), src=rank), "src 0"),
        (lambda: comm.all_gather(x) if rank else comm.barrier(), "rank 0 calls barrier"),
    ]:
        msg = expect(mc.InvalidArgumentError, "ranks disagree", call)
        assert pattern in msg, (pattern, msg)
    # all-to-all-v whose splits do not pair up.
    ins = torch.ones(world, dtype=torch.int64)
    outs = ins.clone()
    if rank == 0:
        outs[world - 1] = 2
    expect(
        mc.InvalidArgumentError,
        f"rank {world - 1} sends 1 rows to rank 0, which expects 2 rows from it",
        lambda: comm.all_to_all(
            torch.zeros(world, 4),
            out=torch.zeros(int(outs.sum()), 4),
            in_splits=ins,
            out_splits=outs,
        ),
    )
    # One rank's invalid input: its own message there, a rejection naming it elsewhere.
    bad = [
        (torch.zeros(8, 8).t(), "is not contiguous"),
        (torch.zeros(MAX_BYTES // 4 + 1), f"more than the communicator's max_bytes {MAX_BYTES}"),
        (torch.zeros(8, dtype=torch.float64), "has dtype torch.float64"),
    ]
    for t, pattern in bad:
        if rank == 1:
            expect(mc.InvalidArgumentError, pattern, comm.all_reduce, t)
        else:
            msg = expect(mc.InvalidArgumentError, "rejected by rank 1", comm.all_reduce, x.clone())
            assert pattern in msg, msg
    expect(mc.InvalidArgumentError, "op 'avg' is not one of", comm.all_reduce, x, op="avg")
    if rank == 0:
        expect(
            mc.InvalidArgumentError,
            "in_splits must be a tensor or a list of ints, got int",
            comm.all_to_all,
            torch.zeros(world, 2),
            in_splits=3,
        )
    else:
        msg = expect(
            mc.InvalidArgumentError, "rejected by rank 0", comm.all_to_all, torch.zeros(world, 2)
        )
        assert "in_splits must be" in msg, msg
    # Every rank failed that call alike (op checked locally on all of them); still usable.
    y = torch.full((33,), float(rank + 1))
    comm.all_reduce(y)
    assert y.tolist() == [world * (world + 1) / 2] * 33
    # Functional shortcuts over the default group's cached communicator.
    z = torch.full((7,), rank, dtype=torch.int32)
    assert ccl.all_reduce(z, op="max") is z and z.tolist() == [world - 1] * 7
    g = ccl.all_gather(torch.tensor([rank], dtype=torch.int32))
    assert g.tolist() == list(range(world))
    rs = ccl.reduce_scatter(torch.ones(world * 2, dtype=torch.int32))
    assert rs.tolist() == [world, world]
    a2a = ccl.all_to_all(torch.full((world,), rank, dtype=torch.int32))
    assert a2a.tolist() == list(range(world))
    b = ccl.broadcast(torch.tensor([rank], dtype=torch.float32), src=world - 1)
    assert b.tolist() == [world - 1]
    ccl.barrier()
    assert ccl.functional._communicator(None) is ccl.functional._communicator(None)
    comm.close()
    expect(mc.InvalidStateError, "this Communicator was closed", comm.barrier)


def run_timeout(comm: ccl.Communicator) -> None:
    if rank == 0:
        comm.barrier()  # both arrive
        msg = expect(mc.MoriTimeoutError, "rank 1 did not arrive", comm.all_reduce, torch.ones(9))
        assert "all_reduce (call 2) on rank 0" in msg, msg
        expect(mc.InvalidStateError, "timed out earlier", comm.barrier)
    else:
        comm.barrier()
    dist.barrier()  # rank 1 stays until rank 0 has timed out


if mode == "random":
    run_random(host_heap(ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=60)))
elif mode == "errors":
    run_errors(host_heap(ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=60)))
elif mode == "timeout":
    run_timeout(host_heap(ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=2)))
else:
    raise SystemExit(f"unknown mode {mode!r}")
dist.destroy_process_group()
print(f"rank {rank} ok")
