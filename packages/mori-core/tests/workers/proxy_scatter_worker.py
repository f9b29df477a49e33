# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the scatter tests. argv: seed pes_per_node device (cpu | cuda) [layout]

A CPU producer pushes writes from this pe's heap into the next pe's, in groups, an add
of a signal after each group. The peer checks the pieces of the first half of the
groups once the signal says they arrived, then every byte. layout:
  scatter (default): disjoint pieces of random sizes (1 byte .. 20 KiB, never
    contiguous, so each stays one write) in random order, groups of 64, and one piece
    larger than the TCP transport's 4 MiB staging buffers;
  runs: each group one run of 257..600 small writes (0 .. 4 KiB) whose destinations
    and sources continue (source offsets differ from the destination's), or only the
    destinations (sources anywhere), or only the sources (destinations a shuffle of
    the run's range). On a CUDA heap a run crosses the proxy's rounds (256 commands)
    and the TCP receiver merges the copies of consecutive payloads.
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
layout = sys.argv[4] if len(sys.argv) > 4 else "scatter"
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


def scatter_of(pe):
    """Groups of (dst offset, src offset, size) in the order pe pushes them: disjoint,
    with a gap of at least one byte between neighbours."""
    g = random.Random(f"pieces/{seed}/{pe}")
    out, at = [(0, 0, BIG)], BIG + 1
    while True:
        size = g.choice([1, 7, 8, 64, 1000, 4095, 4096, 4097, 14336, 20000])
        if at + size > N:
            break
        out.append((at, at, size))
        at += size + g.randint(1, 64)
    g.shuffle(out)
    return [out[i : i + GROUP] for i in range(0, len(out), GROUP)]


def runs_of(pe):
    """Groups of (dst offset, src offset, size), one run each (see the layout runs)."""
    g = random.Random(f"runs/{seed}/{pe}")
    groups, at = [], 0
    while True:
        sizes = [g.choice([0, 1, 7, 8, 64, 100, 1000, 4096]) for _ in range(g.randint(257, 600))]
        total = sum(sizes)
        if at + total > N // 2:
            break
        kind = g.choice(["both", "dst", "src"])
        seq = [at + sum(sizes[:k]) for k in range(len(sizes))]
        base = g.randrange(N // 2, N - total)  # sources in the upper half
        if kind == "both":
            run = [(d, base + d - at, size) for d, size in zip(seq, sizes, strict=True)]
        elif kind == "dst":
            run = [(d, g.randrange(0, N - size), size) for d, size in zip(seq, sizes, strict=True)]
        else:  # the run's pieces laid out in a shuffled order in the destination range
            order = list(range(len(sizes)))
            g.shuffle(order)
            placed, d = [0] * len(sizes), at
            for i in order:
                placed[i], d = d, d + sizes[i]
            run = [(placed[k], base + seq[k] - at, sizes[k]) for k in range(len(sizes))]
        groups.append(run)
        at += total + g.randint(1, 64)
    return groups


pieces_of = runs_of if layout == "runs" else scatter_of


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
for group in mine:
    for d, s, size in group:
        p.write(peer, off(dst) + d, off(src) + s, size)
    p.atomic_add(peer, off(sig), 1)

theirs = pieces_of(source)
groups = len(theirs)
expected = data_of(source)


def check(first_groups, dst, sig):
    shmem.wait_until(sig, "ge", first_groups, timeout_s=120)
    got = dst.cpu()
    want = torch.zeros(N, dtype=torch.uint8)
    for group in theirs[:first_groups]:
        for d, s, size in group:
            want[d : d + size] = expected[s : s + size]
    if first_groups < groups:  # later groups may have landed too: check only these
        mask = torch.zeros(N, dtype=torch.bool)
        for group in theirs[:first_groups]:
            for d, _, size in group:
                mask[d : d + size] = True
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
    f"pe {me}: {layout}: {sum(map(len, theirs))} pieces in {groups} groups from pe {source} "
    f"over {want_path} bit for bit; sent {sum(map(len, mine))} writes, "
    f"{st['lane_waits']} waits of this proxy's CUDA streams",
    flush=True,
)
shmem.barrier_all()
p.close()
del src, dst, sig
shmem.finalize(force=True)
print(f"pe {me} ok")
