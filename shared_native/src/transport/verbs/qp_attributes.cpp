// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/verbs/qp_attributes.hpp"

#include <strings.h>

#include <algorithm>

#include "mori/core/error.hpp"

#if MORI_CORE_WITH_VERBS
#include <infiniband/verbs.h>

// The plain constants are the ibverbs ABI; a header that disagrees fails the build.
namespace qm = mori::transport::verbs::qp_mask;
static_assert(qm::kState == IBV_QP_STATE && qm::kAccessFlags == IBV_QP_ACCESS_FLAGS &&
                  qm::kPkeyIndex == IBV_QP_PKEY_INDEX && qm::kPort == IBV_QP_PORT &&
                  qm::kAv == IBV_QP_AV && qm::kPathMtu == IBV_QP_PATH_MTU &&
                  qm::kTimeout == IBV_QP_TIMEOUT && qm::kRetryCnt == IBV_QP_RETRY_CNT &&
                  qm::kRnrRetry == IBV_QP_RNR_RETRY && qm::kRqPsn == IBV_QP_RQ_PSN &&
                  qm::kMaxQpRdAtomic == IBV_QP_MAX_QP_RD_ATOMIC &&
                  qm::kMinRnrTimer == IBV_QP_MIN_RNR_TIMER && qm::kSqPsn == IBV_QP_SQ_PSN &&
                  qm::kMaxDestRdAtomic == IBV_QP_MAX_DEST_RD_ATOMIC &&
                  qm::kDestQpn == IBV_QP_DEST_QPN,
              "qp_mask constants differ from <infiniband/verbs.h>");
static_assert(static_cast<int>(mori::transport::verbs::QpState::kInit) == IBV_QPS_INIT &&
                  static_cast<int>(mori::transport::verbs::QpState::kRtr) == IBV_QPS_RTR &&
                  static_cast<int>(mori::transport::verbs::QpState::kRts) == IBV_QPS_RTS &&
                  static_cast<int>(mori::transport::verbs::QpState::kErr) == IBV_QPS_ERR,
              "QpState differs from enum ibv_qp_state");
static_assert(mori::transport::verbs::access::kLocalWrite == IBV_ACCESS_LOCAL_WRITE &&
                  mori::transport::verbs::access::kRemoteWrite == IBV_ACCESS_REMOTE_WRITE &&
                  mori::transport::verbs::access::kRemoteRead == IBV_ACCESS_REMOTE_READ,
              "access flags differ from enum ibv_access_flags");
static_assert(mori::transport::verbs::kMtuMin == IBV_MTU_256 &&
                  mori::transport::verbs::kMtuMax == IBV_MTU_4096,
              "MTU enum differs from enum ibv_mtu");
static_assert(static_cast<int>(mori::transport::verbs::LinkLayer::kInfiniBand) ==
                      IBV_LINK_LAYER_INFINIBAND &&
                  static_cast<int>(mori::transport::verbs::LinkLayer::kEthernet) ==
                      IBV_LINK_LAYER_ETHERNET,
              "LinkLayer differs from the IBV_LINK_LAYER_* values");
#endif

namespace mori::transport::verbs {

const char* LinkLayerName(LinkLayer layer) noexcept {
  switch (layer) {
    case LinkLayer::kInfiniBand:
      return "InfiniBand";
    case LinkLayer::kEthernet:
      return "Ethernet";
    default:
      return "unspecified";
  }
}

LinkLayer ParseLinkLayer(const std::string& text) noexcept {
  if (strcasecmp(text.c_str(), "InfiniBand") == 0 || strcasecmp(text.c_str(), "IB") == 0) {
    return LinkLayer::kInfiniBand;
  }
  if (strcasecmp(text.c_str(), "Ethernet") == 0 || strcasecmp(text.c_str(), "RoCE") == 0) {
    return LinkLayer::kEthernet;
  }
  return LinkLayer::kUnspecified;
}

int MtuEnumFromBytes(int bytes) {
  for (int e = kMtuMin; e <= kMtuMax; ++e) {
    if (MtuBytesFromEnum(e) == bytes) return e;
  }
  MORI_THROW(InvalidArgumentError, "path MTU ", bytes,
             " bytes is not one of 256, 512, 1024, 2048, 4096");
}

int MtuBytesFromEnum(int mtu) {
  MORI_CHECK_ARG(mtu >= kMtuMin && mtu <= kMtuMax, "MTU enum value ", mtu,
                 " outside [1, 5] (IBV_MTU_256..IBV_MTU_4096)");
  return 128 << mtu;
}

void ValidateQpConfig(const QpConfig& c) {
  MORI_CHECK_ARG(c.port_num >= 1, "QP port_num ", int{c.port_num}, " must be >= 1");
  MORI_CHECK_ARG(c.timeout <= 31, "QP timeout ", int{c.timeout},
                 " outside [0, 31] (4.096 us * 2^timeout)");
  MORI_CHECK_ARG(c.retry_cnt <= 7, "QP retry_cnt ", int{c.retry_cnt}, " outside [0, 7]");
  MORI_CHECK_ARG(c.rnr_retry <= 7, "QP rnr_retry ", int{c.rnr_retry}, " outside [0, 7]");
  MORI_CHECK_ARG(c.min_rnr_timer <= 31, "QP min_rnr_timer ", int{c.min_rnr_timer},
                 " outside [0, 31]");
  MORI_CHECK_ARG(c.max_rd_atomic >= 1, "QP max_rd_atomic ", int{c.max_rd_atomic},
                 " must be >= 1 (RDMA READ needs at least one outstanding read)");
  MORI_CHECK_ARG(c.max_dest_rd_atomic >= 1, "QP max_dest_rd_atomic ", int{c.max_dest_rd_atomic},
                 " must be >= 1 (the peer's RDMA READs need a responder resource)");
  MORI_CHECK_ARG(c.max_path_mtu >= kMtuMin && c.max_path_mtu <= kMtuMax, "QP max_path_mtu ",
                 c.max_path_mtu, " outside [1, 5] (enum ibv_mtu)");
  MORI_CHECK_ARG(c.service_level <= 15, "QP service_level ", int{c.service_level},
                 " outside [0, 15]");
}

int NegotiatePathMtu(int local_mtu, int remote_mtu, int config_max) {
  MORI_CHECK_ARG(local_mtu >= kMtuMin && local_mtu <= kMtuMax, "local active MTU enum ", local_mtu,
                 " outside [1, 5]");
  MORI_CHECK_ARG(remote_mtu >= kMtuMin && remote_mtu <= kMtuMax, "remote active MTU enum ",
                 remote_mtu, " outside [1, 5]");
  MORI_CHECK_ARG(config_max >= kMtuMin && config_max <= kMtuMax, "configured MTU bound ",
                 config_max, " outside [1, 5]");
  return std::min({local_mtu, remote_mtu, config_max});
}

QpTransition BuildInitTransition(const QpConfig& config) {
  ValidateQpConfig(config);
  QpTransition t;
  t.state = QpState::kInit;
  t.attr_mask = qp_mask::kState | qp_mask::kPkeyIndex | qp_mask::kPort | qp_mask::kAccessFlags;
  t.pkey_index = config.pkey_index;
  t.port_num = config.port_num;
  t.access_flags = kRegionAccess;
  return t;
}

QpTransition BuildRtrTransition(const QpConfig& config, const LocalPortInfo& local,
                                const EndpointInfo& remote) {
  ValidateQpConfig(config);
  MORI_CHECK_ARG(remote.qpn != 0 && remote.qpn <= kPsnMask, "remote QP number ", remote.qpn,
                 " outside [1, 2^24)");
  MORI_CHECK_ARG(remote.psn <= kPsnMask, "remote PSN ", remote.psn, " does not fit 24 bits");
  MORI_CHECK_ARG(
      local.link_layer == LinkLayer::kInfiniBand || local.link_layer == LinkLayer::kEthernet,
      "local port link layer ", LinkLayerName(local.link_layer),
      " is neither InfiniBand nor Ethernet");
  MORI_CHECK_ARG(remote.link_layer == local.link_layer, "link layers differ: local ",
                 LinkLayerName(local.link_layer), ", remote ", LinkLayerName(remote.link_layer),
                 " (an RC QP cannot connect InfiniBand to RoCE)");
  MORI_CHECK_ARG(local.gid_index >= 0 && local.gid_index <= 255, "local GID index ",
                 local.gid_index, " outside [0, 255]");

  QpTransition t;
  t.state = QpState::kRtr;
  t.attr_mask = qp_mask::kState | qp_mask::kAv | qp_mask::kPathMtu | qp_mask::kDestQpn |
                qp_mask::kRqPsn | qp_mask::kMaxDestRdAtomic | qp_mask::kMinRnrTimer;
  t.path_mtu = NegotiatePathMtu(local.active_mtu, remote.active_mtu, config.max_path_mtu);
  t.dest_qpn = remote.qpn;
  t.rq_psn = remote.psn;  // we receive the PSNs the peer sends
  t.max_dest_rd_atomic = config.max_dest_rd_atomic;
  t.min_rnr_timer = config.min_rnr_timer;

  AddressVector& av = t.av;
  av.sl = config.service_level;
  av.port_num = config.port_num;
  bool zero_gid =
      std::all_of(remote.gid.begin(), remote.gid.end(), [](uint8_t b) { return b == 0; });
  if (local.link_layer == LinkLayer::kEthernet) {
    // RoCE has no LIDs: every packet carries a GRH addressed by GID.
    MORI_CHECK_ARG(!zero_gid, "remote RoCE endpoint (QPN ", remote.qpn,
                   ") sent an all-zero GID: its GID index points at an empty entry");
    av.is_global = true;
  } else {
    MORI_CHECK_ARG(remote.lid != 0, "remote InfiniBand endpoint (QPN ", remote.qpn,
                   ") has LID 0: its port is not configured by a subnet manager");
    av.dlid = remote.lid;
    av.is_global = config.force_grh;
    MORI_CHECK_ARG(!av.is_global || !zero_gid, "force_grh is set but the remote endpoint (QPN ",
                   remote.qpn, ") sent an all-zero GID");
  }
  if (av.is_global) {
    av.dgid = remote.gid;
    av.sgid_index = static_cast<uint8_t>(local.gid_index);
    av.hop_limit = config.hop_limit;
    av.traffic_class = config.traffic_class;
  }
  return t;
}

QpTransition BuildRtsTransition(const QpConfig& config, uint32_t local_psn) {
  ValidateQpConfig(config);
  MORI_CHECK_ARG(local_psn <= kPsnMask, "local PSN ", local_psn, " does not fit 24 bits");
  QpTransition t;
  t.state = QpState::kRts;
  t.attr_mask = qp_mask::kState | qp_mask::kTimeout | qp_mask::kRetryCnt | qp_mask::kRnrRetry |
                qp_mask::kSqPsn | qp_mask::kMaxQpRdAtomic;
  t.timeout = config.timeout;
  t.retry_cnt = config.retry_cnt;
  t.rnr_retry = config.rnr_retry;
  t.sq_psn = local_psn;
  t.max_rd_atomic = config.max_rd_atomic;
  return t;
}

}  // namespace mori::transport::verbs
