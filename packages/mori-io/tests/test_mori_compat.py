# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.io as a drop-in for code written against ROCm/mori's mori.io: names, numbers,
positional orders, defaults and return types as MORI has them, checked over TCP."""

import os
import random
import threading
import time

import msgpack
import numpy as np
import pytest

import mori.core
import mori.io
from mori.io import (
    _C,
    BackendType,
    EngineDesc,
    FabricBackendConfig,
    IOEngine,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    PollCqMode,
    RdmaBackendConfig,
    StatusCode,
    StatusDetail,
    TcpBackendConfig,
    TransferStatus,
    XgmiBackendConfig,
    fabric_alloc,
    fabric_free,
    set_log_level,
)


def _rng():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return np.random.default_rng(seed)


@pytest.fixture
def tcp_pair():
    """(a, b): two engines with TCP, registered with each other through packed bytes."""
    a = IOEngine("compat-a", IOEngineConfig(host="127.0.0.1", port=0))
    b = IOEngine("compat-b", IOEngineConfig(host="127.0.0.1", port=0))
    for e in (a, b):
        e.create_backend(BackendType.TCP)
    a.register_remote_engine(EngineDesc.unpack(b.get_engine_desc().pack()))
    b.register_remote_engine(EngineDesc.unpack(a.get_engine_desc().pack()))
    yield a, b
    a.close()
    b.close()


# register_memory(ptr, ...) does not own the memory (as in MORI): the buffers live here
# until the test session ends, even where a test keeps only the descriptor.
_ALIVE = []


def _region(engine, nbytes, fill=None):
    """A host buffer registered MORI's way: register_memory(ptr, size, device, loc)."""
    buf = np.zeros(nbytes, np.uint8) if fill is None else fill
    _ALIVE.append(buf)
    desc = engine.register_memory(buf.ctypes.data, buf.nbytes, -1, MemoryLocationType.CPU)
    return buf, desc


# -- enums ---------------------------------------------------------------------------


def test_status_codes_are_truthy_and_compare_as_ints_like_moris():
    """MORI's pybind11 enum members are all true (SUCCESS 0 included): code that tests a
    code's truth behaves the same here; comparisons are int comparisons."""
    assert all(bool(c) for c in StatusCode) and all(bool(d) for d in StatusDetail)
    assert StatusCode.SUCCESS == 0 and StatusCode(2) is StatusCode.IN_PROGRESS
    assert StatusCode.ERR_RDMA_OP.name == "ERR_RDMA_OP" and int(StatusCode.ERR_GPU_OP) == 15


def test_enums_have_moris_names_and_numbers():
    assert {k: int(v) for k, v in StatusCode.__members__.items()} == {
        "SUCCESS": 0, "INIT": 1, "IN_PROGRESS": 2, "ERR_INVALID_ARGS": 11,
        "ERR_NOT_FOUND": 12, "ERR_RDMA_OP": 13, "ERR_BAD_STATE": 14, "ERR_GPU_OP": 15,
    }  # fmt: skip
    assert {k: int(v) for k, v in PollCqMode.__members__.items()} == {"POLLING": 0, "EVENT": 1}
    numbers = {"Unknown": 0, "XGMI": 1, "RDMA": 2, "TCP": 3, "FABRIC": 4}
    assert {name: int(getattr(BackendType, name)) for name in numbers} == numbers
    assert BackendType.XGMI == BackendType.P2P
    assert {k: int(v) for k, v in MemoryLocationType.__members__.items()} == {
        "Unknown": 0, "CPU": 1, "GPU": 2,
    }  # fmt: skip


def test_every_detail_reports_as_one_of_moris_codes():
    # A detail below 20 is the StatusCode of its number; the finer ones refine one.
    refines = {"ERR_OUT_OF_BOUNDS": "ERR_INVALID_ARGS", "ERR_PEER_LOST": "ERR_RDMA_OP",
               "ERR_TIMEOUT": "ERR_RDMA_OP", "ERR_TRANSPORT": "ERR_RDMA_OP"}  # fmt: skip
    for name, detail in StatusDetail.__members__.items():
        expected = StatusCode.__members__[refines.get(name, name)]
        if int(detail) < 20:
            assert int(detail) == int(expected), name


def test_set_log_level_takes_moris_level_names():
    before = mori.core.get_log_level("io")
    try:
        set_log_level("warning")
        assert mori.core.get_log_level("io") == "warn"
        set_log_level("DEBUG")
        assert mori.core.get_log_level("io") == "debug"
    finally:
        mori.core.set_log_level(before, "io")


# -- TransferStatus --------------------------------------------------------------------


def test_fresh_status_is_init_and_waits_return_at_once():
    s = TransferStatus()
    assert s.Code() == StatusCode.INIT and s.Init()
    assert not s.InProgress() and not s.Succeeded() and not s.Failed()
    t0 = time.monotonic()
    assert s.WaitFor() == StatusCode.INIT  # MORI: only IN_PROGRESS is waited on
    s.Wait()
    assert time.monotonic() - t0 < 1.0


def test_wait_for_returns_in_progress_when_the_time_runs_out():
    s = TransferStatus()
    s.SetCode(StatusCode.IN_PROGRESS)
    assert s.InProgress() and not s.Init()
    t0 = time.monotonic()
    assert s.WaitFor(0) == StatusCode.IN_PROGRESS
    assert s.WaitFor(80) == StatusCode.IN_PROGRESS
    assert time.monotonic() - t0 >= 0.075


def test_update_from_another_thread_wakes_the_waiter():
    s = TransferStatus()
    s.SetCode(StatusCode.IN_PROGRESS)
    threading.Timer(0.05, s.Update, (StatusCode.SUCCESS, "done")).start()
    assert s.WaitFor(10000) == StatusCode.SUCCESS
    assert s.Succeeded() and s.Message() == "done"


def test_update_keeps_the_first_failure_set_code_does_not():
    s = TransferStatus()
    s.SetCode(StatusCode.IN_PROGRESS)
    s.Update(StatusCode.ERR_RDMA_OP, "first")
    s.Update(StatusCode.SUCCESS, "second")
    s.Update(StatusCode.ERR_GPU_OP, "third")
    assert (s.Code(), s.Message()) == (StatusCode.ERR_RDMA_OP, "first")
    assert s.Failed() and s.Detail() == StatusDetail.ERR_TRANSPORT
    s.SetCode(StatusCode.SUCCESS)  # unconditional, as MORI's
    s.SetMessage("reset")
    assert s.Succeeded() and s.Message() == "reset"
    for code in ("ERR_INVALID_ARGS", "ERR_NOT_FOUND", "ERR_RDMA_OP", "ERR_BAD_STATE", "ERR_GPU_OP"):
        s.SetCode(StatusCode.__members__[code])
        assert s.Failed() and not s.Succeeded() and not s.InProgress(), code


# -- engine over TCP -------------------------------------------------------------------


def test_out_of_range_is_invalid_args_with_the_detail_kept(tcp_pair):
    a, b = tcp_pair
    _, ma = _region(a, 4096)
    _, mb = _region(b, 1024)
    s = a.write(ma, 0, MemoryDesc.unpack(mb.pack()), 1000, 100, a.allocate_transfer_uid())
    assert s.WaitFor(10000) == StatusCode.ERR_INVALID_ARGS
    assert s.Detail() == StatusDetail.ERR_OUT_OF_BOUNDS and s.Failed()
    assert "1000" in s.Message() and "100" in s.Message(), s.Message()
    mb_gone = MemoryDesc.unpack(mb.pack())
    b.deregister_memory(mb)
    s = a.read(ma, 0, mb_gone, 0, 16, a.allocate_transfer_uid())
    assert s.WaitFor(10000) == StatusCode.ERR_NOT_FOUND, s.Message()


def test_engine_without_backend_is_bad_state_and_session_none():
    e = IOEngine("compat-solo", IOEngineConfig(host="127.0.0.1", port=0))
    _, m = _region(e, 64)
    other = MemoryDesc("compat-other", 1, -1, 0, 64, MemoryLocationType.CPU)
    assert e.create_session(m, other) is None
    s = e.write(m, 0, other, 0, 8, e.allocate_transfer_uid())
    assert s.Code() == StatusCode.ERR_BAD_STATE
    e.close()


def test_session_is_none_for_an_unregistered_peer(tcp_pair):
    a, _ = tcp_pair
    _, m = _region(a, 64)
    stranger = MemoryDesc("compat-nobody", 1, -1, 0, 64, MemoryLocationType.CPU)
    assert a.create_session(m, stranger) is None


@pytest.mark.parametrize("backend", [BackendType.TCP, BackendType.SHM])
def test_engine_moves_bytes_between_two_of_its_own_regions(backend):
    # MORI routes a pair whose remote region is this engine's own without any
    # register_remote_engine: engine calls, sessions and batches all work on it.
    if backend == BackendType.SHM and not mori.io.backend_availability()["SHM"][0]:
        pytest.skip(mori.io.backend_availability()["SHM"][1])
    e = IOEngine("compat-self", IOEngineConfig(host="127.0.0.1", port=0))
    e.create_backend(backend)
    rng = _rng()
    src = rng.integers(0, 256, 8192, dtype=np.uint8)
    (_sbuf, ms), (dst, md) = _region(e, 8192, src.copy()), _region(e, 8192)
    s = e.write(ms, 0, md, 0, 4096, e.allocate_transfer_uid())
    assert s.WaitFor(10000) == StatusCode.SUCCESS, s.Message()
    assert np.array_equal(dst[:4096], src[:4096]) and not dst[4096:].any()
    sess = e.create_session(md, ms)
    assert sess is not None
    s = sess.batch_read([4096, 6000], [4096, 6000], [1904, 2192], sess.allocate_transfer_uid())
    assert s.WaitFor(10000) == StatusCode.SUCCESS, s.Message()
    assert np.array_equal(dst, src)
    dst[:] = 0
    [s] = e.batch_write([ms], [[0]], [md], [[100]], [[50]], [e.allocate_transfer_uid()])
    assert s.WaitFor(10000) == StatusCode.SUCCESS, s.Message()
    assert np.array_equal(dst[100:150], src[:50]) and dst[:100].sum() == 0
    s = e.write(ms, 0, md, 8000, 200, e.allocate_transfer_uid())
    assert s.WaitFor(10000) == StatusCode.ERR_INVALID_ARGS
    e.close()


def test_own_region_without_a_backend_is_still_bad_state():
    e = IOEngine("compat-self-none", IOEngineConfig(host="127.0.0.1", port=0))
    (_abuf, ma), (_bbuf, mb) = _region(e, 64), _region(e, 64)
    assert e.create_session(ma, mb) is None
    assert e.write(ma, 0, mb, 0, 8, e.allocate_transfer_uid()).Code() == StatusCode.ERR_BAD_STATE
    e.close()


def test_session_allocates_uids_from_its_engine(tcp_pair):
    a, b = tcp_pair
    _, ma = _region(a, 64)
    _, mb = _region(b, 64)
    sess = a.create_session(ma, mb)
    uids = [sess.allocate_transfer_uid() for _ in range(50)]
    uids += [a.allocate_transfer_uid() for _ in range(50)]
    assert len(set(uids)) == 100


def test_engine_batch_in_moris_list_form_one_status_per_pair(tcp_pair):
    a, b = tcp_pair
    rng = _rng()
    src = [rng.integers(0, 256, 8192, dtype=np.uint8) for _ in range(3)]
    locals_ = [_region(a, 8192, s) for s in src]
    remotes = [_region(b, 8192) for _ in range(3)]
    lo = [[0, 4096], [100], [0, 1, 5000]]
    ro = [[4096, 0], [7000], [10, 20, 30]]
    sz = [[4096, 4096], [1000], [1, 2, 3000]]
    uids = [a.allocate_transfer_uid() for _ in range(3)]
    st = a.batch_write([m for _, m in locals_], lo, [m for _, m in remotes], ro, sz, uids)
    assert isinstance(st, list) and len(st) == 3
    assert a.wait_all(st, 20000) == StatusCode.SUCCESS
    for i, (dst, _) in enumerate(remotes):
        for l_off, r_off, n in zip(lo[i], ro[i], sz[i], strict=True):
            assert np.array_equal(dst[r_off : r_off + n], src[i][l_off : l_off + n])
    back = [_region(a, 8192) for _ in range(3)]
    st = a.batch_read([m for _, m in back], ro, [m for _, m in remotes], ro, sz,
                      [a.allocate_transfer_uid() for _ in range(3)])  # fmt: skip
    assert [s.WaitFor(20000) for s in st] == [StatusCode.SUCCESS] * 3
    for i in range(3):
        for r_off, n in zip(ro[i], sz[i], strict=True):
            assert np.array_equal(back[i][0][r_off : r_off + n], remotes[i][0][r_off : r_off + n])
    with pytest.raises(mori.core.InvalidArgumentError, match="3 local descriptors"):
        a.batch_write([m for _, m in locals_], lo, [m for _, m in remotes], ro, sz, uids[:2])


def test_wait_all_failure_wins_and_bounds(tcp_pair):
    a, b = tcp_pair
    _, ma = _region(a, 4096)
    _, mb = _region(b, 4096)
    assert a.wait_all([]) == StatusCode.SUCCESS
    good = a.write(ma, 0, mb, 0, 4096, a.allocate_transfer_uid())
    bad = a.write(ma, 0, mb, 4000, 200, a.allocate_transfer_uid())
    assert a.wait_all([good, None, bad]) == StatusCode.ERR_INVALID_ARGS
    assert a.wait_all([good, bad], 0) == StatusCode.ERR_INVALID_ARGS
    assert a.wait_all([good], 10000) == StatusCode.SUCCESS
    pending = TransferStatus()
    pending.SetCode(StatusCode.IN_PROGRESS)
    assert a.wait_all([good, pending], 0) == StatusCode.IN_PROGRESS
    t0 = time.monotonic()
    assert a.wait_all([good, pending], 100) == StatusCode.IN_PROGRESS
    assert 0.09 <= time.monotonic() - t0 < 5
    assert a.wait_all([bad, pending], 50) == StatusCode.ERR_INVALID_ARGS


def test_tcp_enable_notification_false_keeps_no_inbound_status():
    engines = []
    for key, notify in (("compat-n-init", True), ("compat-n-off", False), ("compat-n-on", True)):
        e = IOEngine(key, IOEngineConfig(host="127.0.0.1", port=0))
        e.create_backend(BackendType.TCP, TcpBackendConfig(enable_notification=notify))
        engines.append(e)
    init, off, on = engines
    _, mi = _region(init, 64)
    for target in (off, on):
        init.register_remote_engine(target.get_engine_desc())
        _, mt = _region(target, 64)
        uid = init.allocate_transfer_uid()
        assert init.write(mi, 0, mt, 0, 64, uid).WaitFor(10000) == StatusCode.SUCCESS
        deadline = time.monotonic() + 5
        popped = None
        while popped is None and target is on and time.monotonic() < deadline:
            popped = target.pop_inbound_transfer_status("compat-n-init", uid)
        if target is on:
            assert popped is not None and popped.Succeeded()
        else:
            time.sleep(0.2)  # the write has landed: nothing more can arrive
            assert target.pop_inbound_transfer_status("compat-n-init", uid) is None
    for e in engines:
        e.close()


def test_fabric_is_named_but_not_supported():
    e = IOEngine("compat-fabric", IOEngineConfig(host="127.0.0.1", port=0))
    with pytest.raises(mori.core.NotSupportedError, match="FABRIC"):
        e.create_backend(BackendType.FABRIC, FabricBackendConfig())
    with pytest.raises(mori.core.NotSupportedError):
        fabric_alloc(1 << 20, 0)
    with pytest.raises(mori.core.NotSupportedError):
        fabric_free(0x1000)
    e.close()


# -- descriptors -----------------------------------------------------------------------


def test_engine_desc_node_id_follows_mori_node_id(monkeypatch):
    e = IOEngine("compat-node", IOEngineConfig(host="127.0.0.1", port=0))
    e.create_backend(BackendType.TCP)
    monkeypatch.setenv("MORI_NODE_ID", "rack7-node3")
    d = e.get_engine_desc()
    assert d.node_id == "rack7-node3"
    assert EngineDesc.unpack(d.pack()) == d
    monkeypatch.delenv("MORI_NODE_ID")
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            expected = f.read().strip()
    except OSError:
        expected = d.hostname
    assert e.get_engine_desc().node_id == expected
    e.close()


def test_memory_desc_has_moris_fields_with_real_values(tcp_pair):
    a, _ = tcp_pair
    buf, m = _region(a, 1 << 16)
    buf[:] = 1  # fault the pages in
    assert m.device_bus_id == "" and m.ipc_handle == bytes(64)
    assert m.numa_node == _C.numa_node_of(buf.ctypes.data)
    if os.path.isdir("/sys/devices/system/node/node0"):
        nodes = {int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()}
        assert m.numa_node in nodes
    assert MemoryDesc.unpack(m.pack()) == m
    gpu = MemoryDesc("k", 3, 0, 0x7000, 64, MemoryLocationType.GPU, "0000:19:00.0", -1,
                     bytes(range(64)))  # fmt: skip
    assert MemoryDesc.unpack(gpu.pack()) == gpu
    empty = MemoryDesc()  # MORI's default constructor
    assert (empty.id, empty.device_id, empty.size, empty.numa_node) == (0, -1, 0, -1)
    assert empty.loc == MemoryLocationType.Unknown


def test_memory_desc_older_format_is_refused_naming_the_version(tcp_pair):
    a, _ = tcp_pair
    _, m = _region(a, 64)
    old = msgpack.packb(["mori.io.MemoryDesc", 1, m.engine_key, m.id, -1, m.data, 64, 1])
    with pytest.raises(mori.core.InvalidArgumentError, match="format version 1"):
        MemoryDesc.unpack(old)
    fields = msgpack.unpackb(m.pack())
    fields[-2] = b"short"  # the ipc handle; the capability is last
    with pytest.raises(mori.core.InvalidArgumentError, match="ipc handle of 5 bytes"):
        MemoryDesc.unpack(msgpack.packb(fields))


def test_register_memory_spelled_as_mori(tcp_pair):
    a, _ = tcp_pair
    buf = np.zeros(256, np.uint8)
    m = a.register_memory(buf.ctypes.data, 256, -1, mem_loc=MemoryLocationType.CPU)
    assert (m.size, m.loc, m.device_id) == (256, MemoryLocationType.CPU, -1)
    with pytest.raises(mori.core.InvalidArgumentError, match="disagree"):
        a.register_memory(
            buf.ctypes.data, 256, -1, mem_loc=MemoryLocationType.CPU, loc=MemoryLocationType.GPU
        )


# -- backend configs -------------------------------------------------------------------


def test_rdma_config_positional_order_and_defaults_are_moris():
    c = RdmaBackendConfig(4, -1, 4, PollCqMode.EVENT, False, 512, True, 1 << 16, 32, 1)
    assert (c.qp_per_transfer, c.post_batch_size, c.num_worker_threads) == (4, -1, 4)
    assert (c.poll_cq_mode, c.enable_notification, c.notif_per_qp) == (PollCqMode.EVENT, False, 512)
    assert (c.enable_transfer_chunking, c.chunk_bytes, c.max_chunks_per_transfer) == (
        True, 1 << 16, 32,
    )  # fmt: skip
    d = RdmaBackendConfig()
    assert (d.qp_per_transfer, d.post_batch_size, d.num_worker_threads) == (1, -1, -1)
    assert (d.notif_per_qp, d.chunk_bytes, d.max_chunks_per_transfer) == (1024, 65536, 64)
    assert (d.num_nics_per_transfer, d.max_send_wr, d.max_cqe_num, d.max_msg_sge) == (1, 0, 0, 0)
    assert d.enable_notification and not d.enable_transfer_chunking


def test_rdma_zero_means_default_and_set_values_reach_the_queues():
    native_default = _C.rdma.BackendConfig()
    c = RdmaBackendConfig(max_send_wr=0)  # as ROCm/ATOM's connector builds it
    c.max_cqe_num = 0
    c.max_msg_sge = 0
    n = c.to_native()
    assert (n.max_send_wr, n.cq_depth, n.max_sge, n.num_worker_threads) == (
        native_default.max_send_wr, native_default.cq_depth, native_default.max_sge, 1,
    )  # fmt: skip
    c = RdmaBackendConfig(4, -1, 4, PollCqMode.POLLING, False)
    c.max_send_wr, c.max_cqe_num, c.max_msg_sge = 2048, 8192, 2
    n = c.to_native()
    assert (n.max_send_wr, n.cq_depth, n.max_sge, n.max_recv_wr) == (2048, 8192, 2, 1024)
    assert (n.qp_per_transfer, n.num_worker_threads, n.enable_notification) == (4, 4, False)
    n = RdmaBackendConfig(enable_transfer_chunking=True, chunk_bytes=1 << 20).to_native()
    assert n.max_message_bytes == 1 << 20
    with pytest.raises(mori.core.InvalidArgumentError, match="max_send_wr=70000"):
        RdmaBackendConfig(max_send_wr=70000)
    with pytest.raises(mori.core.InvalidArgumentError, match="num_nics_per_transfer=0"):
        RdmaBackendConfig(num_nics_per_transfer=0)


def test_rdma_config_keeps_more_nics_and_refuses_them_when_building_the_backend():
    # MORI's config is plain data: a connector sets num_nics_per_transfer from its own
    # settings before it knows which backend serves; only building the backend refuses.
    c = RdmaBackendConfig(4, -1, 2, PollCqMode.POLLING, True, 2048, True, 65536, 32, 2)
    assert (c.num_nics_per_transfer, c.max_chunks_per_transfer, c.notif_per_qp) == (2, 32, 2048)
    c.num_nics_per_transfer = 4
    c.validate()
    with pytest.raises(mori.core.NotSupportedError, match="num_nics_per_transfer=4"):
        c.to_native()
    e = IOEngine("compat-nics", IOEngineConfig(host="127.0.0.1", port=0))
    with pytest.raises(mori.core.NotSupportedError, match="num_nics_per_transfer=4"):
        e.create_backend(BackendType.RDMA, c)
    assert "RDMA" not in e.get_engine_desc().backends
    e.close()


def test_xgmi_config_is_moris_streams_then_events():
    c = XgmiBackendConfig(8, 16)
    assert (c.num_streams, c.num_events) == (8, 16)
    assert XgmiBackendConfig().num_streams == 64 and XgmiBackendConfig().num_events == 64
    assert c.to_native().num_streams == 8
    with pytest.raises(mori.core.InvalidArgumentError, match="num_events=0"):
        XgmiBackendConfig(num_events=0).to_native()


# -- a KV connector's call sequence (as vLLM's and ROCm/ATOM's MoRIIO connectors make) -


def test_connector_call_sequence_over_tcp_moves_every_byte():
    """Producer and consumer engines, KV "layers" registered in chunks with
    register_memory, descriptors exchanged as packed bytes, one session per layer, reads
    and writes as session.batch_read/batch_write with engine uids, completion by
    status.Wait/Succeeded and pop_inbound_transfer_status, teardown by deregistering."""
    rng = _rng()
    layers, blocks, block_bytes = 3, 16, 512
    producer = IOEngine("compat-prefill", IOEngineConfig(host="127.0.0.1", port=0))
    consumer = IOEngine("compat-decode", IOEngineConfig(host="127.0.0.1", port=0))
    for e in (producer, consumer):
        e.create_backend(BackendType.TCP)
    # Handshake: each side unpacks the other's packed EngineDesc.
    producer.register_remote_engine(EngineDesc.unpack(consumer.get_engine_desc().pack()))
    consumer.register_remote_engine(EngineDesc.unpack(producer.get_engine_desc().pack()))

    kv_p = [rng.integers(0, 256, blocks * block_bytes, dtype=np.uint8) for _ in range(layers)]
    kv_c = [np.zeros(blocks * block_bytes, np.uint8) for _ in range(layers)]
    packed_p = [
        producer.register_memory(t.ctypes.data, t.nbytes, -1, MemoryLocationType.CPU).pack()
        for t in kv_p
    ]
    packed_c = [
        consumer.register_memory(t.ctypes.data, t.nbytes, -1, MemoryLocationType.CPU).pack()
        for t in kv_c
    ]
    local_c = [MemoryDesc.unpack(p) for p in packed_c]
    remote_p = [MemoryDesc.unpack(p) for p in packed_p]
    assert remote_p[0].data == kv_p[0].ctypes.data  # what vLLM's tests check
    sessions = [consumer.create_session(local_c[i], remote_p[i]) for i in range(layers)]
    assert all(s is not None and s.alive() for s in sessions)

    # Read mode: the consumer pulls blocks 0..7 of each layer into its blocks 8..15.
    src_blocks, dst_blocks = list(range(8)), list(range(8, 16))
    lo = [b * block_bytes for b in dst_blocks]
    ro = [b * block_bytes for b in src_blocks]
    sizes = [block_bytes] * len(lo)
    statuses = [s.batch_read(lo, ro, sizes, consumer.allocate_transfer_uid()) for s in sessions]
    for st in statuses:
        st.Wait()
        assert st.Succeeded(), (st.Code(), st.Message())
    for i in range(layers):
        for d, s in zip(dst_blocks, src_blocks, strict=True):
            got = kv_c[i][d * block_bytes : (d + 1) * block_bytes]
            assert np.array_equal(got, kv_p[i][s * block_bytes : (s + 1) * block_bytes])

    # Write mode: the producer pushes blocks 8..15 into the consumer's blocks 0..7, then
    # the consumer sees each write through pop_inbound_transfer_status.
    local_p = [MemoryDesc.unpack(p) for p in packed_p]
    remote_c = [MemoryDesc.unpack(p) for p in packed_c]
    push = [producer.create_session(local_p[i], remote_c[i]) for i in range(layers)]
    uids = []
    for sess in push:
        uid = producer.allocate_transfer_uid()
        uids.append(uid)
        # the producer's blocks 8..15 (offsets lo) into the consumer's 0..7 (offsets ro)
        st = sess.batch_write(lo, ro, sizes, uid)
        st.Wait()
        assert st.Succeeded(), (st.Code(), st.Message())
    single_uid = producer.allocate_transfer_uid()
    st = push[0].write(0, 15 * block_bytes, block_bytes, single_uid)
    st.Wait()
    assert st.Succeeded(), st.Message()
    for uid in [*uids, single_uid]:
        deadline, popped = time.monotonic() + 10, None
        while popped is None and time.monotonic() < deadline:
            popped = consumer.pop_inbound_transfer_status("compat-prefill", uid)
        assert popped is not None and popped.Succeeded(), uid
    for i in range(layers):
        for d, s in zip(src_blocks, dst_blocks, strict=True):
            got = kv_c[i][d * block_bytes : (d + 1) * block_bytes]
            assert np.array_equal(got, kv_p[i][s * block_bytes : (s + 1) * block_bytes])
    assert np.array_equal(kv_c[0][15 * block_bytes :], kv_p[0][:block_bytes])

    for desc in local_c:
        consumer.deregister_memory(desc)
    for desc in local_p:
        producer.deregister_memory(desc)
    consumer.deregister_remote_engine(EngineDesc.unpack(producer.get_engine_desc().pack()))
    producer.deregister_remote_engine(EngineDesc.unpack(consumer.get_engine_desc().pack()))
    producer.close()
    consumer.close()


# -- MORI's opt-in XGMI (P2P) companion of RDMA: MORI_DISABLE_AUTO_XGMI=0 ---------------


def _can_p2p() -> bool:
    """Whether this build and machine can create a P2P backend at all."""
    e = IOEngine("compat-p2p-probe", IOEngineConfig(host="127.0.0.1", port=0))
    try:
        e.create_backend(BackendType.XGMI)
        return True
    except mori.core.NotSupportedError:
        return False
    finally:
        e.close()


def test_a_backend_created_twice_is_kept_with_a_warning_as_in_mori():
    e = IOEngine("compat-dup", IOEngineConfig(host="127.0.0.1", port=0))
    try:
        e.create_backend(BackendType.TCP)
        e.create_backend(BackendType.TCP, TcpBackendConfig(num_worker_threads=3))
        e.create_backend(BackendType.SHM)
        e.create_backend(BackendType.SHM)
        assert e.get_engine_desc().backends == ("TCP", "SHM")
    finally:
        e.close()


def test_rdma_without_a_device_names_moris_fallback_switch(monkeypatch):
    monkeypatch.delenv("MORI_IO_RDMA_LOOPBACK", raising=False)
    monkeypatch.delenv("MORI_DISABLE_AUTO_XGMI", raising=False)
    if _C.rdma_probe()[0]:
        pytest.skip("an RDMA device is present: the fallback is not taken")
    e = IOEngine("compat-no-rdma", IOEngineConfig(host="127.0.0.1", port=0))
    try:
        with pytest.raises(mori.core.NotSupportedError, match="MORI_DISABLE_AUTO_XGMI=0"):
            e.create_backend(BackendType.RDMA)
        assert e.get_engine_desc().backends == ()
        monkeypatch.setenv("MORI_DISABLE_AUTO_XGMI", "0")
        if _can_p2p():
            e.create_backend(BackendType.RDMA)  # MORI's XGMI-only fallback
            assert e.get_engine_desc().backends == ("P2P",)
        else:
            with pytest.raises(mori.core.NotSupportedError, match="no RDMA .* no P2P fallback"):
                e.create_backend(BackendType.RDMA)
            assert e.get_engine_desc().backends == ()
    finally:
        e.close()


@pytest.mark.io_testing  # the RDMA loopback double
@pytest.mark.parametrize("auto", [None, "1", "0"])
def test_rdma_gets_a_p2p_companion_only_with_auto_xgmi_0(monkeypatch, auto):
    monkeypatch.setenv("MORI_IO_RDMA_LOOPBACK", "1")  # an RDMA backend without a NIC
    if auto is None:
        monkeypatch.delenv("MORI_DISABLE_AUTO_XGMI", raising=False)
    else:
        monkeypatch.setenv("MORI_DISABLE_AUTO_XGMI", auto)
    with_p2p = auto == "0" and _can_p2p()
    e = IOEngine("compat-auto-xgmi", IOEngineConfig(host="127.0.0.1", port=0))
    try:
        e.create_backend(BackendType.RDMA)
        assert e.get_engine_desc().backends == (("RDMA", "P2P") if with_p2p else ("RDMA",))
        if with_p2p:
            e.create_backend(BackendType.XGMI)  # already there: kept, as MORI does
            assert e.get_engine_desc().backends == ("RDMA", "P2P")
        if _can_p2p():
            import torch

            # MORI's own check of the companion: a GPU tensor's descriptor carries its
            # CUDA IPC handle only where a P2P (XGMI) backend exists.
            handle = e.register_torch_tensor(torch.ones(1024, device="cuda")).ipc_handle
            assert any(handle) == with_p2p
    finally:
        e.close()
