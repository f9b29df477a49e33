// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/topology/topology.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <tuple>

#include "mori/core/cuda.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "topology/gpu.hpp"
#include "topology/sysfs.hpp"

namespace mori::topology {
namespace {

// A device's place in the PCI tree: the host bridge it hangs off ("pci0000:00")
// and the chain of functions from its root port down to itself.
struct PciChain {
  std::string root;
  std::vector<std::string> functions;
};

bool IsHostBridgeComponent(const std::string& c) {
  // "pci" + domain (4 or more hex digits) + ":" + bus (2 hex digits).
  if (c.size() < 10 || c.compare(0, 3, "pci") != 0) return false;
  size_t colon = c.find(':', 3);
  if (colon == std::string::npos || colon < 7 || c.size() != colon + 3) return false;
  for (size_t i = 3; i < c.size(); ++i) {
    if (i != colon && !std::isxdigit(static_cast<unsigned char>(c[i]))) return false;
  }
  return true;
}

// Components after the first host bridge; a nested one (a VMD domain) counts as a
// bridge level of the chain.
bool ParsePciChain(const std::string& path, PciChain* chain) {
  std::istringstream parts(path);
  std::string part;
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    if (chain->root.empty()) {
      if (IsHostBridgeComponent(part)) chain->root = part;
      continue;
    }
    if (!detail::IsPciBusIdComponent(part) && !IsHostBridgeComponent(part)) break;
    chain->functions.push_back(part);
  }
  return !chain->root.empty() && !chain->functions.empty();
}

bool ParseHex(const std::string& text, size_t max_digits, unsigned long* value) {
  if (text.empty() || text.size() > max_digits) return false;
  for (char c : text) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  *value = std::strtoul(text.c_str(), nullptr, 16);
  return true;
}

}  // namespace

const char* PciDistanceName(PciDistance distance) noexcept {
  switch (distance) {
    case PciDistance::kPix:
      return "PIX";
    case PciDistance::kPxb:
      return "PXB";
    case PciDistance::kPhb:
      return "PHB";
    case PciDistance::kNode:
      return "NODE";
    case PciDistance::kSys:
      return "SYS";
    case PciDistance::kUnknown:
      break;
  }
  return "UNKNOWN";
}

PciDistance ComputePciDistance(const std::string& path_a, int numa_a, const std::string& path_b,
                               int numa_b) {
  PciChain a;
  PciChain b;
  if (!ParsePciChain(path_a, &a) || !ParsePciChain(path_b, &b)) return PciDistance::kUnknown;
  if (a.root != b.root) {
    const bool same_node = numa_a < 0 || numa_b < 0 || numa_a == numa_b;
    return same_node ? PciDistance::kNode : PciDistance::kSys;
  }
  size_t common = 0;
  while (common < a.functions.size() && common < b.functions.size() &&
         a.functions[common] == b.functions[common]) {
    ++common;
  }
  // No shared root port: the path turns around in the host bridge.
  if (common == 0) return PciDistance::kPhb;
  // Bridges each side climbs through below the deepest shared one. A PCIe switch
  // shows in sysfs as an upstream port over its downstream ports, so two devices
  // on one switch each climb one downstream port and meet at the upstream port.
  auto below = [common](const PciChain& c) {
    return c.functions.size() > common ? c.functions.size() - common - 1 : 0;
  };
  return below(a) <= 1 && below(b) <= 1 ? PciDistance::kPix : PciDistance::kPxb;
}

std::vector<int> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  std::string list = text;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [](unsigned char c) { return std::isspace(c) != 0; }),
             list.end());
  if (list.empty()) return cpus;
  std::istringstream items(list);
  std::string item;
  auto parse_int = [&](const std::string& s) {
    MORI_CHECK_ARG(
        !s.empty() && s.size() <= 7 &&
            std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; }),
        "CPU list '", text, "' has a malformed item '", item, "'");
    return std::atoi(s.c_str());
  };
  while (std::getline(items, item, ',')) {
    size_t dash = item.find('-');
    if (dash == std::string::npos) {
      cpus.push_back(parse_int(item));
      continue;
    }
    int first = parse_int(item.substr(0, dash));
    int last = parse_int(item.substr(dash + 1));
    MORI_CHECK_ARG(first <= last, "CPU list '", text, "' has a descending range '", item, "'");
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  MORI_CHECK_ARG(list.back() != ',', "CPU list '", text, "' ends with a comma");
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string NormalizePciBusId(const std::string& bus_id) {
  // domain:bus:device.function, the domain optional (lspci prints it so).
  std::vector<std::string> fields;
  std::istringstream parts(bus_id);
  std::string field;
  while (std::getline(parts, field, ':')) fields.push_back(field);
  unsigned long domain = 0, bus = 0, device = 0, function = 0;
  bool ok = fields.size() == 2 || fields.size() == 3;
  if (ok && fields.size() == 3) ok = ParseHex(fields[0], 8, &domain);
  if (ok) {
    const std::string& bus_field = fields[fields.size() - 2];
    const std::string& dev_fn = fields.back();
    size_t dot = dev_fn.find('.');
    ok = ParseHex(bus_field, 2, &bus) && dot != std::string::npos &&
         ParseHex(dev_fn.substr(0, dot), 2, &device) &&
         ParseHex(dev_fn.substr(dot + 1), 1, &function) && device < 32 && function < 8;
  }
  MORI_CHECK_ARG(ok, "'", bus_id, "' is not a PCI bus id (domain:bus:device.function)");
  char out[32];
  std::snprintf(out, sizeof(out), "%04lx:%02lx:%02lx.%lx", domain, bus, device, function);
  return out;
}

std::vector<NearestNic> FindNearestNics(const std::vector<Gpu>& gpus,
                                        const std::vector<RdmaDevice>& rdma_devices,
                                        const std::vector<NetInterface>& net_interfaces) {
  struct Candidate {
    NearestNic nic;
    const std::string* pci_path;
    int numa_node;
    bool is_virtual;
  };
  std::vector<Candidate> candidates;
  for (const RdmaDevice& dev : rdma_devices) {
    NearestNic nic;
    nic.nic = dev.name;
    nic.kind = "rdma";
    nic.netdev = dev.netdevs.empty() ? "" : dev.netdevs.front();
    nic.pci_bus_id = dev.pci_bus_id;
    candidates.push_back({nic, &dev.pci_path, dev.numa_node, dev.pci_path.empty()});
  }
  for (const NetInterface& iface : net_interfaces) {
    NearestNic nic;
    nic.nic = iface.name;
    nic.kind = "net";
    nic.netdev = iface.name;
    nic.pci_bus_id = iface.pci_bus_id;
    candidates.push_back({nic, &iface.pci_path, iface.numa_node, iface.is_virtual});
  }

  std::vector<NearestNic> result;
  for (const Gpu& gpu : gpus) {
    NearestNic best;
    best.gpu = gpu.index;
    bool found = false;
    auto key = [](const NearestNic& n, bool is_virtual) {
      return std::make_tuple(static_cast<int>(n.distance), n.kind != "rdma", is_virtual, n.nic);
    };
    bool best_virtual = false;
    for (const Candidate& c : candidates) {
      NearestNic nic = c.nic;
      nic.gpu = gpu.index;
      nic.distance = ComputePciDistance(gpu.pci_path, gpu.numa_node, *c.pci_path, c.numa_node);
      if (!found || key(nic, c.is_virtual) < key(best, best_virtual)) {
        best = nic;
        best_virtual = c.is_virtual;
        found = true;
      }
    }
    result.push_back(best);
  }
  return result;
}

std::vector<std::vector<GpuLink>> BuildGpuLinkMatrix(
    const std::vector<std::vector<bool>>& p2p_access, const NvLinkCounts* nvlink) {
  const size_t n = p2p_access.size();
  for (size_t i = 0; i < n; ++i) {
    MORI_CHECK_ARG(p2p_access[i].size() == n, "p2p_access row ", i, " has ", p2p_access[i].size(),
                   " entries, expected ", n);
  }
  if (nvlink != nullptr) {
    MORI_CHECK_ARG(nvlink->direct.size() == n && nvlink->switch_links.size() == n,
                   "NVLink counts cover ", nvlink->direct.size(), " x ",
                   nvlink->switch_links.size(), " GPUs, expected ", n);
    for (size_t i = 0; i < n; ++i) {
      MORI_CHECK_ARG(nvlink->direct[i].size() == n, "NVLink direct row ", i, " has ",
                     nvlink->direct[i].size(), " entries, expected ", n);
    }
  }
  std::vector<std::vector<GpuLink>> links(n, std::vector<GpuLink>(n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      GpuLink& link = links[i][j];
      if (i == j) {
        link.type = "self";
        link.p2p_access = true;
        link.nvlink_count = nvlink != nullptr ? 0 : -1;
        continue;
      }
      link.p2p_access = p2p_access[i][j];
      if (nvlink != nullptr) {
        const int si = nvlink->switch_links[i];
        const int sj = nvlink->switch_links[j];
        link.nvlink_count = nvlink->direct[i][j] + (si > 0 && sj > 0 ? std::min(si, sj) : 0);
      }
      if (link.nvlink_count > 0) {
        link.type = StrCat("NV", link.nvlink_count);
      } else if (link.p2p_access) {
        link.type = nvlink != nullptr ? "P2P/PCIe" : "P2P";
      } else {
        link.type = "none";
      }
    }
  }
  return links;
}

Topology Discover(const DiscoverOptions& options) {
  Topology topo;
  topo.cpu = detail::DiscoverCpu(options.sysfs_root, options.proc_root);
  topo.cuda_compiled = cuda::CompiledWithCuda();
  if (options.discover_gpus) {
    detail::GpuDiscovery gpus = detail::DiscoverGpus(options.sysfs_root);
    topo.gpus = std::move(gpus.gpus);
    topo.gpu_links = std::move(gpus.links);
    topo.gpu_unavailable_reason = std::move(gpus.unavailable_reason);
    topo.gpu_link_source = std::move(gpus.link_source);
    topo.nvml_status = std::move(gpus.nvml_status);
  } else {
    topo.gpu_unavailable_reason = "GPU discovery was not requested";
  }
  topo.rdma_devices = detail::DiscoverRdmaDevices(options.sysfs_root);
  topo.net_interfaces = detail::DiscoverNetInterfaces(options.sysfs_root);
  topo.nearest_nics = FindNearestNics(topo.gpus, topo.rdma_devices, topo.net_interfaces);
  MORI_LOG_DEBUG(kCore, "topology: ", topo.cpu.online_cpus, " CPUs in ", topo.cpu.numa_nodes.size(),
                 " NUMA nodes, ", topo.gpus.size(), " GPUs, ", topo.rdma_devices.size(),
                 " RDMA devices, ", topo.net_interfaces.size(), " network interfaces");
  return topo;
}

}  // namespace mori::topology
