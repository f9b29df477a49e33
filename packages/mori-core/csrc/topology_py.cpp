// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "bindings.hpp"
#include "mori/topology/topology.hpp"

namespace py = pybind11;

namespace mori::python {
namespace {

using topology::PciDistanceName;

py::dict ToDict(const topology::CpuInfo& cpu) {
  py::list nodes;
  for (const auto& node : cpu.numa_nodes) {
    py::dict d;
    d["id"] = node.id;
    d["cpus"] = node.cpus;
    d["mem_total_bytes"] = node.mem_total_bytes;
    nodes.append(std::move(d));
  }
  py::dict d;
  d["online_cpus"] = cpu.online_cpus;
  d["affinity_cpus"] = cpu.affinity_cpus;
  d["model_name"] = cpu.model_name;
  d["numa_nodes"] = std::move(nodes);
  return d;
}

py::dict ToDict(const topology::Gpu& gpu) {
  py::dict d;
  d["index"] = gpu.index;
  d["name"] = gpu.name;
  d["pci_bus_id"] = gpu.pci_bus_id;
  d["pci_path"] = gpu.pci_path;
  d["numa_node"] = gpu.numa_node;
  d["compute_capability_major"] = gpu.compute_capability_major;
  d["compute_capability_minor"] = gpu.compute_capability_minor;
  d["total_memory_bytes"] = gpu.total_memory_bytes;
  d["sm_count"] = gpu.sm_count;
  d["fabric_handle_supported"] = gpu.fabric_handle_supported;
  d["posix_fd_handle_supported"] = gpu.posix_fd_handle_supported;
  return d;
}

py::dict ToDict(const topology::GpuLink& link) {
  py::dict d;
  d["type"] = link.type;
  d["p2p_access"] = link.p2p_access;
  d["nvlink_count"] = link.nvlink_count;
  d["performance_rank"] = link.performance_rank;
  d["native_atomics"] = link.native_atomics;
  return d;
}

py::dict ToDict(const topology::RdmaDevice& dev) {
  py::list ports;
  for (const auto& port : dev.ports) {
    py::dict p;
    p["port"] = port.port;
    p["state"] = port.state;
    p["link_layer"] = port.link_layer;
    p["rate"] = port.rate;
    ports.append(std::move(p));
  }
  py::dict d;
  d["name"] = dev.name;
  d["pci_bus_id"] = dev.pci_bus_id;
  d["pci_path"] = dev.pci_path;
  d["numa_node"] = dev.numa_node;
  d["netdevs"] = dev.netdevs;
  d["ports"] = std::move(ports);
  return d;
}

py::dict ToDict(const topology::NetInterface& nic) {
  py::dict d;
  d["name"] = nic.name;
  d["operstate"] = nic.operstate;
  d["speed_mbps"] = nic.speed_mbps;
  d["mtu"] = nic.mtu;
  d["pci_bus_id"] = nic.pci_bus_id;
  d["pci_path"] = nic.pci_path;
  d["numa_node"] = nic.numa_node;
  d["is_virtual"] = nic.is_virtual;
  return d;
}

py::dict ToDict(const topology::NearestNic& nic) {
  py::dict d;
  d["gpu"] = nic.gpu;
  d["nic"] = nic.nic;
  d["kind"] = nic.kind;
  d["netdev"] = nic.netdev;
  d["pci_bus_id"] = nic.pci_bus_id;
  d["distance"] = PciDistanceName(nic.distance);
  return d;
}

template <typename T>
py::list ToList(const std::vector<T>& items) {
  py::list out;
  for (const T& item : items) out.append(ToDict(item));
  return out;
}

py::dict ToDict(const topology::Topology& topo) {
  py::list links;
  for (const auto& row : topo.gpu_links) links.append(ToList(row));
  py::dict cuda;
  cuda["compiled"] = topo.cuda_compiled;
  cuda["device_count"] = topo.gpus.size();
  cuda["unavailable_reason"] = topo.gpu_unavailable_reason;
  cuda["link_source"] = topo.gpu_link_source;
  cuda["nvml_status"] = topo.nvml_status;
  py::dict d;
  d["cpu"] = ToDict(topo.cpu);
  d["cuda"] = std::move(cuda);
  d["gpus"] = ToList(topo.gpus);
  d["gpu_links"] = std::move(links);
  d["rdma_devices"] = ToList(topo.rdma_devices);
  d["net_interfaces"] = ToList(topo.net_interfaces);
  d["nearest_nics"] = ToList(topo.nearest_nics);
  return d;
}

}  // namespace

void register_topology(py::module_& m) {
  m.def(
      "topology",
      [](const std::string& sysfs_root, const std::string& proc_root, bool discover_gpus) {
        topology::DiscoverOptions options;
        options.sysfs_root = sysfs_root;
        options.proc_root = proc_root;
        options.discover_gpus = discover_gpus;
        topology::Topology topo;
        {
          // Discovery reads sysfs and may initialize the CUDA driver and NVML:
          // other Python threads run meanwhile.
          py::gil_scoped_release release;
          topo = topology::Discover(options);
        }
        return ToDict(topo);
      },
      py::arg("sysfs_root") = "/sys", py::arg("proc_root") = "/proc",
      py::arg("discover_gpus") = true,
      R"doc(Discover this node's topology and return it as plain dicts and lists.

Keys: ``cpu`` (online_cpus, affinity_cpus, model_name, numa_nodes[id, cpus,
mem_total_bytes]), ``cuda`` (compiled, device_count, unavailable_reason,
link_source "nvml"/"cuda"/"", nvml_status), ``gpus`` (index, name, pci_bus_id,
pci_path, numa_node, compute_capability_major/minor, total_memory_bytes, sm_count,
fabric_handle_supported, posix_fd_handle_supported), ``gpu_links`` (an N x N list
of type, p2p_access, nvlink_count, performance_rank, native_atomics),
``rdma_devices`` (name, pci_bus_id, pci_path, numa_node, netdevs, ports[port,
state, link_layer, rate]), ``net_interfaces`` (name, operstate, speed_mbps, mtu,
pci_bus_id, pci_path, numa_node, is_virtual) and ``nearest_nics`` (one per GPU:
gpu, nic, kind "rdma"/"net", netdev, pci_bus_id, distance PIX/PXB/PHB/NODE/SYS/
UNKNOWN). ``sysfs_root``/``proc_root`` point discovery at another tree (tests).)doc");
}

}  // namespace mori::python
