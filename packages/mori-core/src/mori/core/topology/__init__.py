# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Node topology: CPUs and NUMA nodes, CUDA GPUs and their links, NICs.

``get_topology()`` asks libmori_core (sysfs, procfs, the CUDA runtime and NVML) and
returns a :class:`Topology`; ``format_table`` renders it as ``python -m
mori.core.topology`` prints it. Machines without GPUs or NICs are described too:
the missing parts are empty and ``Topology.cuda.unavailable_reason`` says why.

PCI distances use NCCL's names, closest first: PIX (one bridge or one PCIe
switch between the devices), PXB (several bridges), PHB (through a host bridge),
NODE (across root complexes of one NUMA node), SYS (across NUMA nodes), UNKNOWN
(one side has no PCI device, e.g. a virtual interface).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from mori.core import _C

__all__ = [
    "CpuInfo",
    "CudaInfo",
    "Gpu",
    "GpuLink",
    "NearestNic",
    "NetInterface",
    "NumaNode",
    "RdmaDevice",
    "RdmaPort",
    "Topology",
    "format_table",
    "get_topology",
]


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its id, CPU ids and memory in bytes."""

    id: int
    cpus: list[int]
    mem_total_bytes: int


@dataclass(frozen=True)
class CpuInfo:
    """Online CPUs of the machine, those this process may use, and the NUMA nodes."""

    online_cpus: int
    affinity_cpus: int
    model_name: str
    numa_nodes: list[NumaNode]


@dataclass(frozen=True)
class CudaInfo:
    """Whether libmori_core has CUDA, how many GPUs it sees, and why none if so.

    ``link_source`` is "nvml" when NVLink counts come from NVML, "cuda" when only
    CUDA's peer-access answers were available (``nvml_status`` then says why), and
    "" without GPUs.
    """

    compiled: bool
    device_count: int
    unavailable_reason: str
    link_source: str
    nvml_status: str


@dataclass(frozen=True)
class Gpu:
    """A CUDA device (``index`` is the CUDA runtime ordinal); memory in bytes."""

    index: int
    name: str
    pci_bus_id: str
    pci_path: str
    numa_node: int
    compute_capability_major: int
    compute_capability_minor: int
    total_memory_bytes: int
    sm_count: int
    fabric_handle_supported: bool
    posix_fd_handle_supported: bool


@dataclass(frozen=True)
class GpuLink:
    """How GPU i reaches GPU j.

    ``type`` is "self", "NV<n>" (n NVLinks, direct or through NVSwitches),
    "P2P/PCIe" (peer access without NVLink), "P2P" (peer access, medium unknown
    because NVML was unavailable) or "none". ``nvlink_count`` is -1 when NVML could
    not tell; ``performance_rank`` is CUDA's relative rank, -1 when not queried.
    """

    type: str
    p2p_access: bool
    nvlink_count: int
    performance_rank: int
    native_atomics: bool


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device, as sysfs reports it."""

    port: int
    state: str
    link_layer: str
    rate: str


@dataclass(frozen=True)
class RdmaDevice:
    """An RDMA device from /sys/class/infiniband and its network interfaces."""

    name: str
    pci_bus_id: str
    pci_path: str
    numa_node: int
    netdevs: list[str]
    ports: list[RdmaPort]


@dataclass(frozen=True)
class NetInterface:
    """A network interface from /sys/class/net (``lo`` excluded).

    ``speed_mbps`` is -1 when the driver does not report it; ``pci_bus_id`` is ""
    for interfaces without a PCI function (``is_virtual`` ones and others).
    """

    name: str
    operstate: str
    speed_mbps: int
    mtu: int
    pci_bus_id: str
    pci_path: str
    numa_node: int
    is_virtual: bool


@dataclass(frozen=True)
class NearestNic:
    """The NIC closest to one GPU; ``nic`` is "" when the node has none."""

    gpu: int
    nic: str
    kind: str
    netdev: str
    pci_bus_id: str
    distance: str


@dataclass(frozen=True)
class Topology:
    """Everything ``get_topology`` found; ``gpu_links[i][j]`` links gpus[i] to gpus[j]."""

    cpu: CpuInfo
    cuda: CudaInfo
    gpus: list[Gpu] = field(default_factory=list)
    gpu_links: list[list[GpuLink]] = field(default_factory=list)
    rdma_devices: list[RdmaDevice] = field(default_factory=list)
    net_interfaces: list[NetInterface] = field(default_factory=list)
    nearest_nics: list[NearestNic] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists (JSON-serializable), the same shape ``_C.topology`` returns."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        """Inverse of :meth:`to_dict`."""
        cpu = d["cpu"]
        return cls(
            cpu=CpuInfo(
                online_cpus=cpu["online_cpus"],
                affinity_cpus=cpu["affinity_cpus"],
                model_name=cpu["model_name"],
                numa_nodes=[NumaNode(**n) for n in cpu["numa_nodes"]],
            ),
            cuda=CudaInfo(**d["cuda"]),
            gpus=[Gpu(**g) for g in d["gpus"]],
            gpu_links=[[GpuLink(**link) for link in row] for row in d["gpu_links"]],
            rdma_devices=[
                RdmaDevice(**{**r, "ports": [RdmaPort(**p) for p in r["ports"]]})
                for r in d["rdma_devices"]
            ],
            net_interfaces=[NetInterface(**n) for n in d["net_interfaces"]],
            nearest_nics=[NearestNic(**n) for n in d["nearest_nics"]],
        )


def get_topology(
    *, sysfs_root: str = "/sys", proc_root: str = "/proc", discover_gpus: bool = True
) -> Topology:
    """Discover this node's topology.

    Releases the GIL while it reads sysfs and asks CUDA/NVML. The first call may
    initialize the CUDA driver but creates no context. ``sysfs_root`` and
    ``proc_root`` point discovery at another tree (tests); ``discover_gpus=False``
    skips CUDA altogether.
    """
    return Topology.from_dict(
        _C.topology(sysfs_root=sysfs_root, proc_root=proc_root, discover_gpus=discover_gpus)
    )


def _cpu_ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8" (the kernel's cpulist spelling)."""
    parts: list[str] = []
    start = prev = None
    for cpu in cpus:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts) or "-"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _numa(node: int) -> str:
    return "-" if node < 0 else str(node)


def _section(title: str, body: str) -> str:
    return f"{title}\n{'=' * len(title)}\n{body}"


def format_table(topo: Topology) -> str:
    """Render ``topo`` as the text tables ``python -m mori.core.topology`` prints.

    Sections: CPU/NUMA, GPUs, the GPU link matrix (as ``nvidia-smi topo -m``:
    NV<n>, P2P/PCIe, P2P, none, X on the diagonal), RDMA devices, network
    interfaces, and the nearest NIC of each GPU.
    """
    out: list[str] = []

    cpu = topo.cpu
    numa_rows = [
        [n.id, _cpu_ranges(n.cpus), len(n.cpus), _gib(n.mem_total_bytes)] for n in cpu.numa_nodes
    ]
    out.append(
        _section(
            "CPU",
            f"{cpu.model_name or 'unknown model'}: {cpu.online_cpus} online CPUs, "
            f"{cpu.affinity_cpus} usable by this process\n"
            + tabulate(numa_rows, headers=["NUMA node", "CPUs", "count", "memory"]),
        )
    )

    if topo.gpus:
        gpu_rows = [
            [
                f"GPU{g.index}",
                g.name,
                g.pci_bus_id,
                _numa(g.numa_node),
                f"{g.compute_capability_major}.{g.compute_capability_minor}",
                _gib(g.total_memory_bytes),
                g.sm_count,
                "yes" if g.fabric_handle_supported else "no",
                "yes" if g.posix_fd_handle_supported else "no",
            ]
            for g in topo.gpus
        ]
        body = tabulate(
            gpu_rows,
            headers=[
                "GPU",
                "name",
                "PCI bus id",
                "NUMA",
                "CC",
                "memory",
                "SMs",
                "fabric",
                "POSIX fd",
            ],
            # "9.0" must stay a version, not become the number 9.
            disable_numparse=[4],
        )
    else:
        body = f"no CUDA GPUs: {topo.cuda.unavailable_reason}"
    out.append(_section("GPUs", body))

    if topo.gpus:
        names = [f"GPU{g.index}" for g in topo.gpus]
        matrix = [
            [names[i]] + ["X" if link.type == "self" else link.type for link in row]
            for i, row in enumerate(topo.gpu_links)
        ]
        legend = (
            "X = self, NV<n> = n NVLinks, P2P/PCIe = peer access over PCIe, none = no peer access"
        )
        if topo.cuda.link_source != "nvml":
            legend += (
                "\nP2P = peer access, NVLink unknown: NVML unavailable "
                f"({topo.cuda.nvml_status or 'no reason given'})"
            )
        out.append(_section("GPU links", tabulate(matrix, headers=[""] + names) + "\n" + legend))

    if topo.rdma_devices:
        rdma_rows = [
            [
                r.name,
                r.pci_bus_id or "-",
                _numa(r.numa_node),
                ",".join(r.netdevs) or "-",
                "; ".join(f"{p.port}: {p.state} {p.link_layer} {p.rate}".strip() for p in r.ports)
                or "-",
            ]
            for r in topo.rdma_devices
        ]
        body = tabulate(
            rdma_rows, headers=["RDMA device", "PCI bus id", "NUMA", "netdevs", "ports"]
        )
    else:
        body = "no RDMA devices"
    out.append(_section("RDMA devices", body))

    if topo.net_interfaces:
        net_rows = [
            [
                n.name,
                n.operstate,
                "-" if n.speed_mbps < 0 else f"{n.speed_mbps} Mb/s",
                n.mtu,
                n.pci_bus_id or "-",
                _numa(n.numa_node),
                "yes" if n.is_virtual else "no",
            ]
            for n in topo.net_interfaces
        ]
        body = tabulate(
            net_rows,
            headers=["interface", "state", "speed", "MTU", "PCI bus id", "NUMA", "virtual"],
        )
    else:
        body = "no network interfaces"
    out.append(_section("Network interfaces", body))

    if topo.gpus:
        nic_rows = [
            [
                f"GPU{n.gpu}",
                n.nic or "none",
                n.kind or "-",
                n.netdev or "-",
                n.pci_bus_id or "-",
                n.distance,
            ]
            for n in topo.nearest_nics
        ]
        body = tabulate(
            nic_rows, headers=["GPU", "nearest NIC", "kind", "netdev", "PCI bus id", "distance"]
        )
        out.append(_section("Nearest NIC per GPU", body))

    return "\n\n".join(out)
