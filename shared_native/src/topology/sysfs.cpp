// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "topology/sysfs.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"

namespace mori::topology::detail {
namespace fs = std::filesystem;

namespace {

std::string Trim(const std::string& s) {
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

bool IsHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// "Node 0 MemTotal:  3893024 kB" or "MemTotal:  3893024 kB" -> bytes.
std::optional<uint64_t> ParseMemTotal(const std::string& meminfo_path) {
  std::ifstream in(meminfo_path);
  std::string line;
  while (std::getline(in, line)) {
    size_t key = line.find("MemTotal:");
    if (key == std::string::npos) continue;
    std::istringstream rest(line.substr(key + 9));
    uint64_t value = 0;
    std::string unit;
    if (!(rest >> value)) return std::nullopt;
    rest >> unit;
    return unit == "kB" ? value * 1024 : value;
  }
  return std::nullopt;
}

std::string CpuModelName(const std::string& proc_root) {
  std::ifstream in(JoinPath(proc_root, "cpuinfo"));
  std::string line;
  while (std::getline(in, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = Trim(line.substr(0, colon));
    if (key == "model name" || key == "Model name" || key == "cpu model") {
      return Trim(line.substr(colon + 1));
    }
  }
  return "";
}

int AffinityCpuCount() {
  // A fixed cpu_set_t holds 1024 CPUs; larger machines need a dynamic set.
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (set == nullptr) return 0;
    size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      int count = CPU_COUNT_S(size, set);
      CPU_FREE(set);
      return count;
    }
    int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) return 0;
  }
  return 0;
}

std::optional<int> NodeId(const std::string& dir_name) {
  if (dir_name.size() <= 4 || dir_name.compare(0, 4, "node") != 0) return std::nullopt;
  for (size_t i = 4; i < dir_name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(dir_name[i]))) return std::nullopt;
  }
  return std::atoi(dir_name.c_str() + 4);
}

// PCI function path, bus id and NUMA node of whatever `device_link` points at.
void ResolvePciDevice(const std::string& device_link, std::string* pci_path,
                      std::string* pci_bus_id, int* numa_node) {
  *pci_path = PciFunctionPath(CanonicalPath(device_link));
  *pci_bus_id = pci_path->empty() ? "" : BaseName(*pci_path);
  *numa_node = pci_path->empty() ? -1 : PciNumaNode(*pci_path);
}

}  // namespace

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  // A sysfs attribute whose show() fails (speed of a NIC without link) opens fine
  // and reads as empty, which callers treat like an absent file.
  std::ostringstream os;
  os << in.rdbuf();
  return Trim(os.str());
}

std::optional<long long> ReadInteger(const std::string& path) {
  std::optional<std::string> text = ReadText(path);
  if (!text || text->empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0') return std::nullopt;
  return value;
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(path, ec);
  if (ec) return names;
  for (const fs::directory_entry& entry : it) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool IsDirectory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string CanonicalPath(const std::string& path) {
  std::error_code ec;
  fs::path canonical = fs::canonical(path, ec);
  return ec ? "" : canonical.string();
}

bool IsPciBusIdComponent(const std::string& c) {
  // dddd:bb:dd.f with a domain of at least four hex digits.
  size_t first = c.find(':');
  if (first == std::string::npos || first < 4) return false;
  if (c.size() != first + 8) return false;
  for (size_t i = 0; i < first; ++i) {
    if (!IsHex(c[i])) return false;
  }
  return IsHex(c[first + 1]) && IsHex(c[first + 2]) && c[first + 3] == ':' && IsHex(c[first + 4]) &&
         IsHex(c[first + 5]) && c[first + 6] == '.' && c[first + 7] >= '0' && c[first + 7] <= '7';
}

std::string PciFunctionPath(const std::string& device_path) {
  std::string result;
  std::string prefix;
  std::istringstream parts(device_path);
  std::string part;
  bool absolute = !device_path.empty() && device_path[0] == '/';
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    prefix += (absolute || !prefix.empty()) ? "/" + part : part;
    if (IsPciBusIdComponent(part)) result = prefix;
  }
  return result;
}

std::string BaseName(const std::string& path) {
  size_t end = path.find_last_not_of('/');
  if (end == std::string::npos) return "";
  size_t slash = path.rfind('/', end);
  return path.substr(slash == std::string::npos ? 0 : slash + 1,
                     slash == std::string::npos ? end + 1 : end - slash);
}

int PciNumaNode(const std::string& pci_path) {
  std::optional<long long> node = ReadInteger(JoinPath(pci_path, "numa_node"));
  return node && *node >= 0 && *node <= INT_MAX ? static_cast<int>(*node) : -1;
}

CpuInfo DiscoverCpu(const std::string& sysfs_root, const std::string& proc_root) {
  CpuInfo cpu;
  std::vector<int> online;
  if (std::optional<std::string> text =
          ReadText(JoinPath(sysfs_root, "devices/system/cpu/online"))) {
    try {
      online = ParseCpuList(*text);
    } catch (const Error& e) {
      MORI_LOG_DEBUG(kCore, "topology: ignoring devices/system/cpu/online: ", e.what());
    }
  }
  if (online.empty()) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < n; ++i) online.push_back(static_cast<int>(i));
  }
  cpu.online_cpus = static_cast<int>(online.size());
  cpu.affinity_cpus = AffinityCpuCount();
  cpu.model_name = CpuModelName(proc_root);

  const std::string node_root = JoinPath(sysfs_root, "devices/system/node");
  for (const std::string& name : ListDir(node_root)) {
    std::optional<int> id = NodeId(name);
    if (!id) continue;
    NumaNode node;
    node.id = *id;
    const std::string dir = JoinPath(node_root, name);
    if (std::optional<std::string> list = ReadText(JoinPath(dir, "cpulist"))) {
      try {
        node.cpus = ParseCpuList(*list);
      } catch (const Error& e) {
        MORI_LOG_DEBUG(kCore, "topology: ignoring ", dir, "/cpulist: ", e.what());
      }
    }
    node.mem_total_bytes = ParseMemTotal(JoinPath(dir, "meminfo")).value_or(0);
    cpu.numa_nodes.push_back(std::move(node));
  }
  std::sort(cpu.numa_nodes.begin(), cpu.numa_nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  if (cpu.numa_nodes.empty()) {
    // Kernels built without CONFIG_NUMA have no node directory; the machine is
    // then one node holding everything.
    NumaNode node;
    node.cpus = online;
    node.mem_total_bytes = ParseMemTotal(JoinPath(proc_root, "meminfo")).value_or(0);
    cpu.numa_nodes.push_back(std::move(node));
  }
  return cpu;
}

std::vector<RdmaDevice> DiscoverRdmaDevices(const std::string& sysfs_root) {
  std::vector<RdmaDevice> devices;
  const std::string class_root = JoinPath(sysfs_root, "class/infiniband");
  for (const std::string& name : ListDir(class_root)) {
    const std::string dir = JoinPath(class_root, name);
    if (!IsDirectory(dir)) continue;
    RdmaDevice dev;
    dev.name = name;
    const std::string device_link = JoinPath(dir, "device");
    ResolvePciDevice(device_link, &dev.pci_path, &dev.pci_bus_id, &dev.numa_node);
    for (const std::string& netdev : ListDir(JoinPath(device_link, "net"))) {
      dev.netdevs.push_back(netdev);
    }
    const std::string ports_dir = JoinPath(dir, "ports");
    for (const std::string& port_name : ListDir(ports_dir)) {
      char* end = nullptr;
      long port_num = std::strtol(port_name.c_str(), &end, 10);
      if (end == port_name.c_str() || *end != '\0') continue;
      RdmaPort port;
      port.port = static_cast<int>(port_num);
      const std::string port_dir = JoinPath(ports_dir, port_name);
      std::string state = ReadText(JoinPath(port_dir, "state")).value_or("");
      // "4: ACTIVE": the number repeats the name.
      size_t colon = state.find(": ");
      port.state = colon == std::string::npos ? state : state.substr(colon + 2);
      port.link_layer = ReadText(JoinPath(port_dir, "link_layer")).value_or("");
      port.rate = ReadText(JoinPath(port_dir, "rate")).value_or("");
      dev.ports.push_back(std::move(port));
    }
    std::sort(dev.ports.begin(), dev.ports.end(),
              [](const RdmaPort& a, const RdmaPort& b) { return a.port < b.port; });
    MORI_LOG_DEBUG(kCore, "topology: RDMA device ", name, " at ",
                   dev.pci_bus_id.empty() ? "(no PCI)" : dev.pci_bus_id, ", NUMA ", dev.numa_node);
    devices.push_back(std::move(dev));
  }
  return devices;
}

std::vector<NetInterface> DiscoverNetInterfaces(const std::string& sysfs_root) {
  std::vector<NetInterface> interfaces;
  const std::string class_root = JoinPath(sysfs_root, "class/net");
  for (const std::string& name : ListDir(class_root)) {
    const std::string dir = JoinPath(class_root, name);
    // bonding_masters is a plain file beside the interfaces.
    if (name == "lo" || !IsDirectory(dir)) continue;
    NetInterface nic;
    nic.name = name;
    nic.operstate = ReadText(JoinPath(dir, "operstate")).value_or("");
    std::optional<long long> speed = ReadInteger(JoinPath(dir, "speed"));
    // Old kernels report an unknown speed as (u32)-1.
    nic.speed_mbps = speed && *speed > 0 && *speed < INT_MAX ? static_cast<int>(*speed) : -1;
    std::optional<long long> mtu = ReadInteger(JoinPath(dir, "mtu"));
    nic.mtu = mtu && *mtu > 0 && *mtu < INT_MAX ? static_cast<int>(*mtu) : 0;
    const std::string device_link = JoinPath(dir, "device");
    nic.is_virtual = !Exists(device_link);
    if (!nic.is_virtual) {
      ResolvePciDevice(device_link, &nic.pci_path, &nic.pci_bus_id, &nic.numa_node);
    }
    interfaces.push_back(std::move(nic));
  }
  return interfaces;
}

}  // namespace mori::topology::detail
