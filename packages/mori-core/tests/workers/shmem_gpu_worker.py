# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One pe of the CUDA symmetric-heap tests. argv: mode placement seed [rounds]

placement: shared   every pe on GPU 0 (2 processes on 1 GPU)
           per_gpu  pe r on GPU r
mode:      suite    peer views, host put/get, kernel put/get at each scope,
                    data-then-flag stress, barrier_on_stream in a CUDA graph
           handle   MORI_SHMEM_HANDLE=auto / posix_fd / fabric in turn
Prints "pe N ok" at the end; any failed check raises (non-zero exit).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import mori.core as mc
from mori.core import _C, shmem

mode, placement, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dev = 0 if placement == "shared" else rank
torch.cuda.set_device(dev)
dist.init_process_group("gloo", init_method="env://")
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[pe {rank} dev {dev} +{time.monotonic() - T0:6.2f}s] {msg}", flush=True)


def data_of(pe: int, tag: int, nbytes: int) -> torch.Tensor:
    """pe's random bytes for a step, reproducible on every pe (CPU generator)."""
    g = torch.Generator().manual_seed(seed * 1000003 + pe * 7919 + tag)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).cuda()


def check_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(
            f"{what}: {bad.numel()} of {want.numel()} bytes differ, first at {bad[0].item()}"
        )


def sync_barrier() -> None:
    torch.cuda.synchronize()
    shmem.barrier_all()


def test_peer_views(me: int, n: int) -> None:
    nbytes = 1 << 20
    x = shmem.empty((nbytes,), torch.uint8)
    x.copy_(data_of(me, 1, nbytes))
    sync_barrier()
    for pe in range(n):
        check_equal(shmem.peer_view(x, pe), data_of(pe, 1, nbytes), f"read of pe {pe}'s copy")
    sync_barrier()
    # Write into the next pe's copy through its view; it reads its own tensor.
    nxt, prv = (me + 1) % n, (me - 1) % n
    shmem.peer_view(x, nxt).copy_(data_of(me, 2, nbytes))
    sync_barrier()
    check_equal(x, data_of(prv, 2, nbytes), f"write by pe {prv} through its peer view")
    assert shmem.ptr(x, me) == x.data_ptr()
    sync_barrier()
    del x
    log("peer views ok")


def test_host_put_get(me: int, n: int) -> None:
    nbytes = (1 << 20) + 13
    dst = shmem.empty((nbytes,), torch.uint8)
    dst.zero_()
    nxt, prv = (me + 1) % n, (me - 1) % n
    src = data_of(me, 3, nbytes)
    sync_barrier()
    shmem.put(dst, src, nxt)  # device source
    sync_barrier()
    check_equal(dst, data_of(prv, 3, nbytes), "host put from a device tensor")
    host_src = data_of(me, 4, nbytes).cpu()
    sync_barrier()
    shmem.put(dst, host_src, nxt)  # host source
    sync_barrier()
    check_equal(dst, data_of(prv, 4, nbytes), "host put from a host tensor")
    got = torch.empty(nbytes, dtype=torch.uint8)
    shmem.get(got, dst, nxt)  # nxt holds what me wrote
    check_equal(got.cuda(), data_of(me, 4, nbytes), "host get into a host tensor")
    got_dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    shmem.get(got_dev, dst, prv)
    check_equal(got_dev, data_of((prv - 1) % n, 4, nbytes), "host get into a device tensor")
    # Signals from the host: add then wait, set then wait.
    sig = shmem.empty((1,), torch.int64)
    sig.zero_()
    sync_barrier()
    for pe in range(n):
        shmem.signal(sig, 1, pe, op="add")
    assert shmem.wait_until(sig, "ge", n, timeout_s=30) >= n
    sync_barrier()
    shmem.signal(sig, 1000 + me, nxt, op="set")
    assert shmem.wait_until(sig, "eq", 1000 + prv, timeout_s=30) == 1000 + prv
    sync_barrier()
    del dst, sig
    log("host put/get/signal ok")


SCOPES = ["block", "warp", "thread", "block_nbi", "warp_nbi", "thread_nbi"]


def test_kernel_put_get(me: int, n: int) -> None:
    nxt, prv = (me + 1) % n, (me - 1) % n
    stream = torch.cuda.current_stream().cuda_stream
    cap = (4 << 20) + 64
    dst = shmem.empty((cap,), torch.uint8)
    tag = 10
    # (bytes, dst offset, src offset): aligned, misaligned alike (8/4/1-byte
    # paths), skewed (byte path), tiny.
    cases = [
        (4 << 20, 0, 0),
        ((1 << 20) + 5, 16, 16),
        (300001, 8, 24),
        (65537, 3, 7),
        (4097, 1, 2),
        (1, 5, 0),
        (17, 4, 12),
    ]
    for scope in SCOPES:
        for blocks, threads in ((1, 64), (7, 256), (32, 1024)):
            for nbytes, doff, soff in cases:
                if scope.startswith("thread") and nbytes > (1 << 20):
                    nbytes = (1 << 18) + 3  # one thread per chunk: keep it short
                tag += 1
                src = torch.empty(nbytes + soff, dtype=torch.uint8, device="cuda")
                src[soff:] = data_of(me, tag, nbytes)
                sync_barrier()  # the previous step's gets of my copy are done
                dst.fill_(0xA5)
                sync_barrier()
                _C._shmem_put_kernel(
                    dst.data_ptr() + doff,
                    src.data_ptr() + soff,
                    nbytes,
                    nxt,
                    scope,
                    blocks,
                    threads,
                    stream,
                )
                sync_barrier()
                what = f"put {scope} blocks={blocks} threads={threads} n={nbytes} doff={doff} soff={soff}"
                check_equal(dst[doff : doff + nbytes], data_of(prv, tag, nbytes), what)
                assert int(dst[:doff].ne(0xA5).sum()) == 0, f"{what}: wrote before dst"
                assert int(dst[doff + nbytes :].ne(0xA5).sum()) == 0, f"{what}: wrote past dst"
                # get: every pe's dst now holds prv's data; read nxt's (= mine).
                out = torch.full((nbytes + soff + 1,), 0x5A, dtype=torch.uint8, device="cuda")
                _C._shmem_get_kernel(
                    out.data_ptr() + soff,
                    dst.data_ptr() + doff,
                    nbytes,
                    nxt,
                    scope,
                    blocks,
                    threads,
                    stream,
                )
                torch.cuda.synchronize()
                check_equal(
                    out[soff : soff + nbytes],
                    data_of(me, tag, nbytes),
                    f"get {scope} blocks={blocks} threads={threads} n={nbytes}",
                )
                assert int(out[-1]) == 0x5A, f"get {scope} n={nbytes}: wrote past dst"
        log(f"kernel put/get scope={scope} ok")
    sync_barrier()
    del dst


def test_signal_stress(me: int, n: int) -> None:
    slot_bytes, slots = 8192, 8
    buf = shmem.empty((slot_bytes * slots,), torch.uint8)
    flags = shmem.empty((2,), torch.int64)
    flags.zero_()
    buf.zero_()
    mismatches = torch.zeros(1, dtype=torch.int64, device="cuda")
    sync_barrier()
    start = time.monotonic()
    # Pairs (0,1), (2,3), ...: the even pe sends.
    if me ^ 1 < n:
        _C._shmem_signal_stress(
            buf.data_ptr(),
            flags.data_ptr(),
            mismatches.data_ptr(),
            slot_bytes,
            slots,
            rounds,
            me ^ 1,
            me % 2 == 0,
            256,
            120.0,
            torch.cuda.current_stream().cuda_stream,
        )
    torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    sync_barrier()
    bad = int(mismatches.item())
    if me ^ 1 < n:
        if me % 2 == 1:
            assert int(flags[0]) == rounds, f"receiver saw flag {int(flags[0])}, want {rounds}"
        else:
            assert int(flags[1]) == rounds, f"sender saw ack {int(flags[1])}, want {rounds}"
    assert bad == 0, f"{bad} payload words did not match their round after the flag"
    log(f"signal stress ok: {rounds} rounds x {slot_bytes} B, 0 mismatches, {elapsed:.2f}s")
    del buf, flags


def test_graph_barrier(me: int, n: int, replays: int) -> None:
    cnt = shmem.empty((1,), torch.int64)
    cnt.zero_()
    ok = torch.zeros(1, dtype=torch.int64, device="cuda")
    views = [shmem.peer_view(cnt, pe) for pe in range(n) if pe != me]
    sync_barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cnt.add_(1)
        shmem.barrier_on_stream()
        # Between the two barriers no pe increments: every copy equals mine.
        for v in views:
            ok.add_(v.eq(cnt).to(torch.int64))
        shmem.barrier_on_stream()
    torch.cuda.synchronize()
    assert int(cnt.item()) == 0 and int(ok.item()) == 0, "capture must not execute"
    start = time.monotonic()
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    assert int(cnt.item()) == replays, f"counter {int(cnt.item())} after {replays} replays"
    want = replays * len(views)
    assert int(ok.item()) == want, f"{want - int(ok.item())} of {want} peer reads saw another epoch"
    sync_barrier()
    del g, cnt, views
    log(f"graph barrier ok: {replays} replays, {elapsed / replays / 2 * 1e6:.1f} us per barrier")


def run_suite() -> None:
    shmem.init(device=dev, heap_size="256M", timeout_s=120)
    me, n = shmem.my_pe(), shmem.n_pes()
    assert (me, n) == (rank, world)
    info = shmem.info()
    log(f"info: {info}")
    assert info["kind"] == "cuda" and info["device"] == dev, info
    assert sorted(info["local_pes"]) == list(range(n)), info
    test_peer_views(me, n)
    test_host_put_get(me, n)
    test_kernel_put_get(me, n)
    test_signal_stress(me, n)
    test_graph_barrier(me, n, replays=200 if placement == "per_gpu" else 50)
    import gc

    gc.collect()
    shmem.finalize()


def run_handles() -> None:
    for choice in ("auto", "posix_fd"):
        os.environ["MORI_SHMEM_HANDLE"] = choice
        shmem.init(device=dev, heap_size="64M", timeout_s=60)
        info = shmem.info()
        log(
            f"MORI_SHMEM_HANDLE={choice}: handle_type={info['handle_type']} "
            f"notes={info['handle_notes']!r}"
        )
        if choice == "auto":
            assert info["handle_type"] in ("fabric", "posix_fd"), info
            if info["handle_type"] == "posix_fd":
                assert "fabric" in info["handle_notes"], info["handle_notes"]
        else:
            assert info["handle_type"] == "posix_fd", info
        x = shmem.empty((4096,), torch.uint8)
        x.fill_(rank + 1)
        sync_barrier()
        for pe in range(world):
            assert bool(shmem.peer_view(x, pe).eq(pe + 1).all()), f"pe {pe}'s copy wrong"
        sync_barrier()
        del x
        shmem.finalize()
    os.environ["MORI_SHMEM_HANDLE"] = "fabric"
    try:
        shmem.init(device=dev, heap_size="64M", timeout_s=60)
    except (mc.CudaError, mc.NotSupportedError) as e:
        msg = str(e)
        log(f"forced fabric refused: {type(e).__name__}: {msg}")
        assert "fabric" in msg, msg
        assert not shmem.initialized()
    else:
        info = shmem.info()
        log(f"forced fabric accepted: {info}")
        assert info["handle_type"] == "fabric", info
        shmem.finalize()
    del os.environ["MORI_SHMEM_HANDLE"]


if mode == "suite":
    run_suite()
elif mode == "handle":
    run_handles()
else:
    raise SystemExit(f"unknown mode {mode}")
dist.destroy_process_group()
print(f"pe {rank} ok", flush=True)
