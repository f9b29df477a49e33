# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""RDMA backend, hardware-independent parts: the dlopen loader and probe, the work
request planner, immediate-data and wr_id encodings, QP transitions, NIC and GID
choice, the control-channel codec, send-queue accounting, RdmaBackendConfig.

No machine here has an RDMA NIC: nothing in this file touches one."""

from __future__ import annotations

import collections
import ctypes.util
import ipaddress
import os
import random
import shutil
import subprocess
import sys

import pytest

import mori.core
from mori.io import _C
from mori.io.rdma import PollCqMode, RdmaBackendConfig, probe

T = getattr(_C, "_testing", None)  # test builds only; conftest skips io_testing tests without
R = T.rdma if T else None  # the RDMA backend's internals

# enum ibv_qp_attr_mask, from the ibverbs ABI
QP_STATE, ACCESS_FLAGS, PKEY_INDEX, PORT = 1 << 0, 1 << 3, 1 << 4, 1 << 5
AV, PATH_MTU, TIMEOUT, RETRY_CNT, RNR_RETRY = 1 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11
RQ_PSN, MAX_QP_RD_ATOMIC, MIN_RNR_TIMER, SQ_PSN = 1 << 12, 1 << 13, 1 << 15, 1 << 16
MAX_DEST_RD_ATOMIC, DEST_QPN = 1 << 17, 1 << 20
WRITE, WRITE_IMM, READ = 0, 1, 4
IB, ETH = 1, 2


def _seed(name: str) -> random.Random:
    seed = random.randrange(1 << 32)
    print(f"{name}: seed {seed}")
    return random.Random(seed)


# -- loader and probe ---------------------------------------------------------------


def _probe_in_subprocess(lib: str) -> tuple[bool, str, list[str]]:
    code = "from mori.io import _C; import json; print(json.dumps(_C.rdma_probe()))"
    env = {**os.environ, "MORI_IO_IBVERBS_LIB": lib}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    import json

    ok, reason, devices = json.loads(out.stdout.strip().splitlines()[-1])
    return ok, reason, devices


@pytest.mark.io_testing
def test_missing_library_is_unavailable_with_its_name():
    path = "/nonexistent/libibverbs-mori-test.so.1"
    rep = R.try_load_verbs(path)
    assert not rep["ok"] and path in rep["reason"] and "cannot be loaded" in rep["reason"]
    ok, reason, devices = _probe_in_subprocess(path)
    assert not ok and devices == []
    assert path in reason or "built without ibverbs headers" in reason


@pytest.mark.io_testing
def test_library_without_verbs_symbols_is_unavailable_naming_them():
    libc = ctypes.util.find_library("c") or "libc.so.6"
    rep = R.try_load_verbs(libc)
    assert not rep["ok"]
    assert rep["missing"] == R.required_symbols()  # libc has none of them
    assert "ibv_get_device_list" in rep["reason"] and libc in rep["reason"]
    ok, reason, _ = _probe_in_subprocess(libc)
    assert not ok
    if R.built_with_verbs:
        assert libc in reason and "lacks" in reason and "ibv_reg_mr" in reason


@pytest.mark.io_testing
def test_installed_libibverbs_has_every_symbol_we_resolve():
    rep = R.try_load_verbs("libibverbs.so.1")
    if not rep["ok"] and "cannot be loaded" in rep["reason"]:
        pytest.skip(f"libibverbs.so.1 not installed: {rep['reason']}")
    assert rep["ok"], rep["reason"]
    assert rep["missing"] == []


@pytest.mark.io_testing
def test_probe_here_reports_unavailable_with_a_reason():
    ok, reason, devices = probe()
    if ok:
        pytest.skip(f"this machine has RDMA devices: {devices}")
    assert reason and devices == []
    print("rdma probe:", reason)
    # The engine's own probe agrees.
    avail, why = _C.probe_backend(_C.BackendType.RDMA)
    assert not avail and why
    with pytest.raises(mori.core.NotSupportedError) as err:
        R.Backend(RdmaBackendConfig().to_native())
    assert "RDMA backend" in str(err.value)


def _extension_path() -> str:
    return _C.__file__


@pytest.mark.parametrize("which", ["mori.io._C", "libmori_core"])
def test_extension_does_not_link_libibverbs(which):
    """Neither mori-io's extension nor libmori_core (where the verbs layer and its
    dlopen live) NEEDs libibverbs or imports an ibv_* symbol."""
    if shutil.which("readelf") is None or shutil.which("nm") is None:
        pytest.skip("binutils (readelf, nm) not installed")
    path = _extension_path() if which == "mori.io._C" else mori.core.library_path()
    dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    assert dyn.returncode == 0, dyn.stderr
    needed = [line for line in dyn.stdout.splitlines() if "(NEEDED)" in line]
    assert needed and not any("ibverbs" in line for line in needed), needed
    syms = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True)
    assert syms.returncode == 0, syms.stderr
    assert not [s for s in syms.stdout.split() if s.startswith("ibv_")], "undefined ibv_* symbols"


# -- work request planner ----------------------------------------------------------


def _plan(op="write", spans=((0, 0, 100),), local=1 << 20, remote=1 << 20, **kw):
    return R.plan_transfer(op, list(spans), local, remote, **kw)


@pytest.mark.io_testing
def test_a_span_is_chunked_at_max_message_size():
    m = 4096
    size = 10 * m + 3
    p = _plan(spans=[(5, 7, size)], max_message_bytes=m, notify=False, signal_interval=1000)
    (q,) = p["qps"]
    lengths = [w["length"] for w in q["wrs"]]
    assert lengths == [m] * 10 + [3]
    assert [w["remote_offset"] for w in q["wrs"]] == [7 + i * m for i in range(11)]
    assert [w["sges"] for w in q["wrs"]] == [[(5 + i * m, lengths[i])] for i in range(11)]
    assert p["bytes"] == size and p["wrs"] == 11
    assert all(w["opcode"] == WRITE for w in q["wrs"])


@pytest.mark.io_testing
def test_signaling_every_nth_each_batch_end_and_the_last():
    p = _plan(
        spans=[(0, 0, 23 * 64)], max_message_bytes=64, signal_interval=4, post_batch_size=10,
        notify=False,
    )  # fmt: skip
    wrs = p["qps"][0]["wrs"]
    assert len(wrs) == 23
    signaled = [i for i, w in enumerate(wrs) if w["signaled"]]
    # every 4th (3, 7, 11, 15, 19), each batch's last (9, 19), the last (22)
    assert signaled == [3, 7, 9, 11, 15, 19, 22]
    assert [i for i, w in enumerate(wrs) if w["batch_end"]] == [9, 19, 22]
    assert [wrs[i]["retire"] for i in signaled] == [4, 4, 2, 2, 4, 4, 3]
    assert sum(w["retire"] for w in wrs) == 23
    assert all(w["retire"] == 0 for w in wrs if not w["signaled"])


@pytest.mark.io_testing
def test_remote_contiguous_spans_share_a_wr_up_to_max_sge():
    # 6 spans of 100 bytes, contiguous remotely, scattered locally.
    spans = [(1000 * i, 100 * i, 100) for i in range(6)]
    p = _plan(spans=spans, max_sge=4, notify=False)
    wrs = p["qps"][0]["wrs"]
    assert [len(w["sges"]) for w in wrs] == [4, 2]
    assert [(w["remote_offset"], w["length"]) for w in wrs] == [(0, 400), (400, 200)]
    assert wrs[0]["sges"] == [(0, 100), (1000, 100), (2000, 100), (3000, 100)]
    one = _plan(spans=spans, max_sge=1, notify=False)
    assert len(one["qps"][0]["wrs"]) == 6


@pytest.mark.io_testing
def test_spans_contiguous_on_both_sides_coalesce_into_one_sge():
    spans = [(100 * i, 100 * i, 100) for i in range(8)]
    wrs = _plan(spans=spans, notify=False)["qps"][0]["wrs"]
    assert len(wrs) == 1 and wrs[0]["sges"] == [(0, 800)] and wrs[0]["length"] == 800


@pytest.mark.io_testing
def test_zero_length_spans_are_skipped_and_an_empty_transfer_still_notifies():
    p = _plan(spans=[(0, 0, 0), (10, 10, 5), (20, 20, 0)], notify=False)
    assert [w["length"] for w in p["qps"][0]["wrs"]] == [5]
    empty = _plan(spans=[(0, 0, 0)] * 3, notify=False)
    assert empty["qps"] == [] and empty["wrs"] == 0
    note = _plan(spans=[(0, 0, 0)], notify=True, uid=77)
    (wr,) = note["qps"][0]["wrs"]
    assert wr["opcode"] == WRITE_IMM and wr["length"] == 0 and wr["sges"] == []
    assert wr["signaled"] and R.decode_imm(wr["imm"]) == (77, 1, False)
    assert _plan(spans=[], notify=True)["wrs"] == 1


@pytest.mark.io_testing
def test_huge_span_and_the_plan_size_limit():
    tib = 1 << 40
    p = _plan(spans=[(0, tib, tib)], local=tib, remote=2 * tib, max_message_bytes=1 << 30,
              notify=False, signal_interval=1 << 16, post_batch_size=1 << 16)  # fmt: skip
    wrs = p["qps"][0]["wrs"]
    assert len(wrs) == 1024 and p["bytes"] == tib
    assert wrs[-1]["remote_offset"] == tib + tib - (1 << 30)
    too_many = R.MAX_PLANNED_WRS + 1
    with pytest.raises(mori.core.InvalidArgumentError, match="work requests"):
        _plan(spans=[(0, 0, too_many)], local=too_many, remote=too_many, max_message_bytes=1)


@pytest.mark.parametrize(
    "span, local, remote, match",
    [
        ((0, 0, 101), 100, 1000, "local"),
        ((1, 0, 100), 100, 1000, "local"),
        ((0, 901, 100), 1000, 1000, "remote"),
        ((2**64 - 1, 0, 2), 1000, 1000, "local"),  # offset + size wraps
        ((0, 2**64 - 8, 16), 1000, 1000, "remote"),
    ],
)
@pytest.mark.io_testing
def test_out_of_range_spans_are_rejected_naming_the_span(span, local, remote, match):
    with pytest.raises(mori.core.InvalidArgumentError, match=f"span 1: {match}"):
        _plan(spans=[(0, 0, 1), span], local=local, remote=remote)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"max_message_bytes": 0}, "max_message_bytes"),
        ({"max_message_bytes": (1 << 31) + 1}, "max_message_bytes"),
        ({"max_sge": 0}, "max_sge"),
        ({"signal_interval": 0}, "signal_interval"),
        ({"post_batch_size": 0}, "post_batch_size"),
        ({"num_qps": 0}, "num_qps"),
        ({"num_qps": 128}, "num_qps"),
    ],
)
@pytest.mark.io_testing
def test_bad_plan_limits_are_rejected(kw, match):
    with pytest.raises(mori.core.InvalidArgumentError, match=match):
        _plan(**kw)


@pytest.mark.io_testing
def test_write_spread_over_qps_ends_each_part_with_write_with_imm():
    p = _plan(spans=[(0, 0, 10 * 64)], max_message_bytes=64, num_qps=4, uid=(1 << 24) + 5)
    assert [len(q["wrs"]) for q in p["qps"]] == [2, 3, 2, 3]
    for q in p["qps"]:
        last = q["wrs"][-1]
        assert last["opcode"] == WRITE_IMM and last["signaled"] and last["length"] == 64
        assert R.decode_imm(last["imm"]) == (5, 4, False)  # uid mod 2^24, 4 parts, write
        assert all(w["opcode"] == WRITE for w in q["wrs"][:-1])
    assert sum(q["bytes"] for q in p["qps"]) == 640
    # fewer WRs than QPs: only as many parts as WRs
    assert len(_plan(spans=[(0, 0, 64)], num_qps=4)["qps"]) == 1


@pytest.mark.io_testing
def test_read_notification_is_fenced_after_the_reads():
    p = _plan(op="read", spans=[(0, 0, 3 * 64)], max_message_bytes=64, num_qps=1, uid=9)
    wrs = p["qps"][0]["wrs"]
    assert [w["opcode"] for w in wrs] == [READ, READ, READ, WRITE_IMM]
    note = wrs[-1]
    assert note["fence"] and note["length"] == 0 and note["sges"] == []
    assert R.decode_imm(note["imm"]) == (9, 1, True)
    assert not any(w["fence"] for w in wrs[:-1])


def _byte_pairs(pieces):
    """Every (local byte, remote byte) a list of (local, remote, size) pieces moves."""
    pairs = collections.Counter()
    for lo, ro, n in pieces:
        pairs.update(zip(range(lo, lo + n), range(ro, ro + n), strict=True))
    return pairs


@pytest.mark.io_testing
def test_random_plans_move_every_byte_once_within_limits():
    rng = _seed("planner")
    for _ in range(300):
        op = rng.choice(["read", "write"])
        size = 1 << 16
        spans, ro = [], 0
        for _ in range(rng.randrange(0, 20)):
            n = rng.choice([0, 1, rng.randrange(1, 600)])
            ro = ro if rng.random() < 0.6 else rng.randrange(0, size - n)
            ro = min(ro, size - n)
            spans.append((rng.randrange(0, size - n + 1), ro, n))
            ro += n
        lim = {
            "max_message_bytes": rng.choice([1, 7, 64, 512, 1 << 30]),
            "max_sge": rng.choice([1, 2, 3, 30]),
            "signal_interval": rng.randrange(1, 9),
            "post_batch_size": rng.randrange(1, 9),
            "num_qps": rng.randrange(1, 6),
            "notify": rng.random() < 0.5,
        }
        p = R.plan_transfer(op, spans, size, size, uid=rng.randrange(1 << 40), **lim)
        moved = []
        for q in p["qps"]:
            retired = 0
            for i, w in enumerate(q["wrs"]):
                assert w["length"] <= lim["max_message_bytes"]
                assert len(w["sges"]) <= lim["max_sge"]
                assert w["length"] == sum(n for _, n in w["sges"])
                assert w["signaled"] == (w["batch_end"] or (i + 1) % lim["signal_interval"] == 0)
                retired += w["retire"]
                r = w["remote_offset"]
                for lo, n in w["sges"]:
                    moved.append((lo, r, n))
                    r += n
            assert retired == len(q["wrs"]) and q["wrs"][-1]["signaled"]
            assert (q["wrs"][-1]["opcode"] == WRITE_IMM) == lim["notify"]
        assert _byte_pairs(moved) == _byte_pairs(spans)
        assert p["bytes"] == sum(s[2] for s in spans)


# -- encodings -------------------------------------------------------------------------


@pytest.mark.io_testing
def test_imm_round_trip_and_limits():
    rng = _seed("imm")
    for _ in range(1000):
        uid, parts, read = rng.randrange(1 << 64), rng.randrange(1, 128), rng.random() < 0.5
        imm = R.encode_imm(uid, parts, read)
        assert 0 <= imm < 1 << 32
        assert R.decode_imm(imm) == (uid & R.IMM_UID_MASK, parts, read)
    assert R.encode_imm((1 << 24) - 1, 127, True) == 0xFFFFFFFF
    for parts in (0, 128, 1000):
        with pytest.raises(mori.core.InvalidArgumentError, match=f"part count {parts}"):
            R.encode_imm(1, parts, False)
    with pytest.raises(mori.core.InvalidArgumentError, match="part count 0"):
        R.decode_imm(0x80FFFFFF)


@pytest.mark.io_testing
def test_wr_id_round_trip_and_rejections():
    rng = _seed("wr_id")
    for _ in range(1000):
        kind, retire, slot = rng.choice([1, 2]), rng.randrange(1 << 24), rng.randrange(1 << 32)
        assert R.decode_wr_id(R.encode_wr_id(kind, retire, slot)) == (kind, retire, slot)
    with pytest.raises(mori.core.InvalidArgumentError, match="24 bits"):
        R.encode_wr_id(1, 1 << 24, 0)
    with pytest.raises(mori.core.InvalidArgumentError, match="32 bits"):
        R.encode_wr_id(1, 0, 1 << 32)
    for kind in (0, 3):
        with pytest.raises(mori.core.InvalidArgumentError, match="kind"):
            R.encode_wr_id(kind, 0, 0)
        with pytest.raises(mori.core.InvalidArgumentError, match="not a mori work request"):
            R.decode_wr_id(kind << 56)


@pytest.mark.io_testing
def test_wc_status_names():
    assert R.wc_status_name(0) == "IBV_WC_SUCCESS"
    assert R.wc_status_name(5) == "IBV_WC_WR_FLUSH_ERR"
    assert R.wc_status_name(12) == "IBV_WC_RETRY_EXC_ERR"
    assert R.wc_status_name(10) == "IBV_WC_REM_ACCESS_ERR"
    assert R.wc_status_name(999) == "IBV_WC_999"
    assert "rkey" in R.wc_status_hint(10)


# -- QP transitions ------------------------------------------------------------------


def _remote(link=IB, lid=7, gid=b"\0" * 16, qpn=0x1234, psn=0xABCDE, mtu=5):
    e = R.EndpointInfo()
    e.qpn, e.psn, e.lid, e.port_num, e.active_mtu, e.link_layer, e.gid = (
        qpn, psn, lid, 1, mtu, link, gid,
    )  # fmt: skip
    return e


ROCE_GID = ipaddress.IPv6Address("::ffff:10.0.0.2").packed


@pytest.mark.io_testing
def test_init_transition_sets_exactly_pkey_port_access():
    c = _C.rdma.QpConfig()
    c.port_num, c.pkey_index = 2, 3
    t = R.build_init_transition(c)
    assert t["state"] == 1  # IBV_QPS_INIT
    assert t["attr_mask"] == QP_STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
    assert t["access_flags"] == 1 | 2 | 4  # LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
    assert (t["port_num"], t["pkey_index"]) == (2, 3)


@pytest.mark.io_testing
def test_rtr_transition_infiniband_addresses_by_lid():
    c = _C.rdma.QpConfig()
    c.max_dest_rd_atomic, c.min_rnr_timer, c.service_level = 8, 14, 3
    t = R.build_rtr_transition(c, IB, 4, 0, _remote(lid=42, mtu=5))
    assert t["state"] == 2  # IBV_QPS_RTR
    assert t["attr_mask"] == (
        QP_STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
    )
    assert (t["dest_qpn"], t["rq_psn"]) == (0x1234, 0xABCDE)
    assert t["path_mtu"] == 4  # min(local 2048, remote 4096)
    assert (t["max_dest_rd_atomic"], t["min_rnr_timer"]) == (8, 14)
    av = t["ah_attr"]
    assert av["dlid"] == 42 and not av["is_global"] and av["sl"] == 3 and av["port_num"] == 1


@pytest.mark.io_testing
def test_rtr_transition_roce_addresses_by_gid():
    c = _C.rdma.QpConfig()
    c.traffic_class, c.hop_limit, c.max_path_mtu = 106, 32, 3
    t = R.build_rtr_transition(c, ETH, 5, 3, _remote(link=ETH, lid=0, gid=ROCE_GID, mtu=5))
    av = t["ah_attr"]
    assert av["is_global"] and av["dgid"] == ROCE_GID and av["sgid_index"] == 3
    assert (av["hop_limit"], av["traffic_class"], av["dlid"]) == (32, 106, 0)
    assert t["path_mtu"] == 3  # the configured bound


@pytest.mark.io_testing
def test_rts_transition_sets_exactly_timeout_retries_psn_rd_atomic():
    c = _C.rdma.QpConfig()
    c.timeout, c.retry_cnt, c.rnr_retry, c.max_rd_atomic = 18, 5, 6, 4
    t = R.build_rts_transition(c, 0x123456)
    assert t["state"] == 3  # IBV_QPS_RTS
    assert t["attr_mask"] == QP_STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC
    assert (t["timeout"], t["retry_cnt"], t["rnr_retry"], t["sq_psn"], t["max_rd_atomic"]) == (
        18, 5, 6, 0x123456, 4,
    )  # fmt: skip


@pytest.mark.parametrize(
    "local_link, remote, match",
    [
        (IB, dict(link=ETH, gid=ROCE_GID), "link layers differ"),
        (ETH, dict(link=ETH, lid=0), "all-zero GID"),
        (IB, dict(lid=0), "LID 0"),
        (IB, dict(psn=1 << 24), "PSN"),
        (IB, dict(qpn=0), "QP number"),
        (IB, dict(qpn=1 << 24), "QP number"),
    ],
)
@pytest.mark.io_testing
def test_rtr_rejects_unusable_peers(local_link, remote, match):
    # The endpoint is made in the test: R exists only in a test build.
    with pytest.raises(mori.core.InvalidArgumentError, match=match):
        R.build_rtr_transition(_C.rdma.QpConfig(), local_link, 5, 0, _remote(**remote))


@pytest.mark.parametrize(
    "field, value", [("retry_cnt", 8), ("rnr_retry", 9), ("timeout", 32), ("min_rnr_timer", 40),
                     ("max_rd_atomic", 0), ("service_level", 16), ("max_path_mtu", 6)],
)  # fmt: skip
@pytest.mark.io_testing
def test_qp_config_out_of_range_is_named(field, value):
    c = _C.rdma.QpConfig()
    setattr(c, field, value)
    with pytest.raises(mori.core.InvalidArgumentError, match=f"{field} {value}"):
        R.build_rts_transition(c, 1)
    with pytest.raises(mori.core.InvalidArgumentError):
        R.build_rts_transition(_C.rdma.QpConfig(), 1 << 24)


# -- NIC and GID choice ----------------------------------------------------------------

ROOT0 = "/sys/devices/pci0000:00"
ROOT1 = "/sys/devices/pci0000:80"
SWITCH0 = f"{ROOT0}/0000:00:01.0/0000:01:00.0"
GPU0 = {"index": 0, "pci_path": f"{SWITCH0}/0000:02:00.0/0000:03:00.0", "numa_node": 0}


def _dev(name, path, numa, *ports):
    return {
        "name": name, "pci_path": path, "numa_node": numa,
        "ports": [{"port": p, "state": s, "link_layer": ll} for p, s, ll in ports],
    }  # fmt: skip


def _machine(near_state="ACTIVE"):
    return [
        _dev("mlx5_0", f"{ROOT1}/0000:80:01.0/0000:81:00.0", 1, (1, "ACTIVE", "InfiniBand")),
        _dev("mlx5_1", f"{SWITCH0}/0000:02:01.0/0000:04:00.0", 0, (1, near_state, "InfiniBand")),
        _dev("mlx5_2", f"{ROOT0}/0000:00:03.0/0000:05:00.0", 0,
             (1, "DOWN", "Ethernet"), (2, "ACTIVE", "Ethernet")),
    ]  # fmt: skip


@pytest.mark.io_testing
def test_nic_nearest_to_the_gpu_wins():
    c = R.choose_rdma_port(_machine(), GPU0)
    assert (c["device"], c["port"], c["link_layer"]) == ("mlx5_1", 1, IB)
    assert c["distance"] in ("PIX", "PXB") and "nearest to GPU 0" in c["reason"]


@pytest.mark.io_testing
def test_down_ports_are_skipped():
    c = R.choose_rdma_port(_machine(near_state="DOWN"), GPU0)
    # mlx5_2 shares GPU0's root complex (PHB), mlx5_0 is on the other socket (SYS).
    assert (c["device"], c["port"], c["distance"]) == ("mlx5_2", 2, "PHB")


@pytest.mark.io_testing
def test_no_gpu_locality_picks_the_first_active_port_by_name():
    assert R.choose_rdma_port(_machine())["device"] == "mlx5_0"


@pytest.mark.io_testing
def test_explicit_device_and_port_are_honoured():
    assert R.choose_rdma_port(_machine(), GPU0, "mlx5_0")["device"] == "mlx5_0"
    c = R.choose_rdma_port(_machine(), GPU0, "mlx5_2:2")
    assert (c["device"], c["port"], c["link_layer"]) == ("mlx5_2", 2, ETH)
    assert R.choose_rdma_port(_machine(), None, "mlx5_2", 2)["port"] == 2


@pytest.mark.io_testing
def test_missing_or_unusable_named_device_lists_what_exists():
    with pytest.raises(mori.core.NotFoundError, match="'mlx5_9' not found.*mlx5_0.*mlx5_1.*mlx5_2"):
        R.choose_rdma_port(_machine(), GPU0, "mlx5_9")
    with pytest.raises(mori.core.NotFoundError, match="no port 3"):
        R.choose_rdma_port(_machine(), GPU0, "mlx5_2:3")
    with pytest.raises(mori.core.NotFoundError, match="no ACTIVE RDMA port on 'mlx5_2' port 1"):
        R.choose_rdma_port(_machine(), GPU0, "mlx5_2:1")
    with pytest.raises(mori.core.InvalidArgumentError, match="port after ':'"):
        R.choose_rdma_port(_machine(), GPU0, "mlx5_2:x")
    with pytest.raises(mori.core.NotFoundError, match="no RDMA device"):
        R.choose_rdma_port([], GPU0)
    down = [_dev("mlx5_0", f"{ROOT0}/0000:00:01.0", 0, (1, "DOWN", "InfiniBand"))]
    with pytest.raises(mori.core.NotFoundError, match="no ACTIVE RDMA port.*mlx5_0 \\(port 1 DOWN"):
        R.choose_rdma_port(down, GPU0)


GIDS = [
    (0, "fe80::1", "IB/RoCE v1"),
    (1, "fe80::1", "RoCE v2"),
    (2, "::ffff:10.0.0.5", "IB/RoCE v1"),
    (3, "::ffff:10.0.0.5", "RoCE v2"),
    (4, "::", ""),
    (5, "2001:db8::5", "RoCE v2"),
]


@pytest.mark.io_testing
def test_gid_choice_prefers_roce_v2_ipv4_mapped():
    assert R.select_gid_index(GIDS, ETH)[0] == 3
    assert R.select_gid_index([g for g in GIDS if g[0] != 3], ETH)[0] == 5
    assert R.select_gid_index([g for g in GIDS if g[0] not in (3, 5)], ETH)[0] == 1
    assert R.select_gid_index([GIDS[0], GIDS[2]], ETH)[0] == 2
    assert "IPv4-mapped" in R.select_gid_index(GIDS, ETH)[1]
    assert R.select_gid_index(GIDS, IB)[0] == 0


@pytest.mark.io_testing
def test_gid_choice_explicit_and_errors():
    assert R.select_gid_index(GIDS, ETH, 1)[0] == 1
    with pytest.raises(mori.core.InvalidArgumentError, match="GID index 4 is an empty"):
        R.select_gid_index(GIDS, ETH, 4)
    with pytest.raises(mori.core.InvalidArgumentError, match="GID index 9 not in"):
        R.select_gid_index(GIDS, ETH, 9)
    with pytest.raises(mori.core.NotFoundError, match="no non-zero GID"):
        R.select_gid_index([(0, "::", "")], ETH)


# -- control-channel codec ---------------------------------------------------------------


def _random_endpoint(rng):
    e = R.EndpointInfo()
    e.qpn, e.psn = rng.randrange(1, 1 << 24), rng.randrange(1 << 24)
    e.lid, e.port_num, e.active_mtu = (
        rng.randrange(1 << 16),
        rng.randrange(1, 256),
        rng.randrange(1, 6),
    )
    e.link_layer, e.gid = rng.choice([IB, ETH]), bytes(rng.randrange(256) for _ in range(16))
    return e


@pytest.mark.io_testing
def test_endpoint_and_region_key_round_trips():
    rng = _seed("codec")
    for _ in range(200):
        eps = [_random_endpoint(rng) for _ in range(rng.randrange(1, 128))]
        blob = R.encode_endpoints(eps)
        assert len(blob) == 8 + 30 * len(eps)
        assert R.decode_endpoints(blob) == eps
        addr, length, rkey = (
            rng.randrange(1 << 47),
            rng.randrange(1, 1 << 40),
            rng.randrange(1 << 32),
        )
        assert R.decode_region_key(R.encode_region_key(addr, length, rkey)) == (addr, length, rkey)


@pytest.mark.io_testing
def test_garbage_payloads_are_rejected_with_what_is_wrong():
    good = R.encode_endpoints([_random_endpoint(random.Random(1))])
    key = R.encode_region_key(4096, 8192, 77)
    bad = {
        b"": "shorter than",
        b"mRDM\x01": "shorter than",
        b"XXXX" + good[4:]: "magic",
        good[:4] + b"\x02" + good[5:]: "format version 2",
        good[:-1]: "announces 1 entry",
        good + b"\0": "announces 1 entry",
        key: "kind 2",
        good[:8] + b"\0" * 30: "QPN 0",
        good[:6] + b"\0\0": "with 0 endpoints",
    }
    for blob, match in bad.items():
        with pytest.raises(mori.core.InvalidArgumentError, match=match):
            R.decode_endpoints(blob)
    mtu_bad = bytearray(good)
    mtu_bad[8 + 11] = 9
    with pytest.raises(mori.core.InvalidArgumentError, match="MTU enum 9"):
        R.decode_endpoints(bytes(mtu_bad))
    link_bad = bytearray(good)
    link_bad[8 + 12] = 3
    with pytest.raises(mori.core.InvalidArgumentError, match="link layer 3"):
        R.decode_endpoints(bytes(link_bad))
    with pytest.raises(mori.core.InvalidArgumentError, match="kind 1"):
        R.decode_region_key(good)
    with pytest.raises(mori.core.InvalidArgumentError, match="length 0"):
        R.decode_region_key(R.encode_region_key(1, 0, 1))
    with pytest.raises(mori.core.InvalidArgumentError, match="wraps"):
        R.decode_region_key(R.encode_region_key(2**64 - 8, 16, 1))
    with pytest.raises(mori.core.InvalidArgumentError, match="endpoint count 0"):
        R.encode_endpoints([])


@pytest.mark.io_testing
def test_random_bytes_never_decode_silently():
    rng = _seed("fuzz")
    good = R.encode_endpoints([_random_endpoint(rng) for _ in range(2)])
    for _ in range(2000):
        blob = bytearray(good if rng.random() < 0.5 else rng.randbytes(rng.randrange(0, 80)))
        for _ in range(rng.randrange(1, 4)):
            if blob:
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        try:
            eps = R.decode_endpoints(bytes(blob))
        except mori.core.InvalidArgumentError:
            continue
        assert R.encode_endpoints(eps) == bytes(blob)  # whatever decodes re-encodes exactly


# -- send-queue accounting -----------------------------------------------------------------


@pytest.mark.io_testing
def test_send_queue_tracker_accounts_in_order_and_drains_on_failure():
    t = R.SendQueueTracker(8)
    t.posted([(False, 0), (False, 0), (True, 3)], slot=5)
    t.posted([(True, 1), (False, 0), (True, 2)], slot=6)
    assert t.outstanding == 6 and t.expected_completions == 3
    assert t.fits(2) and not t.fits(3)
    with pytest.raises(mori.core.InvalidArgumentError, match="does not fit"):
        t.posted([(False, 0), (False, 0), (True, 3)], slot=7)
    assert t.completed(R.encode_wr_id(1, 3, 5)) == 5
    assert t.outstanding == 3
    with pytest.raises(mori.core.InternalError, match="in order"):
        t.completed(R.encode_wr_id(1, 2, 6))  # slot 6 retiring 1 is due first
    assert t.completed(R.encode_wr_id(1, 1, 6)) == 6
    assert t.drain() == [(6, 1)] and t.outstanding == 0 and t.expected_completions == 0


@pytest.mark.io_testing
def test_send_queue_tracker_refuses_chains_that_would_never_free_their_slots():
    t = R.SendQueueTracker(8)
    with pytest.raises(mori.core.InvalidArgumentError, match="ends unsignaled"):
        t.posted([(True, 1), (False, 0)], slot=1)
    with pytest.raises(mori.core.InvalidArgumentError, match="retire"):
        t.posted([(False, 0), (True, 1)], slot=1)
    assert t.outstanding == 0


@pytest.mark.io_testing
def test_planned_slices_feed_the_tracker_exactly():
    """Posting a plan batch by batch into a queue of any depth never blocks for good:
    each batch ends signaled, so completing the oldest always makes room."""
    rng = _seed("plan+tracker")
    for _ in range(50):
        depth = rng.randrange(4, 64)
        p = _plan(spans=[(0, 0, rng.randrange(1, 200) * 64)], max_message_bytes=64,
                  signal_interval=rng.randrange(1, depth + 1),
                  post_batch_size=rng.randrange(1, depth + 1))  # fmt: skip
        wrs = p["qps"][0]["wrs"]
        t = R.SendQueueTracker(depth)
        due = collections.deque()  # retire counts of posted signaled WRs, oldest first
        i = 0
        while i < len(wrs):
            end = next(j for j in range(i, len(wrs)) if wrs[j]["batch_end"]) + 1
            while not t.fits(end - i):
                assert due, "a batch that can never fit"
                assert t.completed(R.encode_wr_id(1, due.popleft(), 3)) == 3
            t.posted([(w["signaled"], w["retire"]) for w in wrs[i:end]], slot=3)
            due.extend(w["retire"] for w in wrs[i:end] if w["signaled"])
            i = end
        while due:
            t.completed(R.encode_wr_id(1, due.popleft(), 3))
        assert t.outstanding == 0 and t.expected_completions == 0


# -- RdmaBackendConfig -----------------------------------------------------------------------


def test_config_defaults_validate_and_reach_native():
    c = RdmaBackendConfig(qp_per_transfer=4, timeout=18, retry_cnt=5, path_mtu=2048,
                          device_name="mlx5_1:1", poll_cq_mode=PollCqMode.EVENT)  # fmt: skip
    n = c.to_native()
    assert (n.qp_per_transfer, n.device_name) == (4, "mlx5_1:1")
    assert (n.qp.timeout, n.qp.retry_cnt, n.qp.max_path_mtu) == (18, 5, 4)
    assert n.poll_cq_mode == _C.rdma.PollCqMode.EVENT
    RdmaBackendConfig()  # defaults are valid


@pytest.mark.parametrize(
    "field, value",
    [
        ("qp_per_transfer", 0), ("qp_per_transfer", 128), ("num_worker_threads", 65),
        ("timeout", 32), ("retry_cnt", 8), ("rnr_retry", -1), ("min_rnr_timer", 32),
        ("max_rd_atomic", 0), ("gid_index", -2), ("port", 256), ("service_level", 16),
        ("max_send_wr", 1 << 17), ("notif_per_qp", 0), ("post_batch_size", 2048),
        ("signal_interval", 0), ("path_mtu", 1500), ("gpu_index", -5), ("poll_cq_mode", 7),
        ("qp_per_transfer", 1.5), ("enable_notification", 1), ("max_message_bytes", 1 << 32),
    ],
)  # fmt: skip
def test_config_rejects_bad_values_naming_them(field, value):
    with pytest.raises(
        mori.core.InvalidArgumentError, match=f"RdmaBackendConfig.{field}={value!r}"
    ):
        RdmaBackendConfig(**{field: value})


def test_native_config_validation_names_the_field():
    n = _C.rdma.BackendConfig()
    n.signal_interval = 5000
    with pytest.raises(mori.core.InvalidArgumentError, match="signal_interval 5000"):
        n.validate()
