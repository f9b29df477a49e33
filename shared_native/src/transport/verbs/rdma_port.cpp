// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// OpenRdmaPort: the RdmaPort of a real NIC over the verbs objects (verbs_objects.hpp).
// Compiled where rdma-core's headers are; NOT run against a NIC.
#include "mori/transport/verbs/rdma_port.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/str.hpp"
#include "mori/core/version.hpp"
#include "mori/topology/topology.hpp"
#include "mori/transport/verbs/nic_select.hpp"
#include "mori/transport/verbs/verbs_loader.hpp"
#include "mori/transport/verbs/verbs_objects.hpp"

namespace mori::transport::verbs {

RdmaQueuePair::~RdmaQueuePair() = default;
RdmaPort::~RdmaPort() = default;

#if !MORI_CORE_WITH_VERBS

std::unique_ptr<RdmaPort> OpenRdmaPort(const RdmaPortOptions&) {
  MORI_THROW(NotSupportedError,
             "RDMA unavailable: libmori_core was built without rdma-core's headers "
             "(infiniband/verbs.h; install libibverbs-dev and rebuild mori-core)");
}

#else

namespace {

class VerbsQueuePair final : public RdmaQueuePair {
 public:
  VerbsQueuePair(const VerbsDevice& device, uint32_t send_depth, uint32_t recv_depth)
      : qp_(device, 0, send_depth, recv_depth, 1) {}
  EndpointInfo LocalEndpoint() const override { return qp_.LocalEndpoint(); }
  void Connect(const QpConfig& config, const EndpointInfo& remote) override {
    qp_.Connect(config, remote);
  }
  int PostSend(const SendOp* ops, size_t n) override { return qp_.PostSendOps(ops, n); }
  int PostRecv(const RecvOp* ops, size_t n) override { return qp_.PostRecvOps(ops, n); }
  uint32_t send_depth() const override { return qp_.max_send_wr(); }
  uint32_t recv_depth() const override { return qp_.max_recv_wr(); }

 private:
  RcQueuePair qp_;
};

class VerbsPort final : public RdmaPort {
 public:
  VerbsPort(const VerbsApi& api, const RdmaPortChoice& choice, const RdmaPortOptions& options)
      : device_(std::make_unique<VerbsDevice>(api, choice.device, choice.port, options.gid_index, 1,
                                              options.cq_depth, false)) {
    max_message_ = std::min<uint64_t>(device_->port_attr().max_msg_sz, uint64_t{1} << 30);
    cq_depth_ = std::min(options.cq_depth, device_->device_attr().max_cqe);
  }
  ~VerbsPort() override {
    regs_.clear();  // before the device (its PD)
  }
  std::string Describe() const override { return device_->Describe(); }
  uint64_t max_message_bytes() const override { return max_message_; }
  int cq_depth() const override { return cq_depth_; }
  MemoryKeys Register(void* addr, uint64_t length) override {
    regs_.push_back(
        std::make_unique<MemoryRegistration>(*device_, reinterpret_cast<uintptr_t>(addr), length));
    return {regs_.back()->lkey(), regs_.back()->rkey()};
  }
  std::unique_ptr<RdmaQueuePair> CreateQp(uint32_t send_depth, uint32_t recv_depth) override {
    return std::make_unique<VerbsQueuePair>(*device_, send_depth, recv_depth);
  }
  int Poll(WorkCompletion* out, int max) override {
    wc_.resize(static_cast<size_t>(std::max(max, 1)));
    const int n = ibv_poll_cq(device_->cqs()[0].cq, max, wc_.data());
    if (n < 0) MORI_THROW(TransportError, "rdma: ibv_poll_cq on ", device_->name(), " failed");
    for (int i = 0; i < n; ++i) {
      out[i].wr_id = wc_[i].wr_id;
      out[i].status = static_cast<int>(wc_[i].status);
      out[i].recv = (wc_[i].opcode & IBV_WC_RECV) != 0;
      out[i].byte_len = wc_[i].byte_len;
    }
    return n;
  }

 private:
  std::unique_ptr<VerbsDevice> device_;
  std::vector<std::unique_ptr<MemoryRegistration> > regs_;
  std::vector<ibv_wc> wc_;
  uint64_t max_message_ = 0;
  int cq_depth_ = 0;
};

}  // namespace

std::unique_ptr<RdmaPort> OpenRdmaPort(const RdmaPortOptions& options) {
  std::string reason;
  const VerbsApi* api = Verbs(&reason);
  if (api == nullptr) MORI_THROW(NotSupportedError, "RDMA unavailable: ", reason);
  topology::DiscoverOptions discover;
  discover.discover_gpus = options.gpu_index >= 0;
  topology::Topology topo = topology::Discover(discover);
  if (topo.rdma_devices.empty()) {
    MORI_THROW(NotSupportedError, "RDMA unavailable: ", reason,
               ", but there is no RDMA device under /sys/class/infiniband");
  }
  const topology::Gpu* gpu = nullptr;
  for (const topology::Gpu& g : topo.gpus) {
    if (g.index == options.gpu_index) gpu = &g;
  }
  RdmaPortChoice choice = ChooseRdmaPort(topo.rdma_devices, gpu, options.device, 0);
  MORI_LOG_INFO(kCore, "rdma: ", choice.reason);
  return std::make_unique<VerbsPort>(*api, choice, options);
}

#endif  // MORI_CORE_WITH_VERBS

}  // namespace mori::transport::verbs
