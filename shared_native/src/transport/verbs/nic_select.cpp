// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/verbs/nic_select.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "mori/core/error.hpp"

namespace mori::transport::verbs {
namespace {

std::string DescribeDevices(const std::vector<topology::RdmaDevice>& devices) {
  if (devices.empty()) return "none";
  std::string out;
  for (const topology::RdmaDevice& d : devices) {
    if (!out.empty()) out += ", ";
    out += d.name + " (";
    if (d.ports.empty()) out += "no ports";
    for (size_t i = 0; i < d.ports.size(); ++i) {
      const topology::RdmaPort& p = d.ports[i];
      out += StrCat(i ? "; " : "", "port ", p.port, " ", p.state.empty() ? "?" : p.state, " ",
                    p.link_layer.empty() ? "?" : p.link_layer);
    }
    out += ")";
  }
  return out;
}

bool IsActive(const topology::RdmaPort& p) { return p.state == "ACTIVE"; }

}  // namespace

RdmaPortChoice ChooseRdmaPort(const std::vector<topology::RdmaDevice>& devices,
                              const topology::Gpu* gpu, const std::string& requested,
                              int requested_port) {
  if (devices.empty()) {
    MORI_THROW(NotFoundError, "no RDMA device on this machine (/sys/class/infiniband is empty)");
  }
  std::string want_device = requested;
  int want_port = requested_port;
  size_t colon = requested.rfind(':');
  if (colon != std::string::npos) {
    want_device = requested.substr(0, colon);
    std::string port_text = requested.substr(colon + 1);
    char* end = nullptr;
    long p = std::strtol(port_text.c_str(), &end, 10);
    MORI_CHECK_ARG(!port_text.empty() && *end == '\0' && p > 0 && p < 256, "RDMA device '",
                   requested, "': the port after ':' must be a number in [1, 255]");
    MORI_CHECK_ARG(requested_port <= 0 || requested_port == p, "RDMA device '", requested,
                   "' names port ", p, " but port ", requested_port, " was also requested");
    want_port = static_cast<int>(p);
  }

  struct Candidate {
    const topology::RdmaDevice* dev;
    const topology::RdmaPort* port;
    topology::PciDistance distance;
  };
  std::vector<Candidate> candidates;
  bool device_found = want_device.empty();
  bool port_found = want_port <= 0;
  for (const topology::RdmaDevice& d : devices) {
    if (!want_device.empty() && d.name != want_device) continue;
    device_found = true;
    for (const topology::RdmaPort& p : d.ports) {
      if (want_port > 0 && p.port != want_port) continue;
      port_found = true;
      if (!IsActive(p)) continue;
      topology::PciDistance dist = gpu == nullptr
                                       ? topology::PciDistance::kUnknown
                                       : topology::ComputePciDistance(gpu->pci_path, gpu->numa_node,
                                                                      d.pci_path, d.numa_node);
      candidates.push_back({&d, &p, dist});
    }
  }
  if (!device_found) {
    MORI_THROW(NotFoundError, "RDMA device '", want_device,
               "' not found; available: ", DescribeDevices(devices));
  }
  if (!port_found) {
    MORI_THROW(NotFoundError, "RDMA device '", want_device, "' has no port ", want_port,
               "; available: ", DescribeDevices(devices));
  }
  if (candidates.empty()) {
    MORI_THROW(NotFoundError, "no ACTIVE RDMA port",
               want_device.empty() ? std::string() : " on '" + want_device + "'",
               want_port > 0 ? StrCat(" port ", want_port) : std::string(),
               "; devices: ", DescribeDevices(devices));
  }
  auto key = [](const Candidate& c) {
    return std::make_tuple(static_cast<int>(c.distance), c.dev->name, c.port->port);
  };
  const Candidate& best =
      *std::min_element(candidates.begin(), candidates.end(),
                        [&](const Candidate& a, const Candidate& b) { return key(a) < key(b); });

  RdmaPortChoice choice;
  choice.device = best.dev->name;
  choice.port = best.port->port;
  choice.link_layer = ParseLinkLayer(best.port->link_layer);
  choice.distance = best.distance;
  std::string how = !want_device.empty() ? "requested"
                    : gpu != nullptr     ? StrCat("nearest to GPU ", gpu->index, " (",
                                                  topology::PciDistanceName(best.distance), ")")
                                         : "first ACTIVE port (no GPU locality given)";
  choice.reason = StrCat(choice.device, " port ", choice.port, " (",
                         best.port->link_layer.empty() ? "?" : best.port->link_layer, "): ", how);
  return choice;
}

bool IsIpv4MappedGid(const std::array<uint8_t, 16>& gid) noexcept {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return false;
  }
  return gid[10] == 0xff && gid[11] == 0xff;
}

bool IsZeroGid(const std::array<uint8_t, 16>& gid) noexcept {
  return std::all_of(gid.begin(), gid.end(), [](uint8_t b) { return b == 0; });
}

std::string FormatGid(const std::array<uint8_t, 16>& gid) {
  char buf[40];
  for (int i = 0; i < 8; ++i) {
    std::snprintf(buf + i * 5, sizeof(buf) - static_cast<size_t>(i) * 5, "%02x%02x%s", gid[2 * i],
                  gid[2 * i + 1], i < 7 ? ":" : "");
  }
  return buf;
}

std::array<uint8_t, 16> ParseGid(const std::string& text) {
  std::array<uint8_t, 16> gid{};
  MORI_CHECK_ARG(::inet_pton(AF_INET6, text.c_str(), gid.data()) == 1, "'", text,
                 "' is not a GID (IPv6 address text)");
  return gid;
}

namespace {

bool IsRoceV2(const GidEntry& e) { return e.type.find("v2") != std::string::npos; }
bool IsLinkLocal(const std::array<uint8_t, 16>& g) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

// Lower is better; see SelectGidIndex.
int RoceRank(const GidEntry& e) {
  bool v2 = IsRoceV2(e);
  bool v4 = IsIpv4MappedGid(e.gid);
  if (v2 && v4) return 0;
  if (v2 && !IsLinkLocal(e.gid)) return 1;
  if (v2) return 2;
  if (v4) return 3;
  return 4;
}

const char* RankName(int rank) {
  static const char* const kNames[] = {"RoCE v2, IPv4-mapped", "RoCE v2, global IPv6",
                                       "RoCE v2, link-local", "RoCE v1, IPv4-mapped",
                                       "RoCE v1 / type unknown"};
  return kNames[rank];
}

}  // namespace

GidChoice SelectGidIndex(const std::vector<GidEntry>& table, LinkLayer link_layer, int requested) {
  std::string usable;
  for (const GidEntry& e : table) {
    if (IsZeroGid(e.gid)) continue;
    usable += StrCat(usable.empty() ? "" : ", ", e.index, " (", e.type.empty() ? "?" : e.type, " ",
                     FormatGid(e.gid), ")");
  }
  if (requested >= 0) {
    for (const GidEntry& e : table) {
      if (e.index != requested) continue;
      MORI_CHECK_ARG(!IsZeroGid(e.gid), "GID index ", requested,
                     " is an empty (all-zero) entry; usable: ", usable.empty() ? "none" : usable);
      return {requested, StrCat("GID index ", requested, " requested (",
                                e.type.empty() ? "?" : e.type, " ", FormatGid(e.gid), ")")};
    }
    MORI_THROW(InvalidArgumentError, "GID index ", requested, " not in the port's table of ",
               table.size(), " entries; usable: ", usable.empty() ? "none" : usable);
  }
  const GidEntry* best = nullptr;
  int best_rank = 0;
  for (const GidEntry& e : table) {
    if (IsZeroGid(e.gid)) continue;
    int rank = link_layer == LinkLayer::kEthernet ? RoceRank(e) : 0;
    if (best == nullptr || rank < best_rank || (rank == best_rank && e.index < best->index)) {
      best = &e;
      best_rank = rank;
    }
  }
  if (best == nullptr) {
    MORI_THROW(NotFoundError, "the port's GID table (", table.size(),
               " entries) has no non-zero GID: on RoCE the interface needs an IP address");
  }
  std::string why =
      link_layer == LinkLayer::kEthernet ? RankName(best_rank) : "InfiniBand port GID";
  return {best->index,
          StrCat("GID index ", best->index, " (", why, ", ", FormatGid(best->gid), ")")};
}

}  // namespace mori::transport::verbs
