// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Which RDMA device, port and GID a backend (mori-io's, the proxy's port) uses. Pure functions of
// the topology (mori::topology::Discover) and of a GID table, so they are tested on synthetic
// machines.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mori/topology/topology.hpp"
#include "mori/transport/verbs/qp_attributes.hpp"

namespace mori::transport::verbs {

struct RdmaPortChoice {
  std::string device;  // "mlx5_0"
  int port = 0;
  LinkLayer link_layer = LinkLayer::kUnspecified;
  topology::PciDistance distance = topology::PciDistance::kUnknown;
  std::string reason;  // why this one, for logs and the Python probe
};

// Picks the port to open.
//  - `requested` "" chooses automatically: among ACTIVE ports of all devices, the one
//    whose device has the smallest PCI distance to `gpu` (nullptr: no locality, e.g.
//    host memory), then the smaller device name, then the smaller port number.
//  - `requested` "mlx5_1" or "mlx5_1:2" (device:port) names one device (and port);
//    `requested_port` > 0 names the port as well. A named port must be ACTIVE.
// Throws NotFoundError when there is no device, when the named device or port does
// not exist (listing the devices and ports that do, with their states), or when no
// port that could be used is ACTIVE.
MORI_API RdmaPortChoice ChooseRdmaPort(const std::vector<topology::RdmaDevice>& devices,
                                       const topology::Gpu* gpu, const std::string& requested,
                                       int requested_port = 0);

// One entry of a port's GID table: the GID and its type as sysfs names it under
// ports/<p>/gid_attrs/types/<index> ("IB/RoCE v1", "RoCE v2"; "" when unknown).
struct GidEntry {
  int index = 0;
  std::array<uint8_t, 16> gid{};
  std::string type;
};

struct GidChoice {
  int index = 0;
  std::string reason;
};

// ::ffff:a.b.c.d
MORI_API bool IsIpv4MappedGid(const std::array<uint8_t, 16>& gid) noexcept;
MORI_API bool IsZeroGid(const std::array<uint8_t, 16>& gid) noexcept;
// "fe80:0000:...:0001" (8 groups of 4 hex digits, as sysfs prints GIDs).
MORI_API std::string FormatGid(const std::array<uint8_t, 16>& gid);
// The inverse of FormatGid (also accepts "::"-compressed IPv6 text); throws
// InvalidArgumentError naming the text.
MORI_API std::array<uint8_t, 16> ParseGid(const std::string& text);

// The GID index a QP's address vector uses.
//  - requested >= 0: that entry, which must exist and be non-zero (InvalidArgumentError
//    otherwise, naming the index and the usable ones).
//  - requested < 0 on Ethernet (RoCE): prefer RoCE v2 with an IPv4-mapped address
//    (routable, what RoCE fabrics are configured for), then RoCE v2 with a global
//    IPv6 address, then any RoCE v2, then RoCE v1 (IPv4-mapped first), then any
//    non-zero entry; the lowest index within a class.
//  - requested < 0 on InfiniBand: the lowest non-zero entry (index 0, the port GID).
// Throws NotFoundError when no entry is non-zero.
MORI_API GidChoice SelectGidIndex(const std::vector<GidEntry>& table, LinkLayer link_layer,
                                  int requested);

}  // namespace mori::transport::verbs
