// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mori/core/macros.hpp"

// What a node is made of, as far as communication cares: CPUs and NUMA nodes, CUDA
// GPUs and how they reach each other, NICs and which one sits closest to each GPU.
// Discovery reads sysfs/procfs and, when libmori_core has CUDA, the CUDA runtime and
// NVML (dlopen'ed). It never throws for missing hardware: absent parts come back
// empty, with the reason where one is known.
namespace mori::topology {

// PCI locality between two devices, ordered from closest to farthest, with NCCL's
// and nvidia-smi's names.
enum class PciDistance : int {
  kPix = 0,  // at most one bridge (or one PCIe switch) between them
  kPxb,      // several bridges, below a shared bridge, not through the host bridge
  kPhb,      // through the host bridge of one root complex
  kNode,     // across root complexes of one NUMA node
  kSys,      // across NUMA nodes (the inter-socket link)
  kUnknown,  // one side is not a PCI device (a virtual interface)
};

// "PIX", "PXB", "PHB", "NODE", "SYS", "UNKNOWN".
MORI_API const char* PciDistanceName(PciDistance distance) noexcept;

// Distance between two PCI functions given the canonical sysfs paths of the devices
// (e.g. /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0) and their NUMA nodes.
// A negative NUMA node means "not reported" (single-node machines), and is taken
// to equal any other. Pure: reads nothing, so any path string can be tested.
MORI_API PciDistance ComputePciDistance(const std::string& path_a, int numa_a,
                                        const std::string& path_b, int numa_b);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}. Throws InvalidArgumentError naming the text
// when it is not a CPU list.
MORI_API std::vector<int> ParseCpuList(const std::string& text);

// "0000:1B:00.0", "00000000:1b:00.0" -> "0000:1b:00.0". Throws InvalidArgumentError
// naming the text when it is not domain:bus:device.function.
MORI_API std::string NormalizePciBusId(const std::string& bus_id);

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;
  uint64_t mem_total_bytes = 0;
};

struct CpuInfo {
  int online_cpus = 0;    // the machine's online CPUs
  int affinity_cpus = 0;  // CPUs this process may run on (sched_getaffinity)
  std::string model_name;
  std::vector<NumaNode> numa_nodes;
};

struct Gpu {
  int index = 0;  // CUDA runtime ordinal
  std::string name;
  std::string pci_bus_id;  // "0000:18:00.0"
  std::string pci_path;    // canonical sysfs path, "" when sysfs lacks the device
  int numa_node = -1;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  uint64_t total_memory_bytes = 0;
  int sm_count = 0;
  // cuMem shareable-handle types the driver offers, which decide how the p2p
  // transport exports memory (fabric handles also work across an NVLink domain).
  bool fabric_handle_supported = false;
  bool posix_fd_handle_supported = false;
};

struct GpuLink {
  // "self", "NV<n>" (n NVLinks, direct or through NVSwitches), "P2P/PCIe" (peer
  // access without NVLink), "P2P" (peer access, NVML unavailable so the medium is
  // unknown), "none".
  std::string type;
  bool p2p_access = false;
  int nvlink_count = -1;      // -1 when NVML could not tell
  int performance_rank = -1;  // cudaDevP2PAttrPerformanceRank, -1 when not asked
  bool native_atomics = false;
};

struct RdmaPort {
  int port = 0;
  std::string state;       // "ACTIVE", "DOWN", ... (the number in sysfs dropped)
  std::string link_layer;  // "InfiniBand", "Ethernet"
  std::string rate;        // as sysfs says it, e.g. "400 Gb/sec (4X NDR)"
};

struct RdmaDevice {
  std::string name;  // "mlx5_0"
  std::string pci_bus_id;
  std::string pci_path;
  int numa_node = -1;
  std::vector<std::string> netdevs;  // network interfaces of the same PCI function
  std::vector<RdmaPort> ports;
};

struct NetInterface {
  std::string name;
  std::string operstate;
  int speed_mbps = -1;  // -1 when the driver does not report it
  int mtu = 0;
  std::string pci_bus_id;  // "" when the interface is not backed by a PCI function
  std::string pci_path;
  int numa_node = -1;
  bool is_virtual = false;  // no device behind it (bridge, veth, bond, ...)
};

struct NearestNic {
  int gpu = 0;
  std::string nic;     // "" when the node has no NIC
  std::string kind;    // "rdma" or "net"
  std::string netdev;  // for an RDMA device, its first network interface
  std::string pci_bus_id;
  PciDistance distance = PciDistance::kUnknown;
};

struct Topology {
  CpuInfo cpu;
  bool cuda_compiled = false;
  std::string gpu_unavailable_reason;  // why `gpus` is empty, "" otherwise
  std::vector<Gpu> gpus;
  std::vector<std::vector<GpuLink>> gpu_links;  // [i][j] for gpus[i], gpus[j]
  std::string gpu_link_source;  // "nvml", "cuda" (NVML unavailable), "" without GPUs
  std::string nvml_status;      // why NVML was not used, "" when it was
  std::vector<RdmaDevice> rdma_devices;
  std::vector<NetInterface> net_interfaces;
  std::vector<NearestNic> nearest_nics;  // one per GPU, in GPU order
};

struct DiscoverOptions {
  // Roots of sysfs and procfs, replaced by tests with a fake tree.
  std::string sysfs_root = "/sys";
  std::string proc_root = "/proc";
  bool discover_gpus = true;
};

// Gathers the whole topology. Touches no Python and takes no global lock; the
// first call may initialize the CUDA driver (no context is created).
MORI_API Topology Discover(const DiscoverOptions& options = {});

// For each GPU, the NIC with the smallest PciDistance; ties prefer RDMA devices to
// plain network interfaces, then physical to virtual, then the smaller name.
MORI_API std::vector<NearestNic> FindNearestNics(const std::vector<Gpu>& gpus,
                                                 const std::vector<RdmaDevice>& rdma_devices,
                                                 const std::vector<NetInterface>& net_interfaces);

// NVLink counts seen by NVML: direct[i][j] links from GPU i whose far end is GPU j,
// and switch_links[i] links from GPU i to NVSwitches.
struct NvLinkCounts {
  std::vector<std::vector<int>> direct;
  std::vector<int> switch_links;
};

// The link matrix from peer-access answers and, when NVML answered, NVLink counts
// (nullptr otherwise). Two GPUs that both reach NVSwitches talk over
// min(switch_links[i], switch_links[j]) links on top of their direct ones, as
// NCCL counts them. performance_rank/native_atomics are left for the caller.
MORI_API std::vector<std::vector<GpuLink>> BuildGpuLinkMatrix(
    const std::vector<std::vector<bool>>& p2p_access, const NvLinkCounts* nvlink);

}  // namespace mori::topology
