// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The verbs-facing half of mori's RDMA code (mori-io's RDMA backend, the proxy's
// verbs port in rdma_port.cpp): an opened device port (context, PD, CQs,
// port attributes, GID table), memory registrations, RC queue pairs with their state
// machine, posting of planned work requests. Everything decided here without a device
// (attributes, plans, choices, encodings) comes from the pure files next to it; this
// file only moves those values into verbs calls. Compiled only with the ibverbs
// headers (MORI_CORE_WITH_VERBS); it has NOT run against a NIC.

#include "mori/core/version.hpp"

#if MORI_CORE_WITH_VERBS

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mori/transport/verbs/nic_select.hpp"
#include "mori/transport/verbs/qp_attributes.hpp"
#include "mori/transport/verbs/rdma_port.hpp"
#include "mori/transport/verbs/verbs_loader.hpp"
#include "mori/transport/verbs/work_request_plan.hpp"

namespace mori::transport::verbs {

// A CQ and, in event mode, the completion channel it reports to.
struct CompletionQueue {
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
};

// One port of one opened device. Throws TransportError naming the verb and errno when
// a verb fails, InvalidArgumentError/NotFoundError for a bad GID index.
class MORI_API VerbsDevice {
 public:
  VerbsDevice(const VerbsApi& api, const std::string& device, int port, int gid_index, int num_cqs,
              int cq_depth, bool event_mode);
  ~VerbsDevice();
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  const VerbsApi& api() const { return api_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  const std::vector<CompletionQueue>& cqs() const { return cqs_; }
  const ibv_device_attr& device_attr() const { return device_attr_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const std::string& name() const { return name_; }
  uint8_t port() const { return port_; }
  LinkLayer link_layer() const { return link_layer_; }
  const GidChoice& gid() const { return gid_; }
  const std::array<uint8_t, 16>& gid_value() const { return gid_value_; }
  LocalPortInfo PortInfo() const;
  std::string Describe() const;

 private:
  void Close() noexcept;
  const VerbsApi& api_;
  std::string name_;
  uint8_t port_ = 1;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::vector<CompletionQueue> cqs_;
  ibv_device_attr device_attr_{};
  ibv_port_attr port_attr_{};
  LinkLayer link_layer_ = LinkLayer::kUnspecified;
  GidChoice gid_;
  std::array<uint8_t, 16> gid_value_{};
};

// The GID table of a port as ibv_query_gid and sysfs (types) report it.
MORI_API std::vector<GidEntry> ReadGidTable(const VerbsApi& api, ibv_context* ctx,
                                            const std::string& device, uint8_t port, int table_len);

// A registered memory region (deregistered on destruction).
class MORI_API MemoryRegistration {
 public:
  MemoryRegistration(const VerbsDevice& device, uintptr_t addr, uint64_t length);
  ~MemoryRegistration();
  MemoryRegistration(const MemoryRegistration&) = delete;
  MemoryRegistration& operator=(const MemoryRegistration&) = delete;
  uintptr_t addr() const { return addr_; }
  uint64_t length() const { return length_; }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }

 private:
  const VerbsApi& api_;
  ibv_mr* mr_ = nullptr;
  uintptr_t addr_;
  uint64_t length_;
};

// Where a planned chain goes: the local region's address and lkey, the remote region's
// address and rkey.
struct PostTarget {
  uintptr_t local_base;
  uint32_t lkey;
  uint64_t remote_base;
  uint32_t rkey;
};

// One RC queue pair. Not thread-safe: the backend serializes posting per QP.
class MORI_API RcQueuePair {
 public:
  RcQueuePair(const VerbsDevice& device, int cq_index, uint32_t max_send_wr, uint32_t max_recv_wr,
              uint32_t max_sge);
  ~RcQueuePair();
  RcQueuePair(const RcQueuePair&) = delete;
  RcQueuePair& operator=(const RcQueuePair&) = delete;

  uint32_t qpn() const { return qp_->qp_num; }
  int cq_index() const { return cq_index_; }
  uint32_t max_send_wr() const { return max_send_wr_; }
  uint32_t max_recv_wr() const { return max_recv_wr_; }
  uint32_t max_sge() const { return max_sge_; }
  // What the peer needs to connect to this QP.
  EndpointInfo LocalEndpoint() const;
  // RESET -> INIT -> RTR -> RTS towards `remote`. Throws TransportError naming the
  // transition and errno.
  void Connect(const QpConfig& config, const EndpointInfo& remote);
  // Moves the QP to ERROR so that every outstanding WR is flushed.
  void MarkError() noexcept;
  // Posts wrs[0, n) as one chain (one ibv_post_send), wr_ids encoding `slot`.
  // Returns 0 or the errno of the post; on failure *posted is how many went out.
  int PostChain(const PlannedWr* wrs, size_t n, const PlannedSge* sges, const PostTarget& target,
                uint32_t slot, size_t* posted);
  // Posts `n` zero-SGE receive WRs (they absorb WRITE_WITH_IMM notifications).
  int PostReceives(uint32_t n);
  // Posts SendOps (one SGE each) / receive buffers as one chain; 0 or the errno.
  int PostSendOps(const SendOp* ops, size_t n);
  int PostRecvOps(const RecvOp* ops, size_t n);

 private:
  void Modify(const QpTransition& t, const char* what);
  const VerbsDevice& device_;
  ibv_qp* qp_ = nullptr;
  int cq_index_;
  uint32_t max_send_wr_;
  uint32_t max_recv_wr_;
  uint32_t max_sge_;
  uint32_t psn_;
  std::vector<ibv_send_wr> wr_buf_;
  std::vector<ibv_sge> sge_buf_;
};

// ibv_wc_status_str-like text for a completion status, with the enum name.
MORI_API std::string DescribeWcStatus(const VerbsApi* api, int status);

}  // namespace mori::transport::verbs

#endif  // MORI_CORE_WITH_VERBS
