# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""The RDMA backend wired into IOEngine.

Without a NIC the real backend refuses with its reason; the engine's wiring (the
per-pair choice, the connect handshake and region keys over the control path,
submission and completion, notifications -> inbound statuses, bounds against the
target's key, deregistration, peer loss) runs end to end over the in-process loopback
test double (MORI_IO_RDMA_LOOPBACK=1, in test builds only), which moves bytes with
memcpy and never talks to a NIC."""

import dataclasses
import random
import time

import numpy as np
import pytest

import mori.core as mc
from mori.io import (
    _C,
    BackendType,
    IOEngine,
    MemoryDesc,
    RdmaBackendConfig,
    StatusCode,
    StatusDetail,
)

CPU = _C.MemoryLocationType.CPU
T = getattr(_C, "_testing", None)  # test builds only; conftest skips io_testing tests without
HOST = "h/boot/pidns:1"


@pytest.mark.io_testing
def test_choice_prefers_same_host_paths_then_rdma_then_tcp():
    def choose(**kw):
        args = dict(local_host_id=HOST, remote_host_id="other/b/pidns:2", local_loc=CPU,
                    remote_loc=CPU, local_shm=True, remote_shm=True, local_rdma=True,
                    remote_rdma=True)  # fmt: skip
        args.update(kw)
        return T.choose_backend(**args)

    name, why = choose()
    assert name == "RDMA" and why.startswith("RDMA: different hosts")
    assert choose(remote_host_id=HOST)[0] == "SHM"  # same host: SHM first
    assert choose(remote_host_id=HOST, local_shm=False)[0] == "RDMA"
    assert choose(remote_rdma=False)[0] == "TCP"
    assert choose(local_rdma=False)[0] == "TCP"
    assert choose(override="tcp")[0] == "TCP"
    name, why = choose(remote_host_id=HOST, override="shm", remote_shm=False)
    assert name == "RDMA" and why.startswith("SHM forced but not usable, RDMA instead")


@pytest.mark.skipif(_C.rdma_probe()[0], reason="checks the refusal where RDMA cannot run")
def test_real_backend_refuses_with_its_reason(monkeypatch):
    monkeypatch.delenv("MORI_IO_RDMA_LOOPBACK", raising=False)
    eng = IOEngine("nonic")
    with pytest.raises(mc.NotSupportedError) as e:
        eng.create_backend(BackendType.RDMA)
    assert str(e.value)
    assert "RDMA" not in eng.get_engine_desc().backends
    with pytest.raises(mc.InvalidArgumentError, match="retry_cnt=9"):
        eng.create_backend(BackendType.RDMA, RdmaBackendConfig(retry_cnt=9))
    eng.close()


@pytest.fixture
def pair(monkeypatch):
    monkeypatch.setenv("MORI_IO_RDMA_LOOPBACK", "1")
    a, b = IOEngine("a"), IOEngine("b")
    for e in (a, b):
        e.create_backend(BackendType.TCP)
        e.create_backend(BackendType.RDMA, RdmaBackendConfig(qp_per_transfer=2))
    a.register_remote_engine(b.get_engine_desc())
    b.register_remote_engine(a.get_engine_desc())
    yield a, b
    a.close()
    b.close()


def _wait(st):
    assert st.WaitFor(10000) != StatusCode.IN_PROGRESS, "transfer did not finish"
    return st


@pytest.mark.io_testing
def test_transfers_over_the_wiring_bit_exact(pair):
    a, b = pair
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    size = 4 << 20
    la = np.zeros(size, np.uint8)
    rb = rng.integers(0, 256, size, dtype=np.uint8)
    ma, mb = a.register_array(la), b.register_array(rb)
    name, why = a.backend_for(ma, mb)
    assert name == "RDMA", why  # same host, but neither engine created SHM
    st = _wait(a.read(ma, 0, mb, 0, size, a.allocate_transfer_uid()))
    assert st.Succeeded(), st.Message()
    assert np.array_equal(la, rb)
    # A batch of random blocks written into random slots, through a session.
    la[:] = rng.integers(0, 256, size, dtype=np.uint8)
    expect = rb.copy()
    slots = rng.permutation(size // 4096)[:300]
    loffs = rng.integers(0, size - 4096, 300)
    sizes = rng.integers(1, 4097, 300)
    roffs = slots * 4096
    for lo, ro, n in zip(loffs, roffs, sizes, strict=True):
        expect[ro : ro + n] = la[lo : lo + n]
    uid = a.allocate_transfer_uid() + (1 << 40)  # beyond the 24 bits of immediate data
    sess = a.create_session(ma, mb)
    st = _wait(sess.batch_write(loffs.astype(np.uint64), roffs.astype(np.uint64),
                                sizes.astype(np.uint64), uid))  # fmt: skip
    assert st.Succeeded(), st.Message()
    assert np.array_equal(rb, expect)
    # The initiator's completion and the target's notification are not ordered (as on
    # a NIC): wait for the notification, bounded.
    deadline = time.monotonic() + 10
    while (inbound := b.pop_inbound_transfer_status("a", uid)) is None:
        assert time.monotonic() < deadline, "no inbound status within 10 s"
        time.sleep(0.005)
    assert inbound.Succeeded()
    # Bounds come from the target's key, not the caller's descriptor.
    forged = dataclasses.replace(mb, size=size * 2)
    st = a.write(ma, 0, forged, size, 16, a.allocate_transfer_uid())
    assert st.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS and f"({size} bytes)" in st.Message()
    st = a.read(ma, 0, MemoryDesc("b", 777, -1, 0, 64, CPU), 0, 64, a.allocate_transfer_uid())
    assert st.Code() == StatusCode.ERR_NOT_FOUND, st.Message()


@pytest.mark.io_testing
def test_gpu_memory_over_the_loopback_bit_exact(pair):
    """GPU memory through the RDMA wiring (a NIC reaches it by GPUDirect; the loopback
    double copies it with cudaMemcpy): GPU to GPU and GPU to host, both directions.
    MORI's own engine tests register GPU tensors on RDMA-only engines."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a, b = pair
    seed = random.randrange(1 << 30)
    print("seed", seed)
    g = torch.Generator().manual_seed(seed)
    size = 1 << 20
    src = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
    ga, gb = torch.zeros(size, dtype=torch.uint8, device="cuda"), src.cuda()
    host = torch.zeros(size, dtype=torch.uint8)
    ma, mb, mh = (
        a.register_torch_tensor(ga),
        b.register_torch_tensor(gb),
        a.register_torch_tensor(host),
    )
    assert a.backend_for(ma, mb)[0] == "RDMA"
    assert _wait(a.read(ma, 0, mb, 0, size, a.allocate_transfer_uid())).Succeeded()
    torch.cuda.synchronize()
    assert torch.equal(ga.cpu(), src)
    assert _wait(a.read(mh, 0, mb, 0, size, a.allocate_transfer_uid())).Succeeded()
    assert torch.equal(host, src)
    host.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g))
    st = _wait(a.write(mh, 4096, mb, 8192, 65536, a.allocate_transfer_uid()))
    assert st.Succeeded(), st.Message()
    want = src.clone()
    want[8192 : 8192 + 65536] = host[4096 : 4096 + 65536]
    torch.cuda.synchronize()
    assert torch.equal(gb.cpu(), want)


@pytest.mark.io_testing
def test_peer_loss_and_reregistration(pair):
    a, b = pair
    la, rb = (
        np.zeros(1 << 16, np.uint8),
        np.arange(1 << 16, dtype=np.uint32).view(np.uint8)[: 1 << 16],
    )
    ma, mb = a.register_array(la), b.register_array(rb)
    assert _wait(a.read(ma, 0, mb, 0, 4096, a.allocate_transfer_uid())).Succeeded()
    a.deregister_remote_engine(b.get_engine_desc())
    st = a.read(ma, 0, mb, 0, 4096, a.allocate_transfer_uid())
    assert st.Failed() and st.Code() == StatusCode.ERR_NOT_FOUND
    a.register_remote_engine(b.get_engine_desc())  # reconnects the QPs from scratch
    la[:] = 0
    st = _wait(a.read(ma, 0, mb, 0, la.size, a.allocate_transfer_uid()))
    assert st.Succeeded(), st.Message()
    assert np.array_equal(la, rb)
    # The target withdraws the region: a cached key no longer works and nothing moves.
    b.deregister_memory(mb)
    la[:] = 0
    st = _wait(a.read(ma, 0, mb, 0, 4096, a.allocate_transfer_uid()))
    assert st.Failed(), st.Message()
    assert not la.any()


@pytest.mark.io_testing
def test_a_stale_key_fails_one_transfer_and_the_peer_recovers(pair):
    a, b = pair
    x, y = np.arange(4096, dtype=np.uint16).view(np.uint8), np.full(8192, 7, np.uint8)
    mx, my = b.register_array(x), b.register_array(y)
    local = np.zeros(8192, np.uint8)
    ml = a.register_array(local)
    assert _wait(a.read(ml, 0, mx, 0, 8192, a.allocate_transfer_uid())).Succeeded()
    b.deregister_memory(mx)  # a still caches x's key
    st = _wait(a.read(ml, 0, mx, 0, 64, a.allocate_transfer_uid()))
    assert st.Failed(), st.Message()
    # The failure took the QPs down; the engine reconnects on the next transfer, which
    # succeeds, and the withdrawn region is now refused by the target's registry.
    st = _wait(a.read(ml, 0, my, 0, 8192, a.allocate_transfer_uid()))
    assert st.Succeeded(), st.Message()
    assert np.array_equal(local, y)
    st = _wait(a.read(ml, 0, mx, 0, 64, a.allocate_transfer_uid()))
    assert st.Code() == StatusCode.ERR_NOT_FOUND, st.Message()
