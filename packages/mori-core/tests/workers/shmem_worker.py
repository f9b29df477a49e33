# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the host-heap tests. argv: mode seed [rounds]

Bootstraps over gloo (TorchBootstrap) or mori's TCP bootstrap (mode suffix
"-tcp"), creates a host heap and runs one scenario; prints "pe N ok" at the end.
"""

import os
import random
import sys
import time

import torch

import mori.core as mc
from mori.core import shmem
from mori.core.launch import expect_raises as expect_error

mode, seed = sys.argv[1], int(sys.argv[2])
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
rng = random.Random(seed * 7919 + rank)

if mode == "twonodes":
    # Two emulated nodes: pes [0, n/2) on "a", the rest on "b".
    os.environ["MORI_SHMEM_NODE_ID"] = "a" if rank < world // 2 else "b"
if mode.endswith("-tcp"):
    from mori.core.bootstrap import TcpBootstrap

    shmem.init(device="cpu", heap_size="16M", bootstrap=TcpBootstrap.from_env(), timeout_s=60)
    mode = mode[: -len("-tcp")]
else:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    shmem.init(device="cpu", heap_size="16M", timeout_s=60)

me, n = shmem.my_pe(), shmem.n_pes()
assert (me, n) == (rank, world)


if mode == "basic":
    info = shmem.info()
    assert info["kind"] == "host" and info["local_pes"] == list(range(n)), info
    x = shmem.empty((1000,), torch.int64)
    x.copy_(torch.arange(1000) + 1000 * me)
    shmem.barrier_all()
    for pe in range(n):
        v = shmem.peer_view(x, pe)
        assert torch.equal(v, torch.arange(1000) + 1000 * pe), f"peer_view of pe {pe}"
    shmem.barrier_all()
    # put to the right neighbour, get from the left one, bit for bit.
    right, left = (me + 1) % n, (me - 1) % n
    buf = shmem.empty((4096,), torch.uint8)
    payload = torch.tensor(list(random.Random(seed + me).randbytes(4096)), dtype=torch.uint8)
    shmem.put(buf, payload, right)
    shmem.barrier_all()
    want_from_left = torch.tensor(
        list(random.Random(seed + left).randbytes(4096)), dtype=torch.uint8
    )
    assert torch.equal(buf, want_from_left)
    got = torch.empty(4096, dtype=torch.uint8)
    shmem.get(got, buf, right)  # right's buf holds my payload
    assert torch.equal(got, payload)
    # signal add from every pe, then wait.
    sig = shmem.empty((1,), torch.int64)
    sig.zero_()
    shmem.barrier_all()
    for pe in range(n):
        shmem.signal(sig, me + 1, pe, op="add")
    total = n * (n + 1) // 2
    assert shmem.wait_until(sig, "eq", total, timeout_s=30) == total
    shmem.barrier_all()
    del x, buf, sig, v
elif mode == "stress":
    # Data then flag: pe sends a fresh payload to its right neighbour each round,
    # raises the flag there, and waits for the neighbour's ack before reusing the
    # buffer. Any reordering shows up as a stale payload.
    right, left = (me + 1) % n, (me - 1) % n
    words = 64
    data = shmem.empty((words,), torch.int64)
    flag = shmem.empty((1,), torch.int64)
    ack = shmem.empty((1,), torch.int64)
    flag.zero_()
    ack.zero_()
    shmem.barrier_all()
    base = torch.arange(words, dtype=torch.int64)
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        shmem.put(data, base * 1_000_003 + r * 7 + me, right)
        shmem.signal(flag, r, right)
        shmem.wait_until(flag, "ge", r, timeout_s=30)
        expected = base * 1_000_003 + r * 7 + left
        if not torch.equal(data, expected):
            raise AssertionError(f"round {r}: stale or torn payload from pe {left}")
        shmem.signal(ack, r, left)
        shmem.wait_until(ack, "ge", r, timeout_s=30)
        if r % 1000 == 0:
            shmem.barrier_all()
    elapsed = time.perf_counter() - start
    print(f"pe {me}: {rounds} rounds in {elapsed:.2f}s ({elapsed / rounds * 1e6:.1f} us/round)")
    del data, flag, ack
elif mode == "alloc":
    # Fragmentation and reuse: random sizes, free every other block, allocate
    # again; all pes make the same calls so addresses stay symmetric.
    srng = random.Random(seed)
    blocks = [
        shmem.malloc(srng.randrange(1, 20000), 1 << srng.randrange(3, 12)) for _ in range(200)
    ]
    for b in blocks[::2]:
        shmem.free(b)
    again = [shmem.malloc(srng.randrange(1, 10000)) for _ in range(100)]
    for b in blocks[1::2] + again:
        assert shmem.ptr(b, me) == b
    for b in blocks[1::2] + again:
        shmem.free(b)
    info = shmem.info()
    assert info["live_allocations"] == 0, info
    # After freeing everything the heap is one block again (coalescing).
    assert info["largest_free_block"] == info["free_bytes"], info
    big = shmem.malloc(info["largest_free_block"] - 4096, 256)
    shmem.free(big)
    # Errors name the values and leave the heap usable.
    p = shmem.malloc(1024)
    shmem.free(p)
    expect_error(mc.InvalidArgumentError, "not a live allocation", shmem.free, p)
    q = shmem.malloc(4096)
    expect_error(mc.InvalidArgumentError, "inside the allocation", shmem.free, q + 8)
    expect_error(mc.InvalidArgumentError, "not in this pe's symmetric heap", shmem.free, 4096)
    expect_error(mc.OutOfMemoryError, "requested", shmem.malloc, 1 << 40)
    expect_error(mc.InvalidArgumentError, "malloc of 0 bytes", shmem.malloc, 0)
    # Asymmetric calls are reported on every pe instead of silently diverging.
    expect_error(mc.InvalidArgumentError, "asymmetric malloc", shmem.malloc, 512 * (me + 1))
    expect_error(mc.InvalidArgumentError, "out of range", shmem.ptr, q, n)
    expect_error(mc.InvalidStateError, "already initialized", shmem.init, None, "cpu")
    # Finalize with a live buffer fails on every pe; freeing it lets it pass.
    expect_error(mc.InvalidStateError, "live symmetric allocations", shmem.finalize)
    shmem.free(q)
elif mode == "twonodes":
    # MORI_SHMEM_NODE_ID splits the pes into two emulated nodes: pes on the other
    # node are not load/store reachable.
    info = shmem.info()
    other = [pe for pe in range(n) if pe not in info["local_pes"]]
    assert other, info
    x = shmem.empty((16,), torch.float32)
    expect_error(mc.NotSupportedError, "not load/store reachable", shmem.peer_view, x, other[0])
    assert shmem.ptr(x, other[0]) == 0
    expect_error(mc.NotSupportedError, "another node", shmem.put, x, torch.zeros(16), other[0])
    shmem.barrier_all()  # falls back to the bootstrap
    del x
else:
    raise SystemExit(f"unknown mode {mode}")

shmem.finalize()
expect_error(mc.InvalidStateError, "not initialized", shmem.my_pe)
import torch.distributed as dist  # noqa: E402

if dist.is_initialized():
    dist.destroy_process_group()
print(f"pe {me} ok")
