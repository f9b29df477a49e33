// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/topology/topology.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mori/core/error.hpp"

namespace mori::topology {
namespace {

namespace fs = std::filesystem;

// A GPU and a NIC on two downstream ports of one PCIe switch, as on HGX boards.
constexpr char kSwitch[] = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";

TEST(PciDistance, SameSwitchIsPix) {
  const std::string gpu = std::string(kSwitch) + "/0000:02:00.0/0000:03:00.0";
  const std::string nic = std::string(kSwitch) + "/0000:02:01.0/0000:04:00.0";
  EXPECT_EQ(ComputePciDistance(gpu, 0, nic, 0), PciDistance::kPix);
  EXPECT_EQ(ComputePciDistance(nic, 0, gpu, 0), PciDistance::kPix);
}

TEST(PciDistance, FunctionsOfOneDeviceArePix) {
  const std::string root_port = "/sys/devices/pci0000:00/0000:00:01.0";
  EXPECT_EQ(ComputePciDistance(root_port + "/0000:01:00.0", 0, root_port + "/0000:01:00.1", 0),
            PciDistance::kPix);
  EXPECT_EQ(ComputePciDistance(root_port + "/0000:01:00.0", 0, root_port + "/0000:01:00.0", 0),
            PciDistance::kPix);
}

TEST(PciDistance, NestedSwitchesArePxb) {
  // The GPU sits behind a second switch below the first one's downstream port.
  const std::string gpu =
      std::string(kSwitch) + "/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0";
  const std::string nic = std::string(kSwitch) + "/0000:02:01.0/0000:06:00.0";
  EXPECT_EQ(ComputePciDistance(gpu, 0, nic, 0), PciDistance::kPxb);
  EXPECT_EQ(ComputePciDistance(nic, 0, gpu, 0), PciDistance::kPxb);
}

TEST(PciDistance, DifferentRootPortsArePhb) {
  EXPECT_EQ(ComputePciDistance("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", 0,
                               "/sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0", 0),
            PciDistance::kPhb);
  // Devices on the root bus itself (virtual machines) meet at the host bridge.
  EXPECT_EQ(ComputePciDistance("/sys/devices/pci0000:00/0000:00:03.0", -1,
                               "/sys/devices/pci0000:00/0000:00:04.0", -1),
            PciDistance::kPhb);
}

TEST(PciDistance, DifferentRootComplexesAreNodeOrSys) {
  const std::string a = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
  const std::string b = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
  EXPECT_EQ(ComputePciDistance(a, 0, b, 0), PciDistance::kNode);
  EXPECT_EQ(ComputePciDistance(a, 0, b, 1), PciDistance::kSys);
  // An unreported NUMA node is taken to be the same node.
  EXPECT_EQ(ComputePciDistance(a, -1, b, 1), PciDistance::kNode);
}

TEST(PciDistance, NonPciPathsAreUnknown) {
  const std::string pci = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
  EXPECT_EQ(ComputePciDistance("", 0, pci, 0), PciDistance::kUnknown);
  EXPECT_EQ(ComputePciDistance("/sys/devices/virtual/net/docker0", 0, pci, 0),
            PciDistance::kUnknown);
  EXPECT_EQ(ComputePciDistance("/sys/devices/pci0000:00", 0, pci, 0), PciDistance::kUnknown);
}

TEST(PciDistance, PathsUnderAnyPrefixAndVmdDomains) {
  // A sysfs root elsewhere (tests) and a VMD domain nested below a root port.
  const std::string vmd = "/tmp/x/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0";
  EXPECT_EQ(ComputePciDistance(vmd + "/10000:e1:00.0", 0, vmd + "/10000:e1:00.1", 0),
            PciDistance::kPix);
  EXPECT_EQ(ComputePciDistance(vmd + "/10000:e1:00.0", 0,
                               "/tmp/x/devices/pci0000:00/0000:00:01.0/0000:01:00.0", 0),
            PciDistance::kPhb);
}

TEST(PciDistance, Names) {
  EXPECT_STREQ(PciDistanceName(PciDistance::kPix), "PIX");
  EXPECT_STREQ(PciDistanceName(PciDistance::kPxb), "PXB");
  EXPECT_STREQ(PciDistanceName(PciDistance::kPhb), "PHB");
  EXPECT_STREQ(PciDistanceName(PciDistance::kNode), "NODE");
  EXPECT_STREQ(PciDistanceName(PciDistance::kSys), "SYS");
  EXPECT_STREQ(PciDistanceName(PciDistance::kUnknown), "UNKNOWN");
}

TEST(ParseCpuList, RangesAndSingles) {
  EXPECT_EQ(ParseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(ParseCpuList("5"), (std::vector<int>{5}));
  EXPECT_TRUE(ParseCpuList("\n").empty());  // a memory-only NUMA node
}

TEST(ParseCpuList, RejectsMalformedText) {
  EXPECT_THROW(ParseCpuList("0-"), InvalidArgumentError);
  EXPECT_THROW(ParseCpuList("3-1"), InvalidArgumentError);
  EXPECT_THROW(ParseCpuList("a"), InvalidArgumentError);
  EXPECT_THROW(ParseCpuList("0,,1"), InvalidArgumentError);
  EXPECT_THROW(ParseCpuList("0,"), InvalidArgumentError);
}

TEST(NormalizePciBusId, Spellings) {
  EXPECT_EQ(NormalizePciBusId("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(NormalizePciBusId("00000000:1b:00.0"), "0000:1b:00.0");  // NVML
  EXPECT_EQ(NormalizePciBusId("1b:00.1"), "0000:1b:00.1");
  EXPECT_EQ(NormalizePciBusId("10000:e1:1f.7"), "10000:e1:1f.7");
  EXPECT_THROW(NormalizePciBusId("0000:1b:00"), InvalidArgumentError);
  EXPECT_THROW(NormalizePciBusId("0000:1b:20.0"), InvalidArgumentError);
  EXPECT_THROW(NormalizePciBusId("gpu0"), InvalidArgumentError);
}

TEST(GpuLinkMatrix, NvSwitchConnectsEveryPairWithTheSmallerLinkCount) {
  const int n = 4;
  std::vector<std::vector<bool>> p2p(n, std::vector<bool>(n, true));
  NvLinkCounts counts{std::vector<std::vector<int>>(n, std::vector<int>(n, 0)), {18, 18, 18, 12}};
  auto links = BuildGpuLinkMatrix(p2p, &counts);
  ASSERT_EQ(links.size(), 4u);
  EXPECT_EQ(links[0][0].type, "self");
  EXPECT_EQ(links[0][1].type, "NV18");
  EXPECT_EQ(links[0][1].nvlink_count, 18);
  EXPECT_EQ(links[2][3].type, "NV12");
  EXPECT_EQ(links[3][2].nvlink_count, 12);
  EXPECT_TRUE(links[1][2].p2p_access);
}

TEST(GpuLinkMatrix, DirectLinksPcieAndNone) {
  // GPUs 0 and 1 bridged by 4 direct links; GPU 2 on PCIe with peer access to 0
  // only.
  std::vector<std::vector<bool>> p2p = {
      {false, true, true}, {true, false, false}, {true, false, false}};
  NvLinkCounts counts{{{0, 4, 0}, {4, 0, 0}, {0, 0, 0}}, {0, 0, 0}};
  auto links = BuildGpuLinkMatrix(p2p, &counts);
  EXPECT_EQ(links[0][1].type, "NV4");
  EXPECT_EQ(links[1][0].type, "NV4");
  EXPECT_EQ(links[0][2].type, "P2P/PCIe");
  EXPECT_EQ(links[0][2].nvlink_count, 0);
  EXPECT_EQ(links[1][2].type, "none");
  EXPECT_FALSE(links[1][2].p2p_access);
}

TEST(GpuLinkMatrix, WithoutNvmlOnlyPeerAccessIsKnown) {
  std::vector<std::vector<bool>> p2p = {{false, true}, {false, false}};
  auto links = BuildGpuLinkMatrix(p2p, nullptr);
  EXPECT_EQ(links[0][1].type, "P2P");
  EXPECT_EQ(links[0][1].nvlink_count, -1);
  EXPECT_EQ(links[1][0].type, "none");
  EXPECT_EQ(links[1][1].type, "self");
}

TEST(GpuLinkMatrix, RejectsMismatchedShapes) {
  std::vector<std::vector<bool>> p2p = {{false, true}, {true}};
  EXPECT_THROW(BuildGpuLinkMatrix(p2p, nullptr), InvalidArgumentError);
  std::vector<std::vector<bool>> square = {{false, true}, {true, false}};
  NvLinkCounts counts{{{0, 1}, {1, 0}}, {0}};
  EXPECT_THROW(BuildGpuLinkMatrix(square, &counts), InvalidArgumentError);
}

// A fake sysfs/procfs: two NUMA nodes; a PCIe switch on node 0 holding an mlx5
// RDMA device (netdev ib0) and room for a GPU; an Ethernet NIC on a second root
// complex on node 1; a virtual docker0; lo and bonding_masters to be skipped.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mori-topo-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    sys_ = root_ + "/sys";
    proc_ = root_ + "/proc";

    Write(proc_ + "/cpuinfo", "processor\t: 0\nmodel name\t: Fake CPU @ 3.00GHz\n\n");
    Write(sys_ + "/devices/system/cpu/online", "0-7\n");
    Write(sys_ + "/devices/system/node/possible", "0-1\n");
    Write(sys_ + "/devices/system/node/node0/cpulist", "0-3\n");
    Write(sys_ + "/devices/system/node/node0/meminfo", "Node 0 MemTotal:  1048576 kB\n");
    Write(sys_ + "/devices/system/node/node1/cpulist", "4-7\n");
    Write(sys_ + "/devices/system/node/node1/meminfo",
          "Node 1 MemTotal:  2097152 kB\nNode 1 MemFree:  1 kB\n");

    const std::string sw = sys_ + "/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    mlx_ = sw + "/0000:02:01.0/0000:04:00.0";
    Write(mlx_ + "/numa_node", "0\n");
    const std::string ib = mlx_ + "/infiniband/mlx5_0";
    Link("../../../0000:04:00.0", ib + "/device");
    Write(ib + "/ports/1/state", "4: ACTIVE\n");
    Write(ib + "/ports/1/link_layer", "InfiniBand\n");
    Write(ib + "/ports/1/rate", "400 Gb/sec (4X NDR)\n");
    Link(
        "../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/"
        "infiniband/mlx5_0",
        sys_ + "/class/infiniband/mlx5_0");
    NetDev(mlx_ + "/net/ib0", "up", "400000", "4092");
    Link("../../../0000:04:00.0", mlx_ + "/net/ib0/device");
    Link("../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/net/ib0",
         sys_ + "/class/net/ib0");

    eth_ = sys_ + "/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
    Write(eth_ + "/numa_node", "1\n");
    NetDev(eth_ + "/net/eth0", "up", "100000", "9000");
    Link("../../../0000:81:00.0", eth_ + "/net/eth0/device");
    Link("../../devices/pci0000:80/0000:80:01.0/0000:81:00.0/net/eth0", sys_ + "/class/net/eth0");

    NetDev(sys_ + "/devices/virtual/net/docker0", "down", "", "1500");
    Link("../../devices/virtual/net/docker0", sys_ + "/class/net/docker0");
    NetDev(sys_ + "/devices/virtual/net/lo", "unknown", "", "65536");
    Link("../../devices/virtual/net/lo", sys_ + "/class/net/lo");
    Write(sys_ + "/class/net/bonding_masters", "\n");
  }

  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  static void Write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
  }
  static void Link(const std::string& target, const std::string& link) {
    fs::create_directories(fs::path(link).parent_path());
    fs::create_directory_symlink(target, link);
  }
  static void NetDev(const std::string& dir, const std::string& operstate, const std::string& speed,
                     const std::string& mtu) {
    Write(dir + "/operstate", operstate + "\n");
    Write(dir + "/mtu", mtu + "\n");
    if (!speed.empty()) Write(dir + "/speed", speed + "\n");
  }

  Topology DiscoverFake() {
    DiscoverOptions options;
    options.sysfs_root = sys_;
    options.proc_root = proc_;
    options.discover_gpus = false;
    return Discover(options);
  }

  std::string root_, sys_, proc_, mlx_, eth_;
};

TEST_F(FakeSysfs, CpusAndNumaNodes) {
  Topology topo = DiscoverFake();
  EXPECT_EQ(topo.cpu.online_cpus, 8);
  EXPECT_EQ(topo.cpu.model_name, "Fake CPU @ 3.00GHz");
  EXPECT_GT(topo.cpu.affinity_cpus, 0);  // this process, not the fake tree
  ASSERT_EQ(topo.cpu.numa_nodes.size(), 2u);
  EXPECT_EQ(topo.cpu.numa_nodes[0].id, 0);
  EXPECT_EQ(topo.cpu.numa_nodes[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(topo.cpu.numa_nodes[0].mem_total_bytes, 1024ull * 1024 * 1024);
  EXPECT_EQ(topo.cpu.numa_nodes[1].id, 1);
  EXPECT_EQ(topo.cpu.numa_nodes[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(topo.cpu.numa_nodes[1].mem_total_bytes, 2048ull * 1024 * 1024);
}

TEST_F(FakeSysfs, RdmaDevice) {
  Topology topo = DiscoverFake();
  ASSERT_EQ(topo.rdma_devices.size(), 1u);
  const RdmaDevice& dev = topo.rdma_devices[0];
  EXPECT_EQ(dev.name, "mlx5_0");
  EXPECT_EQ(dev.pci_bus_id, "0000:04:00.0");
  EXPECT_EQ(dev.pci_path, fs::canonical(mlx_).string());
  EXPECT_EQ(dev.numa_node, 0);
  EXPECT_EQ(dev.netdevs, (std::vector<std::string>{"ib0"}));
  ASSERT_EQ(dev.ports.size(), 1u);
  EXPECT_EQ(dev.ports[0].port, 1);
  EXPECT_EQ(dev.ports[0].state, "ACTIVE");
  EXPECT_EQ(dev.ports[0].link_layer, "InfiniBand");
  EXPECT_EQ(dev.ports[0].rate, "400 Gb/sec (4X NDR)");
}

TEST_F(FakeSysfs, NetInterfaces) {
  Topology topo = DiscoverFake();
  ASSERT_EQ(topo.net_interfaces.size(), 3u);  // lo and bonding_masters skipped
  const NetInterface& docker = topo.net_interfaces[0];
  const NetInterface& eth = topo.net_interfaces[1];
  const NetInterface& ib = topo.net_interfaces[2];
  EXPECT_EQ(docker.name, "docker0");
  EXPECT_TRUE(docker.is_virtual);
  EXPECT_EQ(docker.pci_bus_id, "");
  EXPECT_EQ(docker.numa_node, -1);
  EXPECT_EQ(docker.speed_mbps, -1);
  EXPECT_EQ(docker.mtu, 1500);
  EXPECT_EQ(docker.operstate, "down");
  EXPECT_EQ(eth.name, "eth0");
  EXPECT_FALSE(eth.is_virtual);
  EXPECT_EQ(eth.pci_bus_id, "0000:81:00.0");
  EXPECT_EQ(eth.numa_node, 1);
  EXPECT_EQ(eth.speed_mbps, 100000);
  EXPECT_EQ(eth.mtu, 9000);
  EXPECT_EQ(ib.name, "ib0");
  EXPECT_EQ(ib.pci_bus_id, "0000:04:00.0");
  EXPECT_EQ(ib.numa_node, 0);
}

TEST_F(FakeSysfs, NoGpusMeansNoNearestNics) {
  Topology topo = DiscoverFake();
  EXPECT_TRUE(topo.gpus.empty());
  EXPECT_FALSE(topo.gpu_unavailable_reason.empty());
  EXPECT_TRUE(topo.gpu_links.empty());
  EXPECT_TRUE(topo.nearest_nics.empty());
}

TEST_F(FakeSysfs, NearestNicPerGpu) {
  Topology topo = DiscoverFake();
  const std::string sw = fs::canonical(mlx_).parent_path().parent_path().string();
  std::vector<Gpu> gpus(4);
  // Behind the NIC's switch: the RDMA device wins over its own netdev ib0.
  gpus[0].index = 0;
  gpus[0].pci_path = sw + "/0000:02:00.0/0000:03:00.0";
  gpus[0].numa_node = 0;
  // On node 1's root complex, beside eth0: PHB beats the RDMA device across sockets.
  gpus[1].index = 1;
  gpus[1].pci_path =
      fs::canonical(sys_ + "/devices").string() + "/pci0000:80/0000:80:02.0/0000:85:00.0";
  gpus[1].numa_node = 1;
  // Another root complex of node 0: NODE to mlx5_0, SYS to eth0.
  gpus[2].index = 2;
  gpus[2].pci_path =
      fs::canonical(sys_ + "/devices").string() + "/pci0000:40/0000:40:01.0/0000:41:00.0";
  gpus[2].numa_node = 0;
  // No sysfs path: every distance is unknown, and the RDMA device is preferred.
  gpus[3].index = 3;

  std::vector<NearestNic> nearest = FindNearestNics(gpus, topo.rdma_devices, topo.net_interfaces);
  ASSERT_EQ(nearest.size(), 4u);
  EXPECT_EQ(nearest[0].gpu, 0);
  EXPECT_EQ(nearest[0].nic, "mlx5_0");
  EXPECT_EQ(nearest[0].kind, "rdma");
  EXPECT_EQ(nearest[0].netdev, "ib0");
  EXPECT_EQ(nearest[0].pci_bus_id, "0000:04:00.0");
  EXPECT_EQ(nearest[0].distance, PciDistance::kPix);
  EXPECT_EQ(nearest[1].nic, "eth0");
  EXPECT_EQ(nearest[1].kind, "net");
  EXPECT_EQ(nearest[1].distance, PciDistance::kPhb);
  EXPECT_EQ(nearest[2].nic, "mlx5_0");
  EXPECT_EQ(nearest[2].distance, PciDistance::kNode);
  EXPECT_EQ(nearest[3].nic, "mlx5_0");
  EXPECT_EQ(nearest[3].distance, PciDistance::kUnknown);
}

TEST_F(FakeSysfs, PhysicalBeatsVirtualWithoutRdma) {
  Topology topo = DiscoverFake();
  std::vector<Gpu> gpus(1);  // no PCI path: only the tie-breaks decide
  std::vector<NearestNic> nearest = FindNearestNics(gpus, {}, topo.net_interfaces);
  ASSERT_EQ(nearest.size(), 1u);
  EXPECT_EQ(nearest[0].nic, "eth0");  // physical, and before ib0 by name
  std::vector<NetInterface> only_virtual = {topo.net_interfaces[0]};
  EXPECT_EQ(FindNearestNics(gpus, {}, only_virtual)[0].nic, "docker0");
  EXPECT_EQ(FindNearestNics(gpus, {}, {})[0].nic, "");
}

TEST(Discover, EmptyRootsStillDescribeTheMachine) {
  // Without sysfs the CPU count comes from sysconf and one NUMA node holds them all.
  DiscoverOptions options;
  options.sysfs_root = "/nonexistent-mori-sysfs";
  options.proc_root = "/nonexistent-mori-proc";
  options.discover_gpus = false;
  Topology topo = Discover(options);
  EXPECT_GT(topo.cpu.online_cpus, 0);
  ASSERT_EQ(topo.cpu.numa_nodes.size(), 1u);
  EXPECT_EQ(static_cast<int>(topo.cpu.numa_nodes[0].cpus.size()), topo.cpu.online_cpus);
  EXPECT_TRUE(topo.rdma_devices.empty());
  EXPECT_TRUE(topo.net_interfaces.empty());
}

TEST(Discover, ThisMachine) {
  // Whatever the hardware, discovery completes and is self-consistent.
  Topology topo = Discover();
  EXPECT_GT(topo.cpu.online_cpus, 0);
  EXPECT_FALSE(topo.cpu.numa_nodes.empty());
  EXPECT_EQ(topo.gpu_links.size(), topo.gpus.size());
  EXPECT_EQ(topo.nearest_nics.size(), topo.gpus.size());
  EXPECT_EQ(topo.gpus.empty(), !topo.gpu_unavailable_reason.empty());
  for (const NetInterface& nic : topo.net_interfaces) EXPECT_NE(nic.name, "lo");
}

}  // namespace
}  // namespace mori::topology
