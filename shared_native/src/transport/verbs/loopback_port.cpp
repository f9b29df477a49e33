// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The loopback test double of RdmaPort: see loopback_port.hpp for what it mirrors and
// where it differs. No verbs header, no NIC.
#include "loopback_port.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "mori/core/error.hpp"

namespace mori::transport::verbs::testing {

namespace {

constexpr std::array<uint8_t, 16> kLoopbackGid = {'m', 'o', 'r', 'i', ' ', 'l', 'o', 'o',
                                                  'p', 'b', 'a', 'c', 'k', 'Q', 'P', 0};

class LoopPort;
class LoopQp;

struct Registration {
  uintptr_t addr;
  uint64_t length;
  uint32_t lkey;
  uint32_t rkey;
};

// Every port and QP of the process, under one lock.
struct World {
  std::mutex mu;
  std::unordered_map<uint32_t, LoopQp*> qps;  // by QP number
  uint32_t next_qpn = 1;
  uint32_t next_key = 0x100;
};

World& TheWorld() {
  static World* w = new World;  // leaked: ports destroyed during exit still find it
  return *w;
}

bool Covers(const Registration& r, uint64_t addr, uint64_t length) {
  return addr >= r.addr && length <= r.length && addr - r.addr <= r.length - length;
}

class LoopPort final : public RdmaPort {
 public:
  explicit LoopPort(uint64_t max_message) : max_message_(max_message) {}
  ~LoopPort() override;
  std::string Describe() const override { return "loopback test double (no NIC)"; }
  uint64_t max_message_bytes() const override { return max_message_; }
  int cq_depth() const override { return 1 << 30; }  // a deque: never overruns
  MemoryKeys Register(void* addr, uint64_t length) override {
    std::lock_guard<std::mutex> lock(TheWorld().mu);
    Registration r{reinterpret_cast<uintptr_t>(addr), length, TheWorld().next_key++,
                   TheWorld().next_key++};
    regs_.push_back(r);
    return {r.lkey, r.rkey};
  }
  std::unique_ptr<RdmaQueuePair> CreateQp(uint32_t send_depth, uint32_t recv_depth) override;
  int Poll(WorkCompletion* out, int max) override;

  // Under the world lock.
  bool LocalOk(uint64_t addr, uint32_t length, uint32_t lkey) const {
    for (const Registration& r : regs_)
      if (r.lkey == lkey && Covers(r, addr, length)) return true;
    return false;
  }
  bool RemoteOk(uint64_t addr, uint32_t length, uint32_t rkey) const {
    for (const Registration& r : regs_)
      if (r.rkey == rkey && Covers(r, addr, length)) return true;
    return false;
  }
  void Complete(const WorkCompletion& wc) { cq_.push_back(wc); }
  std::vector<LoopQp*>& qps() { return qps_; }

 private:
  uint64_t max_message_;
  std::vector<Registration> regs_;
  std::deque<WorkCompletion> cq_;
  std::vector<LoopQp*> qps_;
};

class LoopQp final : public RdmaQueuePair {
 public:
  LoopQp(LoopPort* port, uint32_t qpn, uint32_t send_depth, uint32_t recv_depth)
      : port_(port), qpn_(qpn), send_depth_(send_depth), recv_depth_(recv_depth) {}
  ~LoopQp() override {
    std::lock_guard<std::mutex> lock(TheWorld().mu);
    TheWorld().qps.erase(qpn_);
    if (port_ != nullptr) {
      auto& v = port_->qps();
      v.erase(std::remove(v.begin(), v.end(), this), v.end());
    }
  }
  EndpointInfo LocalEndpoint() const override {
    EndpointInfo e;
    e.qpn = qpn_;
    e.psn = qpn_ & kPsnMask;
    e.lid = 1;
    e.port_num = 1;
    e.link_layer = LinkLayer::kInfiniBand;
    e.gid = kLoopbackGid;
    return e;
  }
  void Connect(const QpConfig& config, const EndpointInfo& remote) override {
    MORI_CHECK_ARG(remote.gid == kLoopbackGid, "loopback QP ", qpn_,
                   ": the peer's endpoint is not a loopback QP (QPN ", remote.qpn, ")");
    LocalPortInfo local;
    BuildInitTransition(config);
    BuildRtrTransition(config, local, remote);
    BuildRtsTransition(config, LocalEndpoint().psn);
    std::lock_guard<std::mutex> lock(TheWorld().mu);
    remote_qpn_ = remote.qpn;
  }
  int PostSend(const SendOp* ops, size_t n) override {
    std::lock_guard<std::mutex> lock(TheWorld().mu);
    if (remote_qpn_ == 0) return EINVAL;  // not connected (RESET: a NIC refuses too)
    if (outstanding() + n > send_depth_) return ENOMEM;
    for (size_t i = 0; i < n; ++i) {
      if (ops[i].opcode != WrOpcode::kWrite && ops[i].opcode != WrOpcode::kSend) return EINVAL;
    }
    for (size_t i = 0; i < n; ++i) pending_.push_back(ops[i]);
    return 0;
  }
  int PostRecv(const RecvOp* ops, size_t n) override {
    std::lock_guard<std::mutex> lock(TheWorld().mu);
    if (recvs_.size() + n > recv_depth_) return ENOMEM;
    for (size_t i = 0; i < n; ++i) recvs_.push_back(ops[i]);
    return 0;
  }
  uint32_t send_depth() const override { return send_depth_; }
  uint32_t recv_depth() const override { return recv_depth_; }

  // Under the world lock: runs the queued WRs in order until one waits for a receive.
  void Progress() {
    while (!pending_.empty()) {
      const SendOp op = pending_.front();
      int status = kWcSuccess;
      if (error_) {
        status = kWcFlushError;
      } else {
        auto it = TheWorld().qps.find(remote_qpn_);
        LoopQp* target = it == TheWorld().qps.end() ? nullptr : it->second;
        if (target == nullptr || target->port_ == nullptr) {
          status = kWcRetryExceeded;
        } else if (!port_->LocalOk(op.local_addr, op.length, op.lkey)) {
          status = kWcLocProtError;
        } else if (op.opcode == WrOpcode::kWrite) {
          if (op.length > port_->max_message_bytes() ||
              !target->port_->RemoteOk(op.remote_addr, op.length, op.rkey)) {
            status = kWcRemAccessError;
          } else if (op.length > 0) {
            std::memmove(reinterpret_cast<void*>(op.remote_addr),
                         reinterpret_cast<const void*>(op.local_addr), op.length);
          }
        } else {
          if (target->recvs_.empty()) return;  // RNR: retried at the next poll
          const RecvOp r = target->recvs_.front();
          if (op.length > r.length) {
            status = kWcLocLenError;
          } else {
            target->recvs_.pop_front();
            if (op.length > 0) {
              std::memcpy(reinterpret_cast<void*>(r.addr),
                          reinterpret_cast<const void*>(op.local_addr), op.length);
            }
            target->port_->Complete({r.wr_id, kWcSuccess, true, op.length});
          }
        }
      }
      pending_.pop_front();
      ++executed_;
      if (status != kWcSuccess) error_ = true;
      if (op.signaled || status != kWcSuccess) {
        port_->Complete({op.wr_id, status, false, 0});
        if (status == kWcSuccess) retired_ = executed_;
      }
    }
  }
  void Detach() { port_ = nullptr; }

 private:
  // WRs posted and not yet retired by a signaled completion at or after them.
  size_t outstanding() const { return executed_ - retired_ + pending_.size(); }

  LoopPort* port_;
  uint32_t qpn_;
  uint32_t send_depth_, recv_depth_;
  uint32_t remote_qpn_ = 0;
  bool error_ = false;
  std::deque<SendOp> pending_;
  std::deque<RecvOp> recvs_;
  uint64_t executed_ = 0, retired_ = 0;
};

LoopPort::~LoopPort() {
  std::lock_guard<std::mutex> lock(TheWorld().mu);
  for (LoopQp* qp : qps_) qp->Detach();
}

std::unique_ptr<RdmaQueuePair> LoopPort::CreateQp(uint32_t send_depth, uint32_t recv_depth) {
  MORI_CHECK_ARG(send_depth >= 1 && recv_depth >= 1, "loopback QP depths ", send_depth, "/",
                 recv_depth, " must be >= 1");
  std::lock_guard<std::mutex> lock(TheWorld().mu);
  const uint32_t qpn = TheWorld().next_qpn++ & kPsnMask;
  auto qp = std::make_unique<LoopQp>(this, qpn, send_depth, recv_depth);
  TheWorld().qps[qpn] = qp.get();
  qps_.push_back(qp.get());
  return qp;
}

int LoopPort::Poll(WorkCompletion* out, int max) {
  std::lock_guard<std::mutex> lock(TheWorld().mu);
  for (LoopQp* qp : qps_) qp->Progress();
  int n = 0;
  while (n < max && !cq_.empty()) {
    out[n++] = cq_.front();
    cq_.pop_front();
  }
  return n;
}

}  // namespace

std::unique_ptr<RdmaPort> CreateLoopbackPort(uint64_t max_message_bytes) {
  return std::make_unique<LoopPort>(max_message_bytes);
}

}  // namespace mori::transport::verbs::testing
