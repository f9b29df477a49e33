// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Readers of sysfs and procfs for topology discovery. Every path they take is
// already rooted (the caller joins DiscoverOptions::sysfs_root), and every reader
// answers "absent" instead of throwing: a file missing on this kernel or in a
// container is ordinary.

#include <optional>
#include <string>
#include <vector>

#include "mori/topology/topology.hpp"

namespace mori::topology::detail {

std::string JoinPath(const std::string& a, const std::string& b);

// File contents with surrounding whitespace removed, or nullopt when unreadable.
std::optional<std::string> ReadText(const std::string& path);
// A decimal integer file; nullopt when unreadable or not a number (e.g. the
// EINVAL that `speed` gives for an interface without link).
std::optional<long long> ReadInteger(const std::string& path);

// Entry names of a directory, sorted; empty when it does not exist.
std::vector<std::string> ListDir(const std::string& path);
bool IsDirectory(const std::string& path);
bool Exists(const std::string& path);
// Symlinks resolved; "" when the path does not exist.
std::string CanonicalPath(const std::string& path);

// True for "0000:1b:00.0" (domain of 4 or more hex digits, as VMD domains have).
bool IsPciBusIdComponent(const std::string& component);
// The PCI function a canonical device path lies on: the path cut after its last
// bus-id component ("/sys/devices/pci0000:00/0000:00:03.0/virtio2" ->
// "/sys/devices/pci0000:00/0000:00:03.0"), "" when no component is a bus id.
std::string PciFunctionPath(const std::string& device_path);
// The last component of a PCI function path.
std::string BaseName(const std::string& path);
// numa_node of a PCI function path, -1 when unreported.
int PciNumaNode(const std::string& pci_path);

CpuInfo DiscoverCpu(const std::string& sysfs_root, const std::string& proc_root);
std::vector<RdmaDevice> DiscoverRdmaDevices(const std::string& sysfs_root);
std::vector<NetInterface> DiscoverNetInterfaces(const std::string& sysfs_root);

}  // namespace mori::topology::detail
