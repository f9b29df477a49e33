# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.core.topology: discovery on this machine, a fake sysfs, the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mori.core import _C
from mori.core.topology import Topology, format_table, get_topology

TOPO = get_topology()
requires_gpu = pytest.mark.skipif(
    not TOPO.gpus, reason=f"no CUDA GPU: {TOPO.cuda.unavailable_reason}"
)
BUS_ID = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
DISTANCES = {"PIX", "PXB", "PHB", "NODE", "SYS", "UNKNOWN"}
TOP_KEYS = {"cpu", "cuda", "gpus", "gpu_links", "rdma_devices", "net_interfaces", "nearest_nics"}


def _sysfs_interfaces() -> set[str]:
    root = Path("/sys/class/net")
    if not root.is_dir():
        return set()
    return {p.name for p in root.iterdir() if p.is_dir() and p.name != "lo"}


def test_cpu_counts_match_the_os():
    assert TOPO.cpu.online_cpus == os.cpu_count()
    assert TOPO.cpu.affinity_cpus == len(os.sched_getaffinity(0))
    assert TOPO.cpu.numa_nodes
    numa_cpus = {c for n in TOPO.cpu.numa_nodes for c in n.cpus}
    assert os.sched_getaffinity(0) <= numa_cpus
    assert all(n.mem_total_bytes > 0 for n in TOPO.cpu.numa_nodes)


def test_shapes_are_consistent():
    assert TOPO.cuda.device_count == len(TOPO.gpus)
    assert len(TOPO.gpu_links) == len(TOPO.gpus)
    assert all(len(row) == len(TOPO.gpus) for row in TOPO.gpu_links)
    assert [n.gpu for n in TOPO.nearest_nics] == [g.index for g in TOPO.gpus]
    assert bool(TOPO.gpus) != bool(TOPO.cuda.unavailable_reason)


def test_net_interfaces_match_sysfs():
    assert {n.name for n in TOPO.net_interfaces} == _sysfs_interfaces()
    for nic in TOPO.net_interfaces:
        assert nic.pci_bus_id == "" or BUS_ID.match(nic.pci_bus_id), nic
        if nic.is_virtual:
            assert nic.pci_bus_id == ""


def test_rdma_devices_match_sysfs():
    root = Path("/sys/class/infiniband")
    expected = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    assert [r.name for r in TOPO.rdma_devices] == expected


def test_to_dict_matches_native_shape_and_round_trips_through_json():
    raw = _C.topology()
    assert set(raw) == TOP_KEYS
    # from_dict takes exactly the native keys, so this fails on any drift.
    assert Topology.from_dict(raw).to_dict() == raw
    d = TOPO.to_dict()
    text = json.dumps(d)
    assert json.loads(text) == d
    assert Topology.from_dict(json.loads(text)) == TOPO


def test_table_names_every_section():
    table = format_table(TOPO)
    for title in ("CPU", "GPUs", "RDMA devices", "Network interfaces"):
        assert f"\n{title}\n" in f"\n{table}"
    if not TOPO.gpus:
        assert f"no CUDA GPUs: {TOPO.cuda.unavailable_reason}" in table
        assert "GPU links" not in table
    if not TOPO.rdma_devices:
        assert "no RDMA devices" in table


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _symlink(target: str, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def test_fake_sysfs(tmp_path):
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    _write(proc_root / "cpuinfo", "processor\t: 0\nmodel name\t: Fake CPU\n")
    _write(sys_root / "devices/system/cpu/online", "0-3\n")
    _write(sys_root / "devices/system/node/node0/cpulist", "0-1\n")
    _write(sys_root / "devices/system/node/node0/meminfo", "Node 0 MemTotal: 1024 kB\n")
    _write(sys_root / "devices/system/node/node1/cpulist", "2-3\n")
    _write(sys_root / "devices/system/node/node1/meminfo", "Node 1 MemTotal: 2048 kB\n")
    bdf = "0000:41:00.0"
    pci = sys_root / "devices/pci0000:40/0000:40:01.0" / bdf
    _write(pci / "numa_node", "1\n")
    ib = pci / "infiniband/mlx5_3"
    _symlink(f"../../../{bdf}", ib / "device")
    _write(ib / "ports/1/state", "4: ACTIVE\n")
    _write(ib / "ports/1/link_layer", "Ethernet\n")
    _write(ib / "ports/1/rate", "200 Gb/sec (4X HDR)\n")
    _symlink(
        f"../../devices/pci0000:40/0000:40:01.0/{bdf}/infiniband/mlx5_3",
        sys_root / "class/infiniband/mlx5_3",
    )
    net = pci / "net/ens3"
    _write(net / "operstate", "up\n")
    _write(net / "mtu", "9000\n")
    _write(net / "speed", "200000\n")
    _symlink(f"../../../{bdf}", net / "device")
    _symlink(f"../../devices/pci0000:40/0000:40:01.0/{bdf}/net/ens3", sys_root / "class/net/ens3")

    topo = get_topology(sysfs_root=str(sys_root), proc_root=str(proc_root), discover_gpus=False)
    assert topo.cpu.online_cpus == 4
    assert topo.cpu.model_name == "Fake CPU"
    assert [(n.id, n.cpus, n.mem_total_bytes) for n in topo.cpu.numa_nodes] == [
        (0, [0, 1], 1024 * 1024),
        (1, [2, 3], 2048 * 1024),
    ]
    (rdma,) = topo.rdma_devices
    assert (rdma.name, rdma.pci_bus_id, rdma.numa_node, rdma.netdevs) == (
        "mlx5_3",
        bdf,
        1,
        ["ens3"],
    )
    assert [(p.port, p.state, p.link_layer, p.rate) for p in rdma.ports] == [
        (1, "ACTIVE", "Ethernet", "200 Gb/sec (4X HDR)")
    ]
    (nic,) = topo.net_interfaces
    assert (nic.name, nic.speed_mbps, nic.mtu, nic.pci_bus_id, nic.numa_node, nic.is_virtual) == (
        "ens3",
        200000,
        9000,
        bdf,
        1,
        False,
    )
    assert topo.gpus == [] and topo.nearest_nics == []
    table = format_table(topo)
    assert "mlx5_3" in table and "0-1" in table and "2-3" in table


def _run_cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mori.core.topology", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_prints_tables():
    out = _run_cli()
    assert "CPU" in out and "GPUs" in out and "Network interfaces" in out
    assert f"{os.cpu_count()} online CPUs" in out


def test_cli_json():
    d = json.loads(_run_cli("--json"))
    assert set(d) == TOP_KEYS
    assert d["cpu"]["online_cpus"] == os.cpu_count()
    assert d["cpu"]["affinity_cpus"] == len(os.sched_getaffinity(0))
    assert d["cuda"]["device_count"] == len(d["gpus"])
    assert {n["name"] for n in d["net_interfaces"]} == _sysfs_interfaces()
    Topology.from_dict(d)


@requires_gpu
def test_gpus_have_pci_locations_and_properties():
    for i, gpu in enumerate(TOPO.gpus):
        assert gpu.index == i
        assert gpu.name
        assert BUS_ID.match(gpu.pci_bus_id), gpu.pci_bus_id
        sysfs = Path("/sys/bus/pci/devices") / gpu.pci_bus_id
        if sysfs.exists():
            assert gpu.pci_path == str(sysfs.resolve())
            numa = int((sysfs / "numa_node").read_text())
            assert gpu.numa_node == (numa if numa >= 0 else -1)
        assert gpu.compute_capability_major >= 3
        assert gpu.total_memory_bytes > 0 and gpu.sm_count > 0
    table = format_table(TOPO)
    for gpu in TOPO.gpus:
        cc = f"{gpu.compute_capability_major}.{gpu.compute_capability_minor}"
        assert re.search(rf"GPU{gpu.index} .* {re.escape(cc)} ", table), table


@requires_gpu
def test_gpu_link_matrix():
    n = len(TOPO.gpus)
    nv = re.compile(r"^NV[1-9][0-9]*$")
    for i in range(n):
        assert TOPO.gpu_links[i][i].type == "self"
        for j in range(n):
            if i == j:
                continue
            link = TOPO.gpu_links[i][j]
            assert link.type in {"P2P/PCIe", "P2P", "none"} or nv.match(link.type), link
            # NVLink counts and PCIe peer access are symmetric.
            assert link.nvlink_count == TOPO.gpu_links[j][i].nvlink_count
            if TOPO.cuda.link_source == "nvml":
                assert link.nvlink_count >= 0
                assert (link.nvlink_count > 0) == link.type.startswith("NV")
            else:
                assert link.nvlink_count == -1
    for nic in TOPO.nearest_nics:
        assert nic.distance in DISTANCES


@requires_gpu
def test_gpu_count_matches_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    assert len(TOPO.gpus) == torch.cuda.device_count()
    for gpu in TOPO.gpus:
        assert gpu.name == torch.cuda.get_device_name(gpu.index)
