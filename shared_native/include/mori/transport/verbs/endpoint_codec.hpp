// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The RDMA payloads of mori-io's engine control messages and of the proxy's queue-pair
// exchange over its bootstrap: a set of QP endpoints (to
// connect queue pairs) and a region's remote key (to address it with one-sided
// READ/WRITE). A small versioned binary format, little-endian:
//
//   header (8 bytes): magic "mRDM", version (u8, 1), kind (u8: 1 = endpoints,
//                     2 = region key), count (u16)
//   endpoints: count entries of 30 bytes: qpn u32, psn u32, lid u16, port u8,
//              active_mtu u8 (enum ibv_mtu), link_layer u8, reserved u8 (0), gid[16]
//   region key: count = 1, one entry of 20 bytes: addr u64, length u64, rkey u32
//
// Decoding checks the magic, version, kind and the exact length before reading, and
// the values after (24-bit QPN/PSN, MTU 1..5, a known link layer); anything else is
// an InvalidArgumentError saying what was wrong, never a partial result.

#include <cstdint>
#include <string>
#include <vector>

#include "mori/transport/verbs/qp_attributes.hpp"

namespace mori::transport::verbs {

inline constexpr uint8_t kCodecVersion = 1;
inline constexpr size_t kCodecHeaderBytes = 8;
inline constexpr size_t kEndpointEntryBytes = 30;
inline constexpr size_t kRegionKeyEntryBytes = 20;
inline constexpr size_t kMaxEndpointsPerMessage = 127;  // qp_per_transfer's bound

struct RegionKey {
  uint64_t addr = 0;    // the virtual address the region was registered at
  uint64_t length = 0;  // bytes
  uint32_t rkey = 0;
};

MORI_API std::string EncodeEndpoints(const std::vector<EndpointInfo>& endpoints);
MORI_API std::vector<EndpointInfo> DecodeEndpoints(const std::string& bytes);

MORI_API std::string EncodeRegionKey(const RegionKey& key);
MORI_API RegionKey DecodeRegionKey(const std::string& bytes);

}  // namespace mori::transport::verbs
