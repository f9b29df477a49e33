# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of the spanning-hosts tests. argv: layout seed iters [device]

Emulates hosts with MORI_SHMEM_NODE_ID (set here, before the heap exists): layout
"blocked" puts ranks [0, W/2) on host a and the rest on host b, "interleaved" the
even ranks on a and the odd ones on b, so that rank order and host order differ.
device: "cpu" (gloo group, host heap; the test hides the GPUs) or "cuda" (NCCL group,
each rank on GPU rank % visible GPUs, CUDA heap). Every rank builds every rank's
input from the seed and compares each result bit for bit with a reference computed
here in the documented order: each host's ranks reduced in ascending order (fp32,
one rounding), then the hosts' results in host order (fp32, one rounding). Then
(CPU) calls that differ across hosts, a rejected input and unpaired all-to-all
splits fail on every rank. Prints "rank N ok" last.
"""

import os
import sys

import torch
import torch.distributed as dist

layout, seed, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if layout == "blocked":
    HOSTS = [list(range(world // 2)), list(range(world // 2, world))]
elif layout == "interleaved":
    HOSTS = [list(range(0, world, 2)), list(range(1, world, 2))]
else:
    raise SystemExit(f"unknown layout {layout!r}")
os.environ["MORI_SHMEM_NODE_ID"] = "a" if rank in HOSTS[0] else "b"

from ccl_reference import DTYPES, OPS, make_inputs, same  # noqa: E402

import mori.ccl as ccl  # noqa: E402
import mori.core as mc  # noqa: E402
from mori.core import shmem  # noqa: E402
from mori.core.launch import expect_raises as expect  # noqa: E402

cuda = device == "cuda"
if cuda:
    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)
    dist.init_process_group("nccl", init_method="env://", device_id=dev)
    shmem.init(device=gpu, heap_size="64M", timeout_s=60)
else:
    dev = torch.device("cpu")
    dist.init_process_group("gloo", init_method="env://")
    shmem.init(device="cpu", heap_size="16M", timeout_s=60)
info = shmem.info()
mine = next(h for h in HOSTS if rank in h)
assert info["kind"] == ("cuda" if cuda else "host"), info
assert sorted(info["local_pes"]) == mine, (info["local_pes"], mine)

MAX_BYTES = 32 << 10
comm = ccl.Communicator(max_bytes=MAX_BYTES, timeout_s=30)
assert comm._spanning is not None and comm._spanning.hosts == HOSTS, comm._spanning.hosts


def reduce_in_order(parts, op):
    """op over parts in list order: fp32 accumulation and one rounding for every float
    dtype (for fp32 the same as summing in fp32), int32 exact."""
    dtype = parts[0].dtype
    if op != "sum":
        stacked = torch.stack(parts)
        return stacked.amax(0) if op == "max" else stacked.amin(0)
    if dtype == torch.int32:
        return torch.stack(parts).to(torch.int64).sum(0).to(torch.int32)
    acc = torch.zeros(parts[0].shape, dtype=torch.float32)
    for t in parts:
        acc += t.float()
    return acc.to(dtype)


def reference(per_rank, op):
    """Each host's ranks in ascending order, then the hosts in host order."""
    return reduce_in_order([reduce_in_order([per_rank[r] for r in h], op) for h in HOSTS], op)


kinds = ["one_shot", "two_shot", "auto", "all_gather", "reduce_scatter", "all_to_all", "bcast"]
sym = comm.empty((MAX_BYTES,), torch.uint8)
for it in range(iters):
    gen = torch.Generator().manual_seed(seed * 7919 + it)
    kind = kinds[it % len(kinds)]
    dtype = DTYPES[(it // len(kinds)) % len(DTYPES)]
    op = OPS[(it // (len(kinds) * len(DTYPES))) % len(OPS)]
    in_place = it % 2 == 0
    integer = it % 5 == 0
    es = torch.tensor([], dtype=dtype).element_size()
    limit = MAX_BYTES // es // (world if kind in ("reduce_scatter", "all_to_all") else 1)
    numel = int(torch.randint(1, min(limit, 2001), (1,), generator=gen)) | 1
    what = f"call {it} {kind} {dtype} {op} numel={numel} in_place={in_place}"

    def place(t, it=it):
        """t on the device; every third call in the symmetric buffer (read in place
        by the host's peers)."""
        if it % 3 or cuda:
            return t.to(dev, copy=True)
        view = sym[: t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        view.copy_(t)
        return view

    if kind in ("one_shot", "two_shot", "auto"):
        ins = make_inputs(gen, numel, dtype, integer)
        x = place(ins[rank])
        out = None if in_place else torch.empty_like(x)
        got = comm.all_reduce(x, op=op, out=out, algorithm=kind)
        assert got is (x if in_place else out), what
        same(got, reference(ins, op), what)
        if not in_place:
            same(x, ins[rank], what + " input untouched")
    elif kind == "all_gather":
        n = max(numel // 3, 1)
        ins = make_inputs(gen, n * 3, dtype, integer)
        x = place(ins[rank].view(n, 3))
        out = None if in_place else torch.empty((world * n, 3), dtype=dtype, device=dev)
        got = comm.all_gather(x, out=out)
        same(got, torch.cat([t.view(n, 3) for t in ins]), what)
    elif kind == "reduce_scatter":
        ins = make_inputs(gen, numel * world, dtype, integer)
        x = place(ins[rank])
        out = None if in_place else torch.empty(numel, dtype=dtype, device=dev)
        got = comm.reduce_scatter(x, op=op, out=out)
        want = reference([t[rank * numel : (rank + 1) * numel] for t in ins], op)
        same(got, want, what)
    elif kind == "all_to_all":
        row = 5
        rows_max = max(MAX_BYTES // es // row // world // world, 1)
        split = torch.randint(0, rows_max + 1, (world, world), generator=gen)
        if it % 4 == 1:
            split[:, :] = split[0, 0]
        per = [
            make_inputs(gen, int(split[s].sum()) * row, dtype, integer)[0].view(-1, row)
            for s in range(world)
        ]
        x = place(per[rank])
        if bool((split == split[0, 0]).all()) and it % 8 == 1:
            got = comm.all_to_all(x)
        else:
            out = torch.empty((int(split[:, rank].sum()), row), dtype=dtype, device=dev)
            got = comm.all_to_all(
                x, out=out, in_splits=split[rank].tolist(), out_splits=split[:, rank].tolist()
            )
        parts = []
        for s in range(world):
            begin = int(split[s, :rank].sum())
            parts.append(per[s][begin : begin + int(split[s, rank])])
        same(got, torch.cat(parts), what)
    else:
        src = (it // len(kinds)) % world
        ins = make_inputs(gen, numel, dtype, integer)
        x = place(ins[rank])
        got = comm.broadcast(x, src)
        assert got is x
        same(got, ins[src], what)
    if it % 10 == 9:
        comm.barrier()
if cuda:
    torch.cuda.synchronize()
assert comm.calls == iters + iters // 10, (comm.calls, iters)
print(f"rank {rank}: {iters} calls across {len(HOSTS)} hosts of {len(HOSTS[0])}")

if not cuda:
    # Calls that differ between ranks of different hosts (the hosts' parts agree).
    other = HOSTS[1][0]
    x = torch.arange(100, dtype=torch.float32)
    n = 96 if rank in HOSTS[1] else 100
    msg = expect(mc.InvalidArgumentError, "ranks disagree", comm.all_reduce, x[:n].clone())
    assert "across hosts" in msg and "all_reduce of" in msg, msg
    op = "max" if rank in HOSTS[1] else "sum"
    msg = expect(mc.InvalidArgumentError, "ranks disagree", comm.all_reduce, x.clone(), op=op)
    assert "op max" in msg and "op sum" in msg, msg
    msg = expect(
        mc.InvalidArgumentError, "ranks disagree", comm.broadcast, x.clone(), 0 if n == 100 else 1
    )
    assert "src 0" in msg and "src 1" in msg, msg
    # One rank's invalid input: its message there, the call fails on every rank.
    bad = torch.zeros(8, dtype=torch.float64)
    if rank == other:
        expect(mc.InvalidArgumentError, "has dtype torch.float64", comm.all_reduce, bad)
    elif rank in HOSTS[1]:
        expect(mc.InvalidArgumentError, f"rejected by rank {HOSTS[1].index(other)}",
               comm.all_reduce, x.clone())  # fmt: skip
    else:
        msg = expect(mc.InvalidArgumentError, "failed on the host of rank", comm.all_reduce, x)
        assert f"host of rank {min(HOSTS[1])}" in msg, msg
    # All-to-all-v whose splits do not pair up across hosts.
    ins = [1] * world
    outs = [1] * world
    if rank == 0:
        outs[world - 1] = 2
    expect(
        mc.InvalidArgumentError,
        f"rank {world - 1} sends 1 rows to rank 0, which expects 2 rows from it",
        comm.all_to_all,
        torch.zeros(world, 4),
        out=torch.zeros(sum(outs), 4),
        in_splits=ins,
        out_splits=outs,
    )
    # Still usable.
    y = torch.full((33,), float(rank + 1))
    comm.all_reduce(y)
    assert y.tolist() == [world * (world + 1) / 2] * 33

comm.close()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} ok")
