# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the scatter tests. argv: seed pes_per_node device (cpu | cuda)

A CPU producer pushes a scatter of writes from this pe's heap into the next pe's:
disjoint pieces of random sizes (1 byte .. 20 KiB, never contiguous, so each stays one
write) in random order, and one piece larger than the TCP transport's 4 MiB staging
buffers, an add of a signal after every group of pieces. The peer checks the pieces
of the first half of the groups once the signal says they arrived, then every byte.
On a CUDA heap over TCP this runs the proxy's staging paths: many writes per lane
wait, both staging buffers filling and starting over, a payload sent in chunks.
pes_per_node 1: two emulated nodes over TCP; 2: one node (mapped). Prints "pe N ok".
"""

import os
import random
import sys

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
seed, per_node, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.environ["MORI_SHMEM_NODE_ID"] = f"n{rank // per_node}"

import torch  # noqa: E402

from mori.core import proxy as px  # noqa: E402
from mori.core import shmem  # noqa: E402
from mori.core.bootstrap import TcpBootstrap  # noqa: E402

if device == "cuda":
    torch.cuda.set_device(0)
boot = TcpBootstrap.from_env()
shmem.init(device=0 if device == "cuda" else "cpu", heap_size="64M", bootstrap=boot)
me, n = shmem.my_pe(), shmem.n_pes()
peer, source = (me + 1) % n, (me - 1) % n
p = px.Proxy(boot, transport="tcp" if per_node == 1 else "auto", timeout_s=120)
want_path = "tcp" if per_node == 1 else "mapped"
assert p.path_to(peer) == want_path, (p.path_to(peer), want_path)

N = 12 << 20
BIG = (5 << 20) + 3  # more than a staging buffer
GROUP = 64


def data_of(pe):
    g = torch.Generator().manual_seed(seed * 1000003 + pe)
    return torch.randint(0, 256, (N,), dtype=torch.uint8, generator=g)


def pieces_of(pe):
    """(offset, size) of pe's pieces, in the order it pushes them: disjoint, with a
    gap of at least one byte between neighbours."""
    g = random.Random(f"pieces/{seed}/{pe}")
    out, at = [(0, BIG)], BIG + 1
    while True:
        size = g.choice([1, 7, 8, 64, 1000, 4095, 4096, 4097, 14336, 20000])
        if at + size > N:
            break
        out.append((at, size))
        at += size + g.randint(1, 64)
    g.shuffle(out)
    return out


src = shmem.empty((N,), torch.uint8)
dst = shmem.empty((N,), torch.uint8)
sig = shmem.empty((1,), torch.int64)
src.copy_(data_of(me).to(src.device))
dst.zero_()
sig.zero_()
if device == "cuda":
    torch.cuda.synchronize()
shmem.barrier_all()
off = px.heap_offset

mine = pieces_of(me)
for i in range(0, len(mine), GROUP):
    for o, size in mine[i : i + GROUP]:
        p.write(peer, off(dst) + o, off(src) + o, size)
    p.atomic_add(peer, off(sig), 1)

theirs = pieces_of(source)
groups = (len(theirs) + GROUP - 1) // GROUP
expected = data_of(source)


def check(first_groups, dst, sig):
    shmem.wait_until(sig, "ge", first_groups, timeout_s=120)
    got = dst.cpu()
    want = torch.zeros(N, dtype=torch.uint8)
    for o, size in theirs[: first_groups * GROUP]:
        want[o : o + size] = expected[o : o + size]
    if first_groups < groups:  # later groups may have landed too: check only these
        mask = torch.zeros(N, dtype=torch.bool)
        for o, size in theirs[: first_groups * GROUP]:
            mask[o : o + size] = True
        got, want = got[mask], want[mask]
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (
        f"pe {me}: after {first_groups} of {groups} signals from pe {source}: "
        f"{bad.numel()} bytes differ, first at {bad[0].item()} (of the checked bytes)"
    )


check(groups // 2, dst, sig)
check(groups, dst, sig)
p.quiet(0)
st = p.stats()
print(
    f"pe {me}: {len(theirs)} pieces from pe {source} over {want_path} bit for bit; sent "
    f"{len(mine)} writes, {st['lane_waits']} waits of this proxy's CUDA streams",
    flush=True,
)
shmem.barrier_all()
p.close()
del src, dst, sig
shmem.finalize(force=True)
print(f"pe {me} ok")
