# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the proxy tests. argv: mode seed transport pes_per_node [rounds]

Emulates nodes of ``pes_per_node`` pes each on this host (MORI_SHMEM_NODE_ID), makes
a host heap and a proxy over mori's TCP bootstrap and runs one scenario; prints
"pe N ok" at the end. transport: "auto" or "tcp" (ProxyOptions::transport).
"""

import ctypes
import os
import random
import sys
import time

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
mode, seed, transport, per_node = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 100
os.environ["MORI_SHMEM_NODE_ID"] = f"n{rank // per_node}"

import mori.core as mc  # noqa: E402
from mori.core import proxy as px  # noqa: E402
from mori.core import shmem  # noqa: E402
from mori.core.bootstrap import TcpBootstrap  # noqa: E402

TIMEOUT_S = 3.0 if mode == "stuck" else 60.0
boot = TcpBootstrap.from_env()
shmem.init(device="cpu", heap_size="32M", bootstrap=boot, timeout_s=TIMEOUT_S)
me, n = shmem.my_pe(), shmem.n_pes()
assert (me, n) == (rank, world)
p = px.Proxy(boot, num_queues=2, transport=transport, timeout_s=TIMEOUT_S)


def node(pe):
    return pe // per_node


for pe in range(n):
    path = p.path_to(pe)
    if node(pe) == node(me):
        assert path == "mapped", (pe, path)
    elif transport == "tcp":
        assert path == "tcp", (pe, path)
    else:
        assert path in ("cma", "tcp"), (pe, path)
    assert p.node_of(pe) == f"env:n{node(pe)}", p.node_of(pe)
print(f"pe {me}: paths {[p.path_to(pe) for pe in range(n)]}", flush=True)


def wait_ge(addr, value, what):
    """Wait for the word at addr to reach value, checking the proxy's health."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return shmem.wait_until(addr, "ge", value, timeout_s=0.05)
        except mc.MoriTimeoutError:
            p.check_health()
            if time.monotonic() > deadline:
                seen = ctypes.c_uint64.from_address(addr).value
                raise AssertionError(
                    f"pe {me}: {what}: word at {seen}, waited for {value}"
                ) from None


def payload(src, dst, r, nbytes):
    return random.Random(f"{seed}/{src}/{dst}/{r}").randbytes(nbytes)


SIZES = [0, 1, 7, 8, 4096, 4097, 96 * 1024 - 3, 96 * 1024]


def size_of(src, dst, r):
    return random.Random(f"size/{seed}/{src}/{dst}/{r}").choice(SIZES)


if mode == "order":
    # Every pe streams rounds of random payloads to every other pe: each round two
    # writes then an add of the round's signal, or one fused write+add; the receiver
    # checks the payload bit for bit as soon as it sees the signal. K slots per pair,
    # credit returned by an ack add, so senders run up to K rounds ahead. A pair's
    # commands stay on one queue (dst % 2): ordering holds within a queue only.
    K, SLOT = 4, 96 * 1024
    data = shmem.malloc(n * K * SLOT)  # [src][k] inbound slots
    stage = shmem.malloc(n * K * SLOT)  # [dst][k] outbound staging (the write sources)
    sig = shmem.malloc(8 * n, 8)  # [src] rounds arrived
    ack = shmem.malloc(8 * n, 8)  # [dst] rounds consumed
    ctypes.memset(sig, 0, 8 * n)
    ctypes.memset(ack, 0, 8 * n)
    shmem.barrier_all()
    off = px.heap_offset
    peers = [pe for pe in range(n) if pe != me]
    checked = 0
    for r in range(1, rounds + 1):
        k = r % K
        for dst in peers:
            q = dst % 2
            wait_ge(ack + 8 * dst, max(0, r - K), f"credit from pe {dst}")
            nbytes = size_of(me, dst, r)
            src_addr = stage + (dst * K + k) * SLOT
            ctypes.memmove(src_addr, payload(me, dst, r, nbytes), nbytes)
            dst_off = off(data + (me * K + k) * SLOT)
            if r % 3 == 0:
                p.write_add(dst, dst_off, off(src_addr), nbytes, off(sig + 8 * me), 1, queue=q)
            else:
                half = nbytes // 2
                p.write(dst, dst_off, off(src_addr), half, queue=q)
                p.write(dst, dst_off + half, off(src_addr) + half, nbytes - half, queue=q)
                p.atomic_add(dst, off(sig + 8 * me), 1, queue=q)
        for src in peers:
            wait_ge(sig + 8 * src, r, f"round {r} from pe {src}")
            nbytes = size_of(src, me, r)
            got = ctypes.string_at(data + (src * K + k) * SLOT, nbytes)
            want = payload(src, me, r, nbytes)
            if got != want:
                bad = next(i for i in range(nbytes) if got[i] != want[i])
                raise AssertionError(
                    f"pe {me}: round {r} from pe {src} ({p.path_to(src)}): {nbytes} bytes, "
                    f"first difference at byte {bad}"
                )
            checked += nbytes
            p.atomic_add(src, off(ack + 8 * me), 1, queue=0)
    p.quiet(0)
    p.quiet(1)
    p.barrier(1)
    st = p.stats()
    print(f"pe {me}: {rounds} rounds x {len(peers)} peers, {checked} bytes checked, {st}")

elif mode.startswith("pieces"):
    # Every pe sends every other pe a buffer as a run of writes (random sizes, empty
    # ones too), then a signal; the receiver checks it bit for bit. The proxy posts
    # consecutive writes to one pe whose source AND destination ranges both continue
    # the previous one's as one write; the variants tell a right rule from wrong ones:
    #   pieces: both ranges continue (merged);
    #   pieces-src-shuffled: destinations continue, sources are the pieces of the
    #     outbox in shuffled order (a rule checking only destinations merges wrongly);
    #   pieces-dst-shuffled: sources continue, destinations shuffled (the other way);
    #   pieces-retired: both continue, and after each write the producer waits for it
    #     to retire, then overwrites its source: the old bytes must land.
    B = 160 * 1024
    inbox = shmem.malloc(n * B)  # [src]
    outbox = shmem.malloc(n * B)  # [dst]
    sig = shmem.malloc(8 * n, 8)  # [src] rounds arrived
    ctypes.memset(sig, 0, 8 * n)
    shmem.barrier_all()
    off = px.heap_offset
    peers = [pe for pe in range(n) if pe != me]

    def layout(src, dst, r):
        """[(size, at in src's outbox row, at in dst's inbox row)] in posting order."""
        cut = random.Random(f"cut/{seed}/{src}/{dst}/{r}")
        sizes, at = [], 0
        while at < B:
            size = min(B - at, cut.choice([0, 1, 3, 8, 64, 4095, 4096, 4097, 20000]))
            sizes.append(size)
            at += size
        order = list(range(len(sizes)))
        if mode in ("pieces-src-shuffled", "pieces-dst-shuffled"):
            cut.shuffle(order)
        # The pieces laid out in `order`: piece i starts at placed[i].
        placed, at = [0] * len(sizes), 0
        for i in order:
            placed[i], at = at, at + sizes[i]
        seq, at = [], 0
        for size in sizes:
            seq.append(at)
            at += size
        if mode == "pieces-src-shuffled":
            return list(zip(sizes, placed, seq, strict=True))
        if mode == "pieces-dst-shuffled":
            return list(zip(sizes, seq, placed, strict=True))
        return list(zip(sizes, seq, seq, strict=True))

    writes = 0
    for r in range(1, rounds + 1):
        for dst in peers:
            q = dst % 2
            data = payload(me, dst, r, B)
            row = outbox + dst * B
            ctypes.memmove(row, data, B)
            for size, s_at, d_at in layout(me, dst, r):
                idx = p.write(dst, off(inbox + me * B) + d_at, off(row) + s_at, size, queue=q)
                if mode == "pieces-retired" and size > 0:
                    p.wait_retired(idx + 1, queue=q)
                    ctypes.memmove(
                        row + s_at, bytes(b ^ 0xFF for b in data[s_at : s_at + size]), size
                    )
                writes += 1
            p.atomic_add(dst, off(sig + 8 * me), 1, queue=q)
        for src in peers:
            wait_ge(sig + 8 * src, r, f"round {r} from pe {src}")
            got = ctypes.string_at(inbox + src * B, B)
            sent = payload(src, me, r, B)
            want = bytearray(B)
            for size, s_at, d_at in layout(src, me, r):
                want[d_at : d_at + size] = sent[s_at : s_at + size]
            if got != want:
                bad = next(i for i in range(B) if got[i] != want[i])
                raise AssertionError(
                    f"pe {me}: {mode} round {r} from pe {src} ({p.path_to(src)}): first "
                    f"difference at byte {bad} of {B}"
                )
        # Every pe checked this round before the next one rewrites the boxes.
        p.quiet(0)
        p.quiet(1)
        p.barrier(0)
    print(f"pe {me}: {mode}: {rounds} rounds x {len(peers)} peers of {B} bytes in {writes} writes")

elif mode == "selfchain":
    # Writes to this pe itself whose ranges chain: each run shifts consecutive pieces
    # of a buffer up by `shift` bytes (piece k+1's source and destination continue
    # piece k's), so a piece's source may be what the piece before it just wrote.
    # Applied one by one that differs from one memmove of the whole run; the proxy
    # must not merge such writes. Checked against applying them one by one here.
    S = 64 * 1024
    buf = shmem.malloc(S)
    g = random.Random(f"selfchain/{seed}/{me}")
    model = bytearray(g.randbytes(S))
    ctypes.memmove(buf, bytes(model), S)
    off = px.heap_offset
    writes = 0
    for r in range(rounds):
        shift = g.choice([1, 7, 64, 100, 4096])
        start = g.randrange(0, S // 2)
        at = start
        for _ in range(g.randint(2, 40)):
            size = g.choice([0, 1, 5, 64, 200, 4096])
            if at + shift + size > S:
                break
            p.write(me, off(buf) + at + shift, off(buf) + at, size, queue=r % 2)
            model[at + shift : at + shift + size] = model[at : at + size]
            at += size
            writes += 1
        p.quiet(r % 2)  # the next run may read what this one wrote, from the other queue
    got = ctypes.string_at(buf, S)
    if got != bytes(model):
        bad = next(i for i in range(S) if got[i] != model[i])
        raise AssertionError(
            f"pe {me}: {writes} chained writes to itself: first difference at byte {bad}"
        )
    print(f"pe {me}: {rounds} runs, {writes} chained writes to itself as applied one by one")

elif mode == "atomic":
    # Every pe adds random values to one word on every pe (itself included) from both
    # queues at once; mapped pes add through the mapping while remote ones arrive
    # through the receiver, so the word sees concurrent atomics of both kinds.
    word = shmem.malloc(8, 8)
    ctypes.memset(word, 0, 8)
    shmem.barrier_all()

    def values(src):
        g = random.Random(f"add/{seed}/{src}")
        return [g.randrange(1 << 40) for _ in range(rounds)]

    mine = values(me)
    for i, v in enumerate(mine):
        for dst in range(n):
            p.atomic_add(dst, px.heap_offset(word), v, queue=i % 2)
    p.barrier(0)
    p.barrier(1)
    want = sum(sum(values(src)) for src in range(n)) % (1 << 64)
    got = ctypes.c_uint64.from_address(word).value
    assert got == want, f"pe {me}: word {got}, expected {want}"
    print(f"pe {me}: {rounds * n} adds from {n} pes summed exactly")

elif mode == "die":
    # The last pe (alone on the last node) dies mid-stream without closing; every
    # other pe must see an error naming it and its node within the timeout.
    victim = n - 1
    buf = shmem.malloc(1 << 20)
    shmem.barrier_all()
    if me == victim:
        for _ in range(5):
            p.write(0, px.heap_offset(buf), px.heap_offset(buf), 1 << 20)
        print(f"pe {me} ok", flush=True)
        os._exit(0)
    start = time.monotonic()
    try:
        while time.monotonic() - start < TIMEOUT_S:
            p.write(victim, px.heap_offset(buf), px.heap_offset(buf), 1 << 16)
            p.quiet()
        raise AssertionError(f"pe {me}: no error {TIMEOUT_S} s after pe {victim} died")
    except mc.TransportError as e:
        msg = str(e)
        assert f"pe {victim} (node 'env:n{victim // per_node}')" in msg, msg
        print(f"pe {me}: {time.monotonic() - start:.2f} s to: {msg}", flush=True)
    # Let the other survivors see the victim's loss before this pe's exit is one more.
    time.sleep(1.0)
    print(f"pe {me} ok", flush=True)
    os._exit(0)

elif mode == "stuck":
    # pe 1 stops (SIGSTOP) without closing anything: its sockets stay open and its
    # receive buffers fill. pe 0 keeps writing; within the timeout (3 s) a wait fails,
    # and the proxy names pe 1 (a send that makes no progress).
    import signal

    pids = [int.from_bytes(b, "little") for b in boot.all_gather(os.getpid().to_bytes(8, "little"))]
    buf = shmem.malloc(4 << 20)
    shmem.barrier_all()
    if me == 1:
        print(f"pe {me} ok", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)  # after pe 0's SIGCONT
    time.sleep(0.5)  # pe 1 has stopped
    start = time.monotonic()
    try:
        while time.monotonic() - start < 10 * TIMEOUT_S:
            p.write(1, px.heap_offset(buf), px.heap_offset(buf), 4 << 20)
        raise AssertionError(f"pe {me}: writes into a stopped pe never failed")
    except (mc.MoriTimeoutError, mc.TransportError) as e:
        first = f"{type(e).__name__}: {e}"
    failed_at = time.monotonic() - start
    named = None
    while named is None and time.monotonic() - start < 3 * TIMEOUT_S:
        try:
            p.check_health()
            time.sleep(0.05)
        except mc.TransportError as e:
            named = str(e)
    os.kill(pids[1], signal.SIGCONT)
    assert named is not None, f"pe {me}: the proxy never named the stopped pe ({first})"
    assert "pe 1 (node 'env:n1')" in named and "no progress sending" in named, named
    if first.startswith("MoriTimeoutError"):
        assert "the proxy is posting a command to pe 1" in first, first
    print(f"pe {me}: first error after {failed_at:.1f} s: {first}\npe {me}: named: {named}")
    print(f"pe {me} ok", flush=True)
    os._exit(0)

else:
    raise SystemExit(f"unknown mode {mode}")

p.close()
shmem.finalize(force=True)
print(f"pe {me} ok")
