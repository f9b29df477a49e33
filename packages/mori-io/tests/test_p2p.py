# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The P2P backend (same host, GPU memory, CUDA IPC).

On every machine: the export's wire form (round trip, every truncation and malformed
field refused), the per-pair choice, the target's side of the P2P messages spoken by
hand, and clear errors where CUDA is missing. On a GPU machine: transfers between two
engines of one process and of two processes (cudaMalloc memory through legacy IPC and
expandable-segment memory through POSIX fds), compared bit for bit."""

import dataclasses
import os
import random
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mori.core as mc
from mori.core.testing import visible_gpus
from mori.io import (
    _C,
    BackendType,
    IOEngine,
    MemoryDesc,
    MemoryLocationType,
    StatusCode,
    StatusDetail,
)

WORKER = str(Path(__file__).with_name("p2p_peer_worker.py"))
CPU, GPU = MemoryLocationType.CPU, MemoryLocationType.GPU
HOST = "h/boot/pidns:1"
HDR = struct.Struct("<BBHIQQQQQ")  # wire::Header
VERSION = _C.wire_version
T = getattr(_C, "_testing", None)  # test builds only; conftest skips io_testing tests without


needs_gpu = pytest.mark.skipif(visible_gpus() == 0, reason="needs a CUDA GPU")


def _random_export(rng):
    kind = rng.choice([1, 2])
    map_size = rng.randrange(1, 1 << 40)
    size = rng.randrange(0, map_size + 1)
    off = rng.randrange(0, map_size - size + 1)
    pieces = []
    if kind == 2:
        cuts = sorted(rng.sample(range(1, map_size), min(rng.randrange(0, 6), map_size - 1)))
        edges = [0, *cuts, map_size]
        pieces = [
            (rng.randrange(0, 1 << 20), a, b - a) for a, b in zip(edges, edges[1:], strict=False)
        ]
    return dict(kind=kind, pid=rng.randrange(1, 1 << 22), uuid=rng.randbytes(16),
                region_addr=rng.randrange(0, 1 << 48), region_size=size, region_offset=off,
                map_size=map_size, handle=rng.randbytes(64) if kind == 1 else bytes(64),
                pieces=pieces)  # fmt: skip


@pytest.mark.io_testing
def test_export_round_trips_and_malformed_exports_are_refused():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(200):
        e = _random_export(rng)
        packed = T.pack_p2p_export(**e)
        assert T.unpack_p2p_export(packed) == e
        for cut in range(len(packed)):  # every truncation
            with pytest.raises(mc.InvalidArgumentError, match="P2P export: truncated"):
                T.unpack_p2p_export(packed[:cut])
        with pytest.raises(mc.InvalidArgumentError, match="trailing"):
            T.unpack_p2p_export(packed + b"\0")
    e = _random_export(random.Random(1))
    packed = bytearray(T.pack_p2p_export(**e))
    with pytest.raises(mc.InvalidArgumentError, match="bad magic"):
        T.unpack_p2p_export(b"XXXX" + bytes(packed[4:]))
    with pytest.raises(mc.InvalidArgumentError, match="format 9"):
        T.unpack_p2p_export(bytes(packed[:4]) + b"\x09\x00" + bytes(packed[6:]))
    with pytest.raises(mc.InvalidArgumentError, match="unknown kind 7"):
        T.unpack_p2p_export(bytes(packed[:6]) + b"\x07" + bytes(packed[7:]))
    bad = dict(e, region_size=e["map_size"], region_offset=1)
    with pytest.raises(mc.InvalidArgumentError, match="outside its mapping"):
        T.unpack_p2p_export(T.pack_p2p_export(**bad))
    fd = dict(kind=2, pid=1, uuid=bytes(16), region_addr=0, region_size=10, region_offset=0,
              map_size=100, handle=bytes(64))  # fmt: skip
    with pytest.raises(mc.InvalidArgumentError, match="does not follow"):
        T.unpack_p2p_export(T.pack_p2p_export(**fd, pieces=[(3, 0, 40), (4, 50, 50)]))
    with pytest.raises(mc.InvalidArgumentError, match="cover 40 bytes of a mapping of 100"):
        T.unpack_p2p_export(T.pack_p2p_export(**fd, pieces=[(3, 0, 40)]))
    with pytest.raises(mc.InvalidArgumentError, match="0 pieces"):
        T.unpack_p2p_export(T.pack_p2p_export(**fd, pieces=[]))


@pytest.mark.io_testing
def test_choice_sends_gpu_pairs_of_one_host_to_p2p():
    def choose(**kw):
        args = dict(local_host_id=HOST, remote_host_id=HOST, local_loc=GPU, remote_loc=GPU,
                    local_shm=True, remote_shm=True, local_p2p=True, remote_p2p=True)  # fmt: skip
        args.update(kw)
        return T.choose_backend(**args)

    assert choose() == ("P2P", "same host, GPU memory on both sides (CUDA IPC)")
    assert choose(override="shm")[0] == "P2P"  # SHM's override concerns host memory
    assert choose(override="tcp")[0] == "TCP"
    assert "this engine has no P2P" in choose(local_p2p=False)[1]
    assert "remote engine has no P2P" in choose(remote_p2p=False)[1]
    assert "different hosts" in choose(remote_host_id="x/y/pidns:2")[1]
    assert "one side only" in choose(remote_loc=CPU)[1]
    assert "one side only" in choose(local_loc=CPU)[1]
    assert choose(local_loc=CPU, remote_loc=CPU)[0] == "SHM"


@pytest.mark.skipif(visible_gpus() > 0, reason="checks the refusal where no GPU is usable")
def test_p2p_backend_without_a_gpu_is_a_clear_error():
    reason = _C.Engine.p2p_unavailable()
    assert reason
    eng = IOEngine("nogpu")
    with pytest.raises(mc.NotSupportedError, match="P2P backend: "):
        eng.create_backend(BackendType.P2P)
    with pytest.raises(mc.NotSupportedError):
        eng.create_backend(BackendType.XGMI)  # MORI's name, the same backend
    assert "P2P" not in eng.get_engine_desc().backends
    eng.close()


@pytest.mark.skipif(
    visible_gpus() > 0, reason="checks the refusals where GPU memory cannot be staged"
)
def test_gpu_memory_over_tcp_without_cuda_is_refused_before_any_byte_moves(engine_pair):
    a, b = engine_pair(BackendType.TCP, mutual=False)
    with pytest.raises(mc.InvalidArgumentError, match="needs its device id"):
        a.register_memory(0x1000, 64, -1, GPU)
    host = np.zeros(64, np.uint8)
    local = a.register_array(host)
    # "GPU" regions at addresses nothing may touch: every transfer must be refused
    # before a byte moves (the target cannot stage; the initiator cannot either).
    remote = b.register_memory(0x7F0000000000, 64, 0, GPU)
    st = a.write(local, 0, remote, 0, 64, a.allocate_transfer_uid())
    assert (
        st.WaitFor(5000) != StatusCode.IN_PROGRESS and st.Code() == StatusCode.ERR_INVALID_ARGS
    ), st.Message()
    assert "GPU memory, which this path cannot move" in st.Message()
    st = a.read(local, 0, remote, 0, 64, a.allocate_transfer_uid())
    assert (
        st.WaitFor(5000) != StatusCode.IN_PROGRESS and st.Code() == StatusCode.ERR_INVALID_ARGS
    ), st.Message()
    fake_gpu = a.register_memory(0x7E0000000000, 64, 0, GPU)
    st = a.write(fake_gpu, 0, b.register_array(np.zeros(64, np.uint8)), 0, 64,
                 a.allocate_transfer_uid())  # fmt: skip
    assert st.Failed() and st.Code() == StatusCode.ERR_INVALID_ARGS
    assert "needs staging" in st.Message() and "one side only" in st.Message()


def _raw(target, key=b"raw"):
    """A raw initiator that was given the target's EngineDesc (its secret)."""
    s = socket.create_connection(("127.0.0.1", target._engine.port), timeout=5)
    secret = target._engine.secret
    s.sendall(HDR.pack(1, 0, VERSION, 0, 0, 0, 0, len(secret) + len(key), 0) + secret + key)
    return s


def _recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


def _inbound(engine, key, uid, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while (st := engine.pop_inbound_transfer_status(key, uid)) is None:
        assert time.monotonic() < deadline, f"no inbound status for {key!r} uid {uid}"
        time.sleep(0.005)
    return st


def _cma_grant(s, mem):
    """Takes a CMA grant of `mem` on raw connection `s` (kShmCmaReq / kShmCmaGrant): an
    initiator's announcements count only for regions it holds a grant of."""
    s.sendall(HDR.pack(29, 0, VERSION, 0, 0, mem.id, 0, 0, mem.capability))
    grant = HDR.unpack(_recv_exact(s, HDR.size))
    assert grant[0] == 30 and grant[1] == 0, grant
    _recv_exact(s, grant[7])


def test_target_side_of_the_p2p_messages():
    target = IOEngine("target")
    target.create_backend(BackendType.TCP)
    target.create_backend(BackendType.SHM)  # for the CMA grants the announcements need
    mem = target.register_array(np.zeros(4096, np.uint8))
    s = _raw(target)
    try:
        # An open request to an engine without P2P: refused with kNoP2p, no payload.
        s.sendall(HDR.pack(13, 0, VERSION, 0, 0, mem.id, 0, 0, mem.capability))
        t, status, _, _, _, mid, _, length, _ = HDR.unpack(_recv_exact(s, HDR.size))
        assert (t, status, mid, length) == (14, 6, mem.id, 0)
        # A write announcement for a region it holds no grant of: refused, counted.
        refused = target._engine.announcements_refused
        s.sendall(HDR.pack(15, 0, VERSION, 1, 76, mem.id, 0, 4096, 0))
        _cma_grant(s, mem)
        assert target._engine.announcements_refused == refused + 1
        assert target.pop_inbound_transfer_status("raw", 76) is None
        # With a grant, a completed write's announcement: recorded, not answered.
        s.sendall(HDR.pack(15, 0, VERSION, 1, 77, mem.id, 0, 4096, mem.capability))
        assert _inbound(target, "raw", 77).Succeeded()
        s.settimeout(0.2)
        with pytest.raises(TimeoutError):
            s.recv(1)
        s.settimeout(None)
        # More open requests on one connection than a mapping needs: the connection is
        # closed as a protocol violation; the engine keeps serving others.
        for _ in range(17):
            try:
                s.sendall(HDR.pack(13, 0, VERSION, 0, 0, mem.id, 0, 0, mem.capability))
            except (BrokenPipeError, ConnectionResetError):
                break  # closed already, while the rest was still being sent
        s.settimeout(5)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                # The engine closed with some of the 17 requests still unread in its
                # socket buffer, so the kernel answered with a reset instead of a FIN:
                # closed all the same (whatever it had sent before may be lost with it).
                break
            if not chunk:
                break
            got += chunk
        # (answers of the read pass that saw the violation are dropped with it)
        assert len(got) % HDR.size == 0 and len(got) <= 16 * HDR.size
    finally:
        s.close()
    s2 = _raw(target, b"raw2")
    _cma_grant(s2, mem)
    s2.sendall(HDR.pack(15, 0, VERSION, 1, 5, mem.id, 0, 1, mem.capability))
    assert _inbound(target, "raw2", 5).Succeeded()
    s2.close()
    target.close()


# -- on a GPU ---------------------------------------------------------------------------


@needs_gpu
def test_two_engines_of_one_process_bit_exact(engine_pair):
    import torch

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cuda", 0)
    a, b = engine_pair(BackendType.TCP, BackendType.P2P)
    size = 8 << 20
    # Sub-regions of larger allocations, as torch's caching allocator hands out.
    big_a = torch.zeros(size + 8192, dtype=torch.uint8, device=dev)
    big_b = torch.randint(0, 256, (size + 8192,), dtype=torch.uint8, generator=g).to(dev)
    la, rb = big_a[4096 : 4096 + size], big_b[1000 : 1000 + size]
    ma, mb = a.register_torch_tensor(la), b.register_torch_tensor(rb)
    assert a.backend_for(ma, mb)[0] == "P2P"
    assert a._engine.p2p_mapping_kind("b", mb.id) == -1  # mapped on first use
    st = a.read(ma, 0, mb, 0, size, a.allocate_transfer_uid())
    assert st.WaitFor(20000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    torch.cuda.synchronize()
    assert torch.equal(la, rb)
    assert a._engine.p2p_mapping_kind("b", mb.id) == 0  # same process: used directly
    # A batch of unaligned blocks (the kernel path), then single copies (copy engines).
    src = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev)
    la.copy_(src)
    n = 150  # blocks in distinct 40000-byte slots of the remote region (209 slots)
    sizes = [rng.randrange(1, 40000) for _ in range(n)]
    slots = rng.sample(range(size // 40000), n)
    loffs = [rng.randrange(0, size - 40000) for _ in range(n)]
    roffs = [
        s * 40000 + rng.randrange(0, 40000 - sz + 1) for s, sz in zip(slots, sizes, strict=True)
    ]
    uid = a.allocate_transfer_uid()
    st = a.batch_write(ma, loffs, mb, roffs, sizes, uid)
    assert st.WaitFor(20000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    expect = big_b.clone()
    exp = expect[1000 : 1000 + size]
    for lo, ro, sz in zip(loffs, roffs, sizes, strict=True):
        exp[ro : ro + sz] = src[lo : lo + sz]
    torch.cuda.synchronize()
    assert torch.equal(big_b, expect)  # also: nothing outside the region moved
    for _ in range(200):  # announcements arrive after the data
        inbound = b.pop_inbound_transfer_status("a", uid)
        if inbound is not None:
            break
        time.sleep(0.01)
    assert inbound is not None and inbound.Succeeded()
    # A forged descriptor larger than the target registered: refused by size, no copy.
    forged = dataclasses.replace(mb, size=size * 2)
    st = a.write(ma, 0, forged, size, 16, a.allocate_transfer_uid())
    assert st.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS and f"({size} bytes)" in st.Message()
    unknown = MemoryDesc("b", 9999, 0, mb.data, size, GPU)
    st = a.read(ma, 0, unknown, 0, 16, a.allocate_transfer_uid())
    assert st.Failed() and st.Code() == StatusCode.ERR_NOT_FOUND, st.Message()
    # Deregistration revokes a's mapping (a confirms once unmapped); a's next transfer
    # asks again and is refused.
    b.deregister_memory(mb)
    assert a._engine.p2p_mapping_kind("b", mb.id) == -1
    st = a.read(ma, 0, mb, 0, 16, a.allocate_transfer_uid())
    assert st.Failed() and st.Code() == StatusCode.ERR_NOT_FOUND, st.Message()
    a.close()
    b.close()


def test_ipc_handle_of_memory_without_a_cuda_allocation_is_empty():
    buf = np.zeros(4096, dtype=np.uint8)
    assert _C.cuda_ipc_handle(buf.ctypes.data, 0) == b""
    assert _C.cuda_ipc_handle(0, 0) == b""
    assert _C.cuda_ipc_handle(buf.ctypes.data, -1) == b""


@needs_gpu
def test_memory_desc_carries_the_cuda_ipc_handle_where_p2p_exists(engine_pair):
    """MORI's MemoryDesc.ipc_handle: the allocation's cudaIpcMemHandle_t for GPU memory
    registered by an engine with a P2P (XGMI) backend, the same bytes torch shares the
    storage with; zeros without P2P and for host memory; kept by pack/unpack."""
    import torch

    a, b = engine_pair(BackendType.TCP, BackendType.P2P)
    c = IOEngine("c")
    c.create_backend(BackendType.TCP)
    try:
        big = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
        part = big[4096:8192]
        torch_handle = big.untyped_storage()._share_cuda_()[1]
        ma, mpart = a.register_torch_tensor(big), a.register_torch_tensor(part)
        assert len(ma.ipc_handle) == 64 and any(ma.ipc_handle)
        # torch's shared handle wraps the same 64 bytes (newer versions add a header).
        assert ma.ipc_handle in torch_handle, (ma.ipc_handle, torch_handle)
        assert mpart.ipc_handle == ma.ipc_handle  # one allocation, one handle
        assert MemoryDesc.unpack(ma.pack()).ipc_handle == ma.ipc_handle
        other = torch.zeros(3 << 20, dtype=torch.uint8, device="cuda")
        assert a.register_torch_tensor(other).ipc_handle != ma.ipc_handle
        assert c.register_torch_tensor(big).ipc_handle == bytes(64)  # no P2P backend
        assert a.register_torch_tensor(torch.zeros(64)).ipc_handle == bytes(64)  # host
    finally:
        c.close()


@needs_gpu
def test_single_spans_bit_exact_at_any_alignment(engine_pair):
    """Single reads and writes (one copy-engine copy each) of random sizes at offsets of
    equal and of different alignment: every byte lands, nothing outside the span moves."""
    import torch

    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cuda", 0)
    a, b = engine_pair(BackendType.TCP, BackendType.P2P)
    size = 6 << 20
    la = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev)
    rb = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev)
    ma, mb = a.register_torch_tensor(la), b.register_torch_tensor(rb)
    for i in range(60):
        n = rng.choice([1, 15, 16, 17, rng.randrange(1, 1 << 16), rng.randrange(1, 5 << 20)])
        lo = rng.randrange(0, size - n + 1)
        ro = rng.randrange(0, size - n + 1)
        if i % 2 == 0:  # same alignment modulo 16
            ro -= (ro - lo) % 16
            ro += 16 if ro < 0 else 0  # n <= 5 MiB < size - 16: still inside
        write = rng.random() < 0.5
        src, dst = (la, rb) if write else (rb, la)
        so, do = (lo, ro) if write else (ro, lo)
        expect = dst.clone()
        expect[do : do + n] = src[so : so + n]
        f = a.write if write else a.read
        st = f(ma, lo, mb, ro, n, a.allocate_transfer_uid())
        assert st.WaitFor(20000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
        torch.cuda.synchronize()
        assert torch.equal(dst, expect), (i, n, lo, ro, write)
        dst.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev))
        # The engine's copies do not wait for torch's stream: the refill must have landed
        # before the next transfer touches dst (else it overwrites what that one moved).
        torch.cuda.synchronize()
    a.close()
    b.close()


@needs_gpu
@pytest.mark.parametrize("alloc", ["default", "expandable"])
def test_two_processes_bit_exact(tmp_path, alloc):
    seed = random.randrange(1 << 30)
    print("seed", seed, "allocator", alloc)
    env = dict(os.environ)
    if alloc == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, role, str(tmp_path), str(seed)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for role in ("target", "initiator")
    ]
    # A worker that fails ends the pair: its partner would otherwise wait for files.
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline or any(p.returncode not in (None, 0) for p in procs):
            for q in procs:
                q.kill()
            break
        time.sleep(0.05)
    outs = [p.communicate()[0] for p in procs]
    for out in outs:
        print(out)
    assert all(p.returncode == 0 for p in procs), outs
    assert "target verified" in outs[0]
    assert "initiator verified" in outs[1]
    if alloc == "expandable":
        assert "export kind 2" in outs[1]
    else:
        assert "export kind 1" in outs[1]


@needs_gpu
def test_gpu_memory_over_tcp_is_staged_bit_exact(engine_pair):
    import torch

    seed = random.randrange(1 << 30)
    print("seed", seed)
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cuda", 0)
    a, b = engine_pair(
        BackendType.TCP, mutual=False
    )  # no P2P: GPU memory goes over TCP through pinned staging buffers
    size = (9 << 20) + 123  # several 4 MiB staged parts and a ragged tail
    ga = torch.zeros(size, dtype=torch.uint8, device=dev)
    gb = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev)
    host = np.zeros(size, np.uint8)
    ma, mb, mh = a.register_torch_tensor(ga), b.register_torch_tensor(gb), a.register_array(host)
    assert a.backend_for(ma, mb)[0] == "TCP"
    torch.cuda.synchronize()
    st = a.read(ma, 0, mb, 0, size, a.allocate_transfer_uid())  # GPU <- GPU
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert torch.equal(ga, gb)
    st = a.read(mh, 0, mb, 0, size, a.allocate_transfer_uid())  # host <- GPU
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(host, gb.cpu().numpy())
    new = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev)
    ga.copy_(new)
    torch.cuda.synchronize()
    st = a.write(ma, 5, mb, 7, size - 7, a.allocate_transfer_uid())  # GPU -> GPU, unaligned
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    expect = gb.clone()
    expect[7:] = new[5 : size - 2]
    assert torch.equal(gb, expect)
    host[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)
    st = a.write(mh, 0, mb, 0, 4096, a.allocate_transfer_uid())  # host -> GPU
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    assert np.array_equal(gb[:4096].cpu().numpy(), host[:4096])


@needs_gpu
def test_staged_copies_do_not_wait_for_the_applications_kernels(engine_pair):
    """A TCP transfer out of and into GPU memory finishes while a kernel that the
    application queued on the default stream still runs: the staging copies use a
    non-blocking stream of their own. On the legacy default stream (plain cudaMemcpy)
    they waited for that kernel, and a kernel waiting for the transfer's sender (an
    inter-node EP call) deadlocked against it."""
    import torch

    seed = random.randrange(1 << 30)
    print("seed", seed)
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cuda", 0)
    a, b = engine_pair(BackendType.TCP, mutual=False)  # no P2P: staged through host memory
    size = (5 << 20) + 17  # two staged parts and a ragged tail
    ga = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev)
    gb = torch.zeros(size, dtype=torch.uint8, device=dev)
    ma, mb = a.register_torch_tensor(ga), b.register_torch_tensor(gb)
    torch.cuda.synchronize()
    st = a.write(ma, 0, mb, 0, size, a.allocate_transfer_uid())  # staging buffers exist
    assert st.WaitFor(30000) != StatusCode.IN_PROGRESS and st.Succeeded(), st.Message()
    ga.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).to(dev))
    torch.cuda.synchronize()

    stream = torch.cuda.current_stream()
    assert stream.cuda_stream == 0, "the kernel must run on the legacy default stream"
    torch.cuda._sleep(10_000_000_000)  # ~5 s of spinning at the H200's clock
    t0 = time.monotonic()
    st = a.write(ma, 0, mb, 0, size, a.allocate_transfer_uid())  # GPU -> host -> GPU
    code = st.WaitFor(3000)
    took, kernel_running = time.monotonic() - t0, not stream.query()
    torch.cuda.synchronize()
    assert code != StatusCode.IN_PROGRESS, (
        "the staged transfer waited for the application's kernel on the default stream"
    )
    assert st.Succeeded(), st.Message()
    assert kernel_running, f"the kernel ended before the transfer ({took:.2f} s): lengthen it"
    assert torch.equal(gb, ga)
