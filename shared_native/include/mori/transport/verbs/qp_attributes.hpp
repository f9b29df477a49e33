// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The attributes of each RC queue-pair transition (RESET -> INIT -> RTR -> RTS), built
// as plain values from a configuration and the peer's endpoint information. Nothing
// here includes <infiniband/verbs.h> or touches a device: the constants below carry
// the ibverbs ABI values (qp_attributes.cpp checks them against the header when it is
// available), so the transitions are unit-tested on machines without RDMA.

#include <array>
#include <cstdint>
#include <string>

#include "mori/core/macros.hpp"

namespace mori::transport::verbs {

// enum ibv_qp_attr_mask
namespace qp_mask {
inline constexpr uint32_t kState = 1u << 0;
inline constexpr uint32_t kAccessFlags = 1u << 3;
inline constexpr uint32_t kPkeyIndex = 1u << 4;
inline constexpr uint32_t kPort = 1u << 5;
inline constexpr uint32_t kAv = 1u << 7;
inline constexpr uint32_t kPathMtu = 1u << 8;
inline constexpr uint32_t kTimeout = 1u << 9;
inline constexpr uint32_t kRetryCnt = 1u << 10;
inline constexpr uint32_t kRnrRetry = 1u << 11;
inline constexpr uint32_t kRqPsn = 1u << 12;
inline constexpr uint32_t kMaxQpRdAtomic = 1u << 13;
inline constexpr uint32_t kMinRnrTimer = 1u << 15;
inline constexpr uint32_t kSqPsn = 1u << 16;
inline constexpr uint32_t kMaxDestRdAtomic = 1u << 17;
inline constexpr uint32_t kDestQpn = 1u << 20;
}  // namespace qp_mask

// enum ibv_qp_state
enum class QpState : int {
  kReset = 0,
  kInit = 1,
  kRtr = 2,
  kRts = 3,
  kSqd = 4,
  kSqe = 5,
  kErr = 6
};

// enum ibv_access_flags
namespace access {
inline constexpr uint32_t kLocalWrite = 1u << 0;
inline constexpr uint32_t kRemoteWrite = 1u << 1;
inline constexpr uint32_t kRemoteRead = 1u << 2;
}  // namespace access

// What every memory region and QP of this backend grants: the initiator's one-sided
// READ/WRITE land in (or are served from) a registered region.
inline constexpr uint32_t kRegionAccess =
    access::kLocalWrite | access::kRemoteRead | access::kRemoteWrite;

// enum ibv_port_attr::link_layer
enum class LinkLayer : uint8_t { kUnspecified = 0, kInfiniBand = 1, kEthernet = 2 };

MORI_API const char* LinkLayerName(LinkLayer layer) noexcept;
// "InfiniBand", "Ethernet" (sysfs spelling), any case; anything else -> kUnspecified.
MORI_API LinkLayer ParseLinkLayer(const std::string& text) noexcept;

// enum ibv_mtu: 1 = 256 bytes ... 5 = 4096 bytes.
inline constexpr int kMtuMin = 1;
inline constexpr int kMtuMax = 5;
// 256/512/1024/2048/4096 -> 1..5; throws InvalidArgumentError otherwise.
MORI_API int MtuEnumFromBytes(int bytes);
MORI_API int MtuBytesFromEnum(int mtu);  // throws InvalidArgumentError for a value outside 1..5

inline constexpr uint32_t kPsnMask = 0xFFFFFF;  // PSNs and QP numbers are 24 bits

// Per-QP settings, validated by ValidateQpConfig. Units follow the IB spec.
struct QpConfig {
  uint8_t port_num = 1;
  uint16_t pkey_index = 0;
  // Local ACK timeout: 4.096 us * 2^timeout (0 = infinite); 14 is about 67 ms.
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;            // transport retries, 0..7
  uint8_t rnr_retry = 7;            // receiver-not-ready retries, 0..7 (7 = without limit)
  uint8_t min_rnr_timer = 12;       // RNR NAK delay code, 0..31 (12 = 0.64 ms)
  uint8_t max_rd_atomic = 16;       // RDMA READs in flight as initiator (RTS)
  uint8_t max_dest_rd_atomic = 16;  // RDMA READs served at once as responder (RTR)
  int max_path_mtu = kMtuMax;       // upper bound of the negotiated path MTU (enum)
  uint8_t service_level = 0;        // 0..15
  uint8_t traffic_class = 0;        // GRH traffic class (RoCE DSCP << 2)
  uint8_t hop_limit = 64;
  bool force_grh = false;  // InfiniBand: address the peer by GID as well (routed subnets)
};

// Throws InvalidArgumentError naming the first bad field and its value.
MORI_API void ValidateQpConfig(const QpConfig& config);

// What one QP tells its peer over the control channel.
struct EndpointInfo {
  uint32_t qpn = 0;  // 24 bits
  uint32_t psn = 0;  // 24 bits: the first PSN this QP sends
  uint16_t lid = 0;  // InfiniBand port LID; 0 on RoCE
  uint8_t port_num = 1;
  uint8_t active_mtu = kMtuMax;  // enum ibv_mtu of the port
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  std::array<uint8_t, 16> gid{};  // the GID at the chosen index (RoCE: required)
};

// What the local port contributes to RTR.
struct LocalPortInfo {
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  uint8_t active_mtu = kMtuMax;
  int gid_index = 0;
};

struct AddressVector {
  uint16_t dlid = 0;
  uint8_t sl = 0;
  uint8_t src_path_bits = 0;
  uint8_t port_num = 0;
  bool is_global = false;
  std::array<uint8_t, 16> dgid{};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 0;
  uint8_t traffic_class = 0;
};

// The fields of one ibv_modify_qp call; only those named by attr_mask are meaningful.
struct QpTransition {
  QpState state = QpState::kReset;
  uint32_t attr_mask = 0;
  // INIT
  uint32_t access_flags = 0;
  uint16_t pkey_index = 0;
  uint8_t port_num = 0;
  // RTR
  int path_mtu = 0;
  uint32_t dest_qpn = 0;
  uint32_t rq_psn = 0;
  uint8_t max_dest_rd_atomic = 0;
  uint8_t min_rnr_timer = 0;
  AddressVector av;
  // RTS
  uint8_t timeout = 0;
  uint8_t retry_cnt = 0;
  uint8_t rnr_retry = 0;
  uint32_t sq_psn = 0;
  uint8_t max_rd_atomic = 0;
};

// The three transitions of an RC QP. Each validates its inputs and throws
// InvalidArgumentError with the offending value (a peer on another link layer, a RoCE
// peer without GID, an InfiniBand peer with LID 0, a PSN or QPN over 24 bits).
MORI_API QpTransition BuildInitTransition(const QpConfig& config);
MORI_API QpTransition BuildRtrTransition(const QpConfig& config, const LocalPortInfo& local,
                                         const EndpointInfo& remote);
MORI_API QpTransition BuildRtsTransition(const QpConfig& config, uint32_t local_psn);

// The path MTU both ends support: min(local, remote, configured bound).
MORI_API int NegotiatePathMtu(int local_mtu, int remote_mtu, int config_max);

}  // namespace mori::transport::verbs
