# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The SHM backend (CMA between processes of one host) and the per-pair backend choice:
the pure selection function, transfers in two processes bit for bit, forced and
automatic fallback to TCP (override, CMA refused), and a peer killed mid-batch."""

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import mori.core as mc
from mori.core.launch import launch_local
from mori.core.testing import wait_for_path
from mori.io import (
    _C,
    BackendType,
    EngineDesc,
    IOEngine,
    IOEngineConfig,
    MemoryDesc,
    StatusCode,
    StatusDetail,
)
from mori.io.descriptors import ENGINE_DESC_VERSION

WORKER = str(Path(__file__).with_name("shm_peer_worker.py"))
KILL_WORKER = str(Path(__file__).with_name("io_peer_worker.py"))
CPU, GPU = _C.MemoryLocationType.CPU, _C.MemoryLocationType.GPU
T = getattr(_C, "_testing", None)  # test builds only; conftest skips io_testing tests without
HOST = "h/boot/pidns:1"


@pytest.mark.io_testing
def test_choice_is_a_pure_function_of_its_inputs():
    def choose(**kw):
        args = dict(local_host_id=HOST, remote_host_id=HOST, local_loc=CPU, remote_loc=CPU,
                    local_shm=True, remote_shm=True)  # fmt: skip
        args.update(kw)
        return T.choose_backend(**args)

    name, why = choose()  # no region named: either copy may follow
    assert name == "SHM" and why.startswith("SHM: same host, host memory on both sides, CMA")
    # With a region named, the reason says which copy moves the bytes, and why.
    assert choose(shm_path="mapped") == (
        "SHM",
        "SHM: mapped memcpy (the target region lies in the target's shared host memory, "
        "a memfd mapped into this process)",
    )
    assert choose(shm_path="cma", shm_path_why="not shared") == (
        "SHM",
        "SHM: CMA process_vm_readv/writev (same host, host memory on both sides; not shared)",
    )
    assert choose(override="shm", shm_path="mapped")[1].startswith("SHM forced; SHM: mapped")
    assert choose(remote_host_id="other/boot/pidns:1")[0] == "TCP"
    assert "different hosts" in choose(remote_host_id="other/boot/pidns:1")[1]
    assert "unknown" in choose(remote_host_id="")[1]
    assert "host memory" in choose(remote_loc=GPU)[1]
    assert "this engine has no SHM" in choose(local_shm=False)[1]
    assert "remote engine has no SHM" in choose(remote_shm=False)[1]
    name, why = choose(cma_ok=False, cma_reason="EPERM")
    assert name == "TCP" and "CMA not permitted: EPERM" in why
    assert choose(override="tcp") == (
        "TCP",
        "TCP forced (MORI_IO_BACKEND / IOEngineConfig.backend)",
    )
    assert choose(override="SHM")[0] == "SHM"
    name, why = choose(override="shm", local_shm=False)
    assert name == "TCP" and why.startswith("SHM forced but not usable")
    with pytest.raises(mc.InvalidArgumentError, match="'rdmax' is not one of"):
        choose(override="rdmax")


def _pair(**config):
    a = IOEngine("a", IOEngineConfig("127.0.0.1", 0, **config))
    b = IOEngine("b", IOEngineConfig("127.0.0.1", 0))
    for e in (a, b):
        e.create_backend(BackendType.SHM)  # starts the control reactors itself
    a.register_remote_engine(EngineDesc.unpack(b.get_engine_desc().pack()))
    b.register_remote_engine(EngineDesc.unpack(a.get_engine_desc().pack()))
    return a, b


@pytest.mark.parametrize("how", ["env", "config"])
def test_tcp_forced_by_env_or_config(monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("MORI_IO_BACKEND", "tcp")
        a, b = _pair()
    else:
        a, b = _pair(backend="tcp")
    x = np.arange(1 << 16, dtype=np.uint8)
    y = np.zeros(1 << 16, np.uint8)
    mx, my = a.register_array(x), b.register_array(y)
    assert a.backend_for(mx, my)[0] == "TCP" and "forced" in a.backend_for(mx, my)[1]
    st = a.write(mx, 1, my, 3, 60000, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(y[3:60003], x[1:60001])
    # b's config did not force it: the same pair seen from b uses SHM
    assert b.backend_for(my, mx)[0] == ("TCP" if how == "env" else "SHM")


@pytest.mark.io_testing  # the CMA fault switch
def test_cma_refused_at_engine_probe_falls_back(monkeypatch):
    monkeypatch.setenv("MORI_IO_TEST_CMA_REFUSE", "1")
    a, b = _pair()
    x = np.arange(4099, dtype=np.uint8)
    y = np.zeros(4099, np.uint8)
    mx, my = a.register_array(x), b.register_array(y)
    name, why = a.backend_for(mx, my)
    assert name == "TCP" and "CMA not permitted" in why and "Operation not permitted" in why, why
    st = a.write(mx, 0, my, 0, 4099, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(x, y)
    assert mori_available_reason_mentions_refusal()


def mori_available_reason_mentions_refusal():
    import mori.io

    ok, reason = mori.io.backend_availability()["SHM"]
    return not ok and "not permitted" in reason


def test_gpu_descriptor_is_not_sent_over_shm():
    a, b = _pair()
    x = np.zeros(64, np.uint8)
    mx = a.register_array(x)
    fake_gpu = MemoryDesc("b", 1, 0, 4096, 64, GPU)
    name, why = a.backend_for(mx, fake_gpu)
    assert name == "TCP" and "host memory" in why


def test_old_engine_desc_version_is_a_clear_error():
    import msgpack

    obj = msgpack.unpackb(EngineDesc("a", "127.0.0.1", 1234, host_id=HOST).pack())
    assert obj[1] == ENGINE_DESC_VERSION == 4 and obj[-3] == HOST
    old = msgpack.packb(["mori.io.EngineDesc", 1, "a", "127.0.0.1", 1234, "h", 1, ["TCP"]])
    with pytest.raises(mc.InvalidArgumentError, match="format version 1.*older mori-io"):
        EngineDesc.unpack(old)


@pytest.mark.parametrize(
    "mode",
    ["shm", pytest.param("cma-refused-by-peer", marks=pytest.mark.io_testing), "shared-host"],
)  # shared-host: the target's region lies in allocate_shared_host_memory -> memcpy
def test_two_processes_bit_exact(tmp_path, mode):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    env = {"MORI_IO_TEST_CMA_REFUSE": "peer"} if mode == "cma-refused-by-peer" else {}
    if mode == "shared-host":
        env["MORI_TEST_SHARED_HOST"] = "1"
    expect = "TCP" if mode == "cma-refused-by-peer" else "SHM"
    results = launch_local([WORKER, str(tmp_path), str(seed), expect], 2, timeout_s=90, env=env)
    assert "target verified" in results[0].output
    assert f"initiator verified {(8 << 20) + 5} bytes over {expect}" in results[1].output
    if mode == "cma-refused-by-peer":
        assert "CMA not permitted: process_vm_readv of pid" in results[1].output
    state = {"shm": 0, "shared-host": 1}.get(mode)  # 0: CMA, 1: mapped (memcpy)
    if state is not None:
        assert f"shm mapping state {state}" in results[1].output


def test_peer_killed_mid_batch_fails_over_shm(tmp_path):
    seed = random.randrange(1 << 30)
    target = subprocess.Popen(
        [sys.executable, KILL_WORKER, "target", str(tmp_path), str(seed), "shm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        eng = IOEngine("initiator")
        eng.create_backend(BackendType.SHM)
        wait_for_path(tmp_path / "mem", target, what="target did not start")
        time.sleep(0.05)
        eng.register_remote_engine(EngineDesc.unpack((tmp_path / "engine").read_bytes()))
        remote = MemoryDesc.unpack((tmp_path / "mem").read_bytes())
        buf = np.zeros(remote.size, np.uint8)
        mem = eng.register_array(buf)
        assert eng.backend_for(mem, remote)[0] == "SHM"
        n = 4096
        blk = remote.size // n
        offs = [i * blk for i in range(n)]
        # A CMA copy with a cached grant runs on the submitting thread: batches are
        # submitted from a thread until one fails, and the target is killed meanwhile.
        statuses = []

        def submit():
            until = time.monotonic() + 20
            while time.monotonic() < until:
                s = eng.batch_read(mem, offs, remote, offs, [blk] * n, eng.allocate_transfer_uid())
                statuses.append(s)
                if s.WaitFor(10000) == StatusCode.IN_PROGRESS or s.Failed():
                    return

        submitter = threading.Thread(target=submit)
        submitter.start()
        while len(statuses) < 3 and submitter.is_alive():
            time.sleep(0.001)
        os.kill(target.pid, signal.SIGKILL)
        submitter.join(30)
        assert not submitter.is_alive(), "the submitter hung after the peer died"
        for s in statuses:
            assert s.WaitFor(10000) != StatusCode.IN_PROGRESS, "a transfer hung after its peer died"
        failed = [s for s in statuses if s.Failed()]
        assert failed, "no transfer failed although the peer was killed"
        assert all(
            s.Detail() in (StatusDetail.ERR_PEER_LOST, StatusDetail.ERR_TRANSPORT) for s in failed
        )
        s = eng.read(mem, 0, remote, 0, 16, eng.allocate_transfer_uid())
        assert s.Failed() and s.Detail() == StatusDetail.ERR_PEER_LOST
        assert eng._engine.ledger_stats()["live"] == 0
    finally:
        target.kill()
        target.wait(10)


def test_shared_host_memory_is_mapped_copied_and_revoked(engine_pair):
    from mori.io import allocate_shared_host_memory

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    a, b = engine_pair(BackendType.TCP, BackendType.SHM)
    block = allocate_shared_host_memory(1 << 20)
    region = block[100 : 100 + 65536]  # a region inside the block, at an odd offset
    mb = b.register_array(region)  # a SharedHostBuffer slice: the same memory
    block, region = np.asarray(block), np.asarray(region)  # zero-copy views to check with
    local = rng.integers(0, 256, 65536, dtype=np.uint8)
    ma = a.register_array(local)
    assert a._engine.shm_mapping_state("b", mb.id) == -1
    uid = a.allocate_transfer_uid()
    st = a.write(ma, 0, mb, 0, 65536, uid)
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert a._engine.shm_mapping_state("b", mb.id) == 1  # mapped: memcpy, no CMA
    assert np.array_equal(region, local)
    assert not block[:100].any() and not block[100 + 65536 :].any()
    deadline = time.monotonic() + 10
    while (inbound := b.pop_inbound_transfer_status("a", uid)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert inbound.Succeeded()
    local[:] = 0
    st = a.read(ma, 7, mb, 9, 1000, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(local[7:1007], region[9:1009])
    # A region outside shared memory is copied with CMA (and remembered as such).
    plain = np.zeros(4096, np.uint8)
    mp = b.register_array(plain)
    st = a.write(ma, 0, mp, 0, 4096, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert a._engine.shm_mapping_state("b", mp.id) == 0
    # Deregistration revokes a's mapping (a confirms at once: nothing in flight).
    b.deregister_memory(mb)
    assert a._engine.shm_mapping_state("b", mb.id) == -1
    st = a.read(ma, 0, mb, 0, 16, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Code() == StatusCode.ERR_NOT_FOUND, (
        st.Message()
    )


def test_cma_grant_is_cached_and_revoked_on_deregistration(engine_pair):
    """A region outside shared memory is granted to the initiator once (its absolute
    range, checked by the target); later writes and reads are the initiator's own
    process_vm_writev/readv, each write announced (the target pops it). Deregistering
    the region revokes the grant: afterwards a write is refused and lands no byte."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    a, b = engine_pair(BackendType.TCP, BackendType.SHM)
    dst = np.zeros(3 * 4096 + 11, np.uint8)
    mb = b.register_array(dst)
    src = rng.integers(0, 256, dst.size, dtype=np.uint8)
    ma = a.register_array(src)
    assert a._engine.shm_cma_grant_state("b", mb.id) == 0
    image = np.zeros_like(dst)
    for _ in range(8):
        n = int(rng.integers(1, 4096))
        lo, ro = int(rng.integers(0, src.size - n)), int(rng.integers(0, dst.size - n))
        uid = a.allocate_transfer_uid()
        st = a.write(ma, lo, mb, ro, n, uid)
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        image[ro : ro + n] = src[lo : lo + n]
        assert np.array_equal(dst, image)
        # Announced before the write's status completed: the target finds it now.
        inbound = b.pop_inbound_transfer_status("a", uid)
        assert inbound is not None and inbound.Succeeded()
        assert a._engine.shm_cma_grant_state("b", mb.id) == 1
    assert a._engine.shm_liveness("b") == "word"
    back = np.zeros_like(src)
    mback = a.register_array(back)
    st = a.read(mback, 5, mb, 9, 5000, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(back[5:5005], dst[9:5009])
    b.deregister_memory(mb)  # a lets go at once: no copy in flight
    assert a._engine.shm_cma_grant_state("b", mb.id) == 0
    before = dst.copy()
    for op in (a.write, a.read):
        st = op(ma, 0, mb, 0, 4096, a.allocate_transfer_uid())
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Failed()
        assert st.Code() == StatusCode.ERR_NOT_FOUND, st.Message()
    assert np.array_equal(dst, before), "a write landed in a deregistered region"


@pytest.mark.parametrize("split", ["default", "64K", "off"])
@pytest.mark.parametrize("mode", ["cma", "mapped"])
def test_large_transfers_are_copied_whole_in_shares(monkeypatch, engine_pair, mode, split):
    """A transfer of at least MORI_IO_SHM_SPLIT_BYTES (default 2 MiB) is cut into shares
    (a span may be cut) copied at once by the submitting thread and reactors, with CMA
    (numpy memory) or memcpy (shared host memory): every byte lands once, in its place,
    for one big span and for a batch of uneven spans, writes and reads; a write is
    announced once; small transfers and MORI_IO_SHM_SPLIT_BYTES=0 copy on one thread."""
    from mori.io import TcpBackendConfig, allocate_shared_host_memory

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    threshold = {"default": 2 << 20, "64K": 65536, "off": 0}[split]
    if split != "default":
        monkeypatch.setenv("MORI_IO_SHM_SPLIT_BYTES", str(threshold))
    configs = {BackendType.TCP: TcpBackendConfig(num_worker_threads=4)}
    a, b = engine_pair(BackendType.TCP, BackendType.SHM, configs=configs)
    assert a._engine.hot_path_options["shm_split_bytes"] == threshold
    size = 20 << 20
    block = allocate_shared_host_memory(size) if mode == "mapped" else np.zeros(size, np.uint8)
    mb = b.register_array(block)
    dst = np.asarray(block)  # a zero-copy view
    src = rng.integers(0, 256, size, dtype=np.uint8)
    ma = a.register_array(src)
    copy = "mapped memcpy" if mode == "mapped" else "CMA"
    assert copy in a.backend_for(ma, mb)[1]
    # Several threads can copy only where the process may run on several CPUs.
    can_split = threshold > 0 and len(os.sched_getaffinity(0)) > 1
    splits = a._engine.shm_split_copies
    st = a.write(ma, 0, mb, 0, 4096, a.allocate_transfer_uid())  # below any threshold
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert a._engine.shm_split_copies == splits
    dst[:4096] = 0
    uid = a.allocate_transfer_uid()
    st = a.write(ma, 3, mb, 5, (9 << 20) + 7, uid)  # one span, cut where shares end
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert a._engine.shm_split_copies == splits + can_split
    expect = np.zeros_like(dst)
    expect[5 : 5 + (9 << 20) + 7] = src[3 : 3 + (9 << 20) + 7]
    assert np.array_equal(dst, expect)
    inbound = b.pop_inbound_transfer_status("a", uid)
    assert inbound is not None and inbound.Succeeded()
    assert b.pop_inbound_transfer_status("a", uid) is None  # announced once
    # A batch of 40 uneven, disjoint spans totalling ~12 MiB at random places.
    cuts = np.sort(rng.choice(np.arange(1, 40), 39, replace=False))
    sizes = np.diff(np.concatenate(([0], cuts, [40]))) * int(rng.integers(300_000, 320_000))
    order = rng.permutation(len(sizes))
    offs, pos = [0] * len(sizes), 0
    for i in order:
        offs[i] = pos
        pos += int(sizes[i])
    assert pos <= size and pos >= 8 << 20
    dst[:] = 0
    sess = a.create_session(ma, mb)
    st = sess.batch_write(offs, offs, [int(x) for x in sizes], a.allocate_transfer_uid())
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(dst[:pos], src[:pos]) and not dst[pos:].any()
    back = np.zeros_like(src)
    mback = a.register_array(back)
    st = a.read(mback, 0, mb, 0, pos, a.allocate_transfer_uid())
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(back[:pos], src[:pos]) and not back[pos:].any()
    assert a._engine.shm_split_copies == splits + 3 * can_split
    assert a._engine.ledger_stats()["live"] == 0


def test_backend_reason_names_the_copy_that_moves_the_bytes(monkeypatch, engine_pair):
    """backend_for / session.backend() say "mapped memcpy" for a target region in shared
    host memory and "CMA" (with why) for any other, before any transfer ran."""
    from mori.io import allocate_shared_host_memory

    a, b = engine_pair(BackendType.TCP, BackendType.SHM)
    shared = b.register_array(allocate_shared_host_memory(1 << 16)[64:4160])
    plain = b.register_array(np.zeros(4096, np.uint8))
    ma = a.register_array(np.zeros(4096, np.uint8))
    name, why = a.backend_for(ma, shared)
    assert name == "SHM" and why.startswith("SHM: mapped memcpy (the target region lies in"), why
    assert a.create_session(ma, shared).backend() == (name, why)
    name, why = a.backend_for(ma, plain)
    assert name == "SHM" and why == (
        "SHM: CMA process_vm_readv/writev (same host, host memory on both sides; the target "
        "region is not in shared host memory (allocate_shared_host_memory))"
    ), why
    assert a.create_session(ma, plain).backend() == (name, why)
    # The reasons match what transfers then do: 1 mapped (memcpy), 0 CMA.
    assert a._engine.shm_mapping_state("b", shared.id) == 1
    assert a._engine.shm_mapping_state("b", plain.id) == 0
    for mem in (shared, plain):
        st = a.write(ma, 0, mem, 0, 4096, a.allocate_transfer_uid())
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    # With mapping switched off, the shared region goes through CMA too, and says so.
    monkeypatch.setenv("MORI_IO_SHM_MAP", "0")
    c, d = engine_pair(BackendType.TCP, BackendType.SHM)
    shared_d = d.register_array(allocate_shared_host_memory(4096))
    mc_ = c.register_array(np.zeros(4096, np.uint8))
    name, why = c.backend_for(mc_, shared_d)
    assert (
        name == "SHM"
        and why.startswith("SHM: CMA process_vm_readv/writev")
        and ("MORI_IO_SHM_MAP=0" in why)
    ), why


@pytest.mark.io_testing
def test_notice_ring_many_producers_one_consumer():
    """Every record pushed by 4 threads through a 64-slot ring arrives exactly once and
    in its producer's order, with the ring full (and refusing) many times on the way."""
    r = T.notice_ring_stress(64, 4, 20000)
    assert r["received"] == 80000 and r["malformed"] == 0 and r["out_of_order"] == 0, r
    assert r["full_refusals"] > 0, r  # the full-ring path was exercised


@pytest.mark.io_testing
def test_notice_ring_boundary():
    # 8 slots take 8 records and refuse the rest until drained; then 8 again.
    assert T.notice_ring_fill(8, 20) == (8, 8, 8)
    assert T.notice_ring_fill(2, 2) == (2, 2, 2)
    for bad in (0, 1, 3, 12, 1 << 21):
        with pytest.raises(mc.InvalidArgumentError, match=f"capacity {bad} must be a power of two"):
            T.notice_ring_fill(bad, 1)


@pytest.mark.parametrize("ring", ["on", "off", "two-slots"])
def test_write_announcements_through_the_notice_ring(monkeypatch, ring, engine_pair):
    """Same-host writes into shared host memory are announced through the target's
    notice ring (no message); with the ring off, or full, over TCP. Either way every
    write's inbound status reaches the target once."""
    from mori.io import allocate_shared_host_memory

    if ring == "off":
        monkeypatch.setenv("MORI_IO_NOTICE_RING", "0")
    if ring == "two-slots":
        monkeypatch.setenv("MORI_IO_NOTICE_RING_SLOTS", "2")  # 2 in the ring, then TCP
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    a, b = engine_pair(BackendType.TCP, BackendType.SHM)
    block = allocate_shared_host_memory(64 << 10)
    mb = b.register_array(block)
    block = np.asarray(block)
    local = rng.integers(0, 256, 64 << 10, dtype=np.uint8)
    ma = a.register_array(local)
    assert a._engine.notice_ring_state("b") == (-1 if ring == "off" else 0)  # 0: not asked yet
    uids = []
    for i in range(40):
        uid = a.allocate_transfer_uid()
        st = a.write(ma, i * 1024, mb, i * 1024, 1024, uid)
        assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        uids.append(uid)
    assert np.array_equal(block[: 40 * 1024], local[: 40 * 1024])
    assert a._engine.notice_ring_state("b") == (-1 if ring == "off" else 1)
    assert b._engine.notice_rings_granted == (0 if ring == "off" else 1)
    deadline = time.monotonic() + 10
    for i, uid in enumerate(uids):
        st = b.pop_inbound_transfer_status("a", uid)
        if ring == "on" or (ring == "two-slots" and i < 2):
            # Through the ring the announcement precedes the write's completion: the
            # target finds it at once.
            assert st is not None, f"uid {uid} not in the ring when its write completed"
        while st is None:  # a TCP announcement arrives shortly after
            assert time.monotonic() < deadline, f"no inbound status for uid {uid}"
            time.sleep(0.002)
            st = b.pop_inbound_transfer_status("a", uid)
        assert st.Succeeded()
        assert b.pop_inbound_transfer_status("a", uid) is None  # once
    # Reads are not announced.
    st = a.read(ma, 0, mb, 0, 1024, a.allocate_transfer_uid())
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS and st.Succeeded()
    assert b._engine.inbound_stats()["held"] == 0
