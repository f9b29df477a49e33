// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "rdma/rdma_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/transport/verbs/verbs_loader.hpp"
#include "wire/log_safe.hpp"

#if MORI_IO_WITH_RDMA
#include <arpa/inet.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "mori/topology/topology.hpp"
#include "mori/transport/verbs/nic_select.hpp"
#include "mori/transport/verbs/send_queue.hpp"
#include "mori/transport/verbs/verbs_objects.hpp"
#endif

namespace mori::io::rdma {

void ValidateRdmaBackendConfig(const RdmaBackendConfig& c) {
  MORI_CHECK_ARG(c.qp_per_transfer >= 1 && c.qp_per_transfer <= static_cast<int>(kImmMaxParts),
                 "RdmaBackendConfig.qp_per_transfer ", c.qp_per_transfer, " outside [1, ",
                 kImmMaxParts, "]");
  MORI_CHECK_ARG(c.num_worker_threads >= 1 && c.num_worker_threads <= 64,
                 "RdmaBackendConfig.num_worker_threads ", c.num_worker_threads, " outside [1, 64]");
  MORI_CHECK_ARG(c.max_send_wr >= 1 && c.max_send_wr <= (1 << 16), "RdmaBackendConfig.max_send_wr ",
                 c.max_send_wr, " outside [1, 65536]");
  MORI_CHECK_ARG(c.max_recv_wr >= 1 && c.max_recv_wr <= (1 << 16), "RdmaBackendConfig.max_recv_wr ",
                 c.max_recv_wr, " outside [1, 65536]");
  MORI_CHECK_ARG(
      c.post_batch_size == -1 || (c.post_batch_size >= 1 && c.post_batch_size <= c.max_send_wr),
      "RdmaBackendConfig.post_batch_size ", c.post_batch_size,
      " must be -1 (automatic) or in [1, max_send_wr=", c.max_send_wr, "]");
  MORI_CHECK_ARG(c.signal_interval >= 1 && c.signal_interval <= c.max_send_wr,
                 "RdmaBackendConfig.signal_interval ", c.signal_interval,
                 " outside [1, max_send_wr=", c.max_send_wr, "]");
  MORI_CHECK_ARG(c.max_sge >= 0 && c.max_sge <= 256, "RdmaBackendConfig.max_sge ", c.max_sge,
                 " outside [0, 256] (0 = automatic)");
  MORI_CHECK_ARG(c.max_message_bytes <= (uint64_t{1} << 31), "RdmaBackendConfig.max_message_bytes ",
                 c.max_message_bytes, " over 2^31 (0 = automatic)");
  MORI_CHECK_ARG(c.port >= 0 && c.port <= 255, "RdmaBackendConfig.port ", c.port,
                 " outside [0, 255] (0 = automatic)");
  MORI_CHECK_ARG(c.gid_index >= -1 && c.gid_index <= 255, "RdmaBackendConfig.gid_index ",
                 c.gid_index, " outside [-1, 255] (-1 = automatic)");
  MORI_CHECK_ARG(c.gpu_index >= -1, "RdmaBackendConfig.gpu_index ", c.gpu_index,
                 " must be >= -1 (-1 = no GPU locality)");
  MORI_CHECK_ARG(c.cq_depth >= 1, "RdmaBackendConfig.cq_depth ", c.cq_depth, " must be >= 1");
  ValidateQpConfig(c.qp);
}

int EffectivePostBatchSize(const RdmaBackendConfig& c) {
  return c.post_batch_size > 0 ? c.post_batch_size : std::min(32, c.max_send_wr);
}

void CheckRegionIdle(uint64_t mem_id, uint64_t busy) {
  if (busy != 0) {
    MORI_THROW(InvalidStateError, "RDMA: memory id ", mem_id, " has ", busy,
               " transfer(s) in flight; deregister it after they finish");
  }
}

#if MORI_IO_TESTING
namespace {
std::atomic<RdmaBackendFactory> test_factory{nullptr};
}  // namespace

void SetRdmaBackendFactoryForTesting(RdmaBackendFactory factory) {
  test_factory.store(factory, std::memory_order_release);
}
#endif

namespace {
// What a test build's factory makes instead of the real backend; nullptr otherwise.
std::unique_ptr<RdmaBackend> FromTestFactory([[maybe_unused]] const RdmaBackendConfig& config) {
#if MORI_IO_TESTING
  if (RdmaBackendFactory factory = test_factory.load(std::memory_order_acquire)) {
    return factory(config);
  }
#endif
  return nullptr;
}
}  // namespace

#if !MORI_IO_WITH_RDMA

// MORI_IO_RDMA_BUILD (CMakeLists.txt) says why: no headers, or MORI_IO_RDMA=off.
RdmaProbe ProbeRdma() { return {false, MORI_IO_RDMA_BUILD, {}}; }

std::unique_ptr<RdmaBackend> RdmaBackend::Create(const RdmaBackendConfig& config) {
  if (std::unique_ptr<RdmaBackend> test_double = FromTestFactory(config)) return test_double;
  ValidateRdmaBackendConfig(config);
  MORI_THROW(NotSupportedError, MORI_IO_RDMA_BUILD,
             " (rebuild mori-io with rdma-core's headers for RDMA)");
}

#else  // MORI_IO_WITH_RDMA

RdmaProbe ProbeRdma() {
  RdmaProbe probe;
  std::string reason;
  const VerbsApi* api = Verbs(&reason);
  if (api == nullptr) {
    probe.reason = reason;
    return probe;
  }
  int count = 0;
  ibv_device** list = api->get_device_list(&count);
  if (list == nullptr) {
    // ENOSYS: the kernel exposes no verbs device (no ib_uverbs, no NIC, no soft-RoCE).
    int err = errno;
    probe.reason = StrCat(
        reason, ", but lists no RDMA device (ibv_get_device_list: ", std::strerror(err), ")");
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    const char* name = api->get_device_name(list[i]);
    probe.devices.push_back(name != nullptr ? name : "?");
  }
  api->free_device_list(list);
  if (probe.devices.empty()) {
    probe.reason = StrCat(reason, ", but it lists no RDMA device");
    return probe;
  }
  std::string names;
  for (const std::string& n : probe.devices) names += (names.empty() ? "" : ", ") + n;
  probe.available = true;
  probe.reason = StrCat(probe.devices.size(), " RDMA device(s): ", names);
  return probe;
}

namespace {

constexpr uint32_t kMaxRecords = 1u << 16;

StatusDetail StatusForWc(int status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return StatusDetail::ERR_PEER_LOST;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
      return StatusDetail::ERR_OUT_OF_BOUNDS;
    default:
      return StatusDetail::ERR_TRANSPORT;
  }
}

struct Registration {
  std::unique_ptr<MemoryRegistration> mr;
  std::atomic<uint64_t> inflight{0};
};

// A slice of a transfer waiting for (or partly in) the send queue.
struct PendingSlice {
  uint32_t slot;
  QpPlan plan;
  size_t next = 0;  // first WR not yet posted
  PostTarget target;
  uint32_t UnpostedSignaled() const {
    uint32_t n = 0;
    for (size_t i = next; i < plan.wrs.size(); ++i) {
      n += (plan.wrs[i].send_flags & send_flag::kSignaled) != 0;
    }
    return n;
  }
};

struct QpContext {
  QpContext(std::unique_ptr<RcQueuePair> q, std::string peer)
      : qp(std::move(q)), peer_key(std::move(peer)), sq(qp->max_send_wr()) {}
  std::unique_ptr<RcQueuePair> qp;
  std::string peer_key;
  std::mutex mu;  // guards sq, pending, dead and posting on qp
  SendQueueTracker sq;
  std::deque<PendingSlice> pending;
  bool dead = false;
};

struct PeerQps {
  std::vector<std::shared_ptr<QpContext> > qps;
  bool ready = false;
  std::atomic<uint32_t> next{0};
};

struct Record {
  bool live = false;
  uint64_t uid = 0;
  uint32_t remaining = 0;  // signaled completions still due
  StatusDetail code = StatusDetail::SUCCESS;
  std::string message;
  RdmaCompletion done;
  std::shared_ptr<Registration> reg;
};

class RdmaBackendImpl final : public RdmaBackend {
 public:
  RdmaBackendImpl(const VerbsApi& api, const RdmaBackendConfig& config,
                  const RdmaPortChoice& choice)
      : api_(api), config_(config) {
    device_ = std::make_unique<VerbsDevice>(api, choice.device, choice.port, config.gid_index,
                                            config.num_worker_threads, config.cq_depth,
                                            config.poll_cq_mode == PollCqMode::kEvent);
    const ibv_device_attr& dev = device_->device_attr();
    max_sge_ =
        static_cast<uint32_t>(config.max_sge > 0 ? config.max_sge : std::min(16, dev.max_sge));
    uint64_t port_max = device_->port_attr().max_msg_sz;
    max_message_ = config.max_message_bytes > 0 ? config.max_message_bytes
                                                : std::min<uint64_t>(port_max, uint64_t{1} << 30);
    max_message_ = std::min<uint64_t>(max_message_, port_max);
    records_.resize(kMaxRecords);
    for (uint32_t i = kMaxRecords; i > 0; --i) free_slots_.push_back(i - 1);
    describe_ = StrCat(device_->Describe(), "; chosen: ", choice.reason);
    for (size_t i = 0; i < device_->cqs().size(); ++i) {
      pollers_.emplace_back([this, i] { PollLoop(i); });
    }
  }

  ~RdmaBackendImpl() override {
    stop_.store(true, std::memory_order_release);
    for (std::thread& t : pollers_) t.join();
    std::vector<std::shared_ptr<QpContext> > all;
    {
      std::unique_lock<std::shared_mutex> lock(peers_mu_);
      for (auto& [qpn, ctx] : by_qpn_) all.push_back(ctx);
      by_qpn_.clear();
      initiators_.clear();
      targets_.clear();
    }
    for (auto& ctx : all) FailQp(*ctx, "the RDMA backend was shut down");
    all.clear();  // QPs go before the registrations and the device
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    regions_.clear();
  }

  std::string Describe() const override { return describe_; }

  std::string RegisterRegion(uint64_t mem_id, uintptr_t addr, uint64_t size) override {
    MORI_CHECK_ARG(size > 0, "RDMA: cannot register memory id ", mem_id, " of 0 bytes");
    auto reg = std::make_shared<Registration>();
    reg->mr = std::make_unique<MemoryRegistration>(*device_, addr, size);
    RegionKey key{addr, size, reg->mr->rkey()};
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    MORI_CHECK_ARG(regions_.count(mem_id) == 0, "RDMA: memory id ", mem_id,
                   " is already registered");
    regions_[mem_id] = std::move(reg);
    return EncodeRegionKey(key);
  }

  void DeregisterRegion(uint64_t mem_id) override {
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    auto it = regions_.find(mem_id);
    if (it == regions_.end())
      MORI_THROW(NotFoundError, "RDMA: memory id ", mem_id, " not registered");
    CheckRegionIdle(mem_id, it->second->inflight.load(std::memory_order_acquire));
    regions_.erase(it);  // ibv_dereg_mr once no transfer holds the registration
  }

  uint64_t InFlight(uint64_t mem_id) const override {
    std::shared_lock<std::shared_mutex> lock(regions_mu_);
    auto it = regions_.find(mem_id);
    return it == regions_.end() ? 0 : it->second->inflight.load(std::memory_order_acquire);
  }

  std::string OpenInitiator(const std::string& peer_key) override {
    DisconnectRole(peer_key, /*initiator=*/true, "reconnecting");
    auto set = NewQpSet(peer_key, static_cast<size_t>(config_.qp_per_transfer));
    std::vector<EndpointInfo> local;
    for (auto& ctx : set->qps) local.push_back(ctx->qp->LocalEndpoint());
    Publish(peer_key, set, /*initiator=*/true);
    return EncodeEndpoints(local);
  }

  std::string AcceptInitiator(const std::string& peer_key, const std::string& request) override {
    std::vector<EndpointInfo> remote = DecodeEndpoints(request);
    DisconnectRole(peer_key, /*initiator=*/false, "the initiator reconnected");
    auto set = NewQpSet(peer_key, remote.size());
    std::vector<EndpointInfo> local;
    for (size_t i = 0; i < remote.size(); ++i) {
      RcQueuePair& qp = *set->qps[i]->qp;
      qp.Connect(config_.qp, remote[i]);
      if (int rc = qp.PostReceives(qp.max_recv_wr()); rc != 0) {
        MORI_THROW(TransportError, "RDMA: posting ", qp.max_recv_wr(), " receives on QP ", qp.qpn(),
                   " failed: ", std::strerror(rc));
      }
      local.push_back(qp.LocalEndpoint());
    }
    set->ready = true;
    Publish(peer_key, set, /*initiator=*/false);
    return EncodeEndpoints(local);
  }

  void CompleteInitiator(const std::string& peer_key, const std::string& reply) override {
    std::vector<EndpointInfo> remote = DecodeEndpoints(reply);
    std::shared_ptr<PeerQps> set;
    {
      std::shared_lock<std::shared_mutex> lock(peers_mu_);
      auto it = initiators_.find(peer_key);
      if (it != initiators_.end()) set = it->second;
    }
    if (!set)
      MORI_THROW(InvalidStateError, "RDMA: no connection to '", peer_key, "' is being opened");
    MORI_CHECK_ARG(remote.size() == set->qps.size(), "RDMA: '", peer_key, "' answered with ",
                   remote.size(), " endpoints for ", set->qps.size(), " QPs");
    for (size_t i = 0; i < remote.size(); ++i) set->qps[i]->qp->Connect(config_.qp, remote[i]);
    std::unique_lock<std::shared_mutex> lock(peers_mu_);
    set->ready = true;
  }

  bool PeerReady(const std::string& peer_key) const override {
    std::shared_lock<std::shared_mutex> lock(peers_mu_);
    auto it = initiators_.find(peer_key);
    return it != initiators_.end() && it->second->ready;
  }

  void DisconnectPeer(const std::string& peer_key, const std::string& reason) override {
    DisconnectRole(peer_key, true, reason);
    DisconnectRole(peer_key, false, reason);
  }

  void Submit(RdmaOp op, uint64_t local_mem, const std::string& peer_key, const RegionKey& remote,
              const PlanSpan* spans, size_t n, uint64_t uid, RdmaCompletion done) override {
    std::shared_ptr<Registration> reg;
    {
      std::shared_lock<std::shared_mutex> lock(regions_mu_);
      auto it = regions_.find(local_mem);
      if (it == regions_.end()) {
        MORI_THROW(NotFoundError, "RDMA: local memory id ", local_mem, " is not registered");
      }
      reg = it->second;
    }
    std::shared_ptr<PeerQps> peer;
    {
      std::shared_lock<std::shared_mutex> lock(peers_mu_);
      auto it = initiators_.find(peer_key);
      if (it != initiators_.end() && it->second->ready) peer = it->second;
    }
    if (!peer) MORI_THROW(InvalidStateError, "RDMA: not connected to '", peer_key, "'");

    PlanLimits limits;
    limits.local_size = reg->mr->length();
    limits.remote_size = remote.length;
    limits.max_message_bytes = max_message_;
    limits.max_sge = std::min(max_sge_, peer->qps.front()->qp->max_sge());
    limits.signal_interval = static_cast<uint32_t>(config_.signal_interval);
    limits.post_batch_size =
        std::min<uint32_t>(static_cast<uint32_t>(EffectivePostBatchSize(config_)),
                           peer->qps.front()->qp->max_send_wr());
    limits.num_qps = static_cast<uint32_t>(peer->qps.size());
    limits.notify = config_.enable_notification;
    TransferPlan plan =
        PlanTransfer(op == RdmaOp::kWrite ? PlanOp::kWrite : PlanOp::kRead, spans, n, limits, uid);
    if (plan.qps.empty()) {
      done(StatusDetail::SUCCESS, "");
      return;
    }
    uint32_t signaled = 0;
    for (const QpPlan& q : plan.qps) signaled += q.signaled;
    uint32_t slot = AllocRecord(uid, std::move(done), signaled, reg);
    PostTarget target{reg->mr->addr(), reg->mr->lkey(), remote.addr, remote.rkey};
    uint32_t start = peer->next.fetch_add(1, std::memory_order_relaxed);
    for (size_t j = 0; j < plan.qps.size(); ++j) {
      QpContext& ctx = *peer->qps[(start + j) % peer->qps.size()];
      uint32_t due = plan.qps[j].signaled;
      int rc = 0;
      bool dead;
      {
        std::lock_guard<std::mutex> lock(ctx.mu);
        dead = ctx.dead;
        if (!dead) {
          ctx.pending.push_back({slot, std::move(plan.qps[j]), 0, target});
          rc = TryPostLocked(ctx);
        }
      }
      if (dead) FinishParts(slot, due, StatusDetail::ERR_PEER_LOST, DeadMessage(ctx));
      if (rc != 0) FailQp(ctx, StrCat("ibv_post_send failed: ", std::strerror(rc)));
    }
  }

  void SetInboundHandler(RdmaInboundHandler handler) override {
    std::lock_guard<std::mutex> lock(handler_mu_);
    inbound_ = std::move(handler);
  }

 private:
  std::shared_ptr<PeerQps> NewQpSet(const std::string& peer_key, size_t count) {
    auto set = std::make_shared<PeerQps>();
    for (size_t i = 0; i < count; ++i) {
      int cq = static_cast<int>(next_cq_++ % device_->cqs().size());
      auto qp =
          std::make_unique<RcQueuePair>(*device_, cq, static_cast<uint32_t>(config_.max_send_wr),
                                        static_cast<uint32_t>(config_.max_recv_wr), max_sge_);
      set->qps.push_back(std::make_shared<QpContext>(std::move(qp), peer_key));
    }
    return set;
  }

  void Publish(const std::string& peer_key, const std::shared_ptr<PeerQps>& set, bool initiator) {
    std::unique_lock<std::shared_mutex> lock(peers_mu_);
    (initiator ? initiators_ : targets_)[peer_key] = set;
    for (auto& ctx : set->qps) by_qpn_[ctx->qp->qpn()] = ctx;
  }

  void DisconnectRole(const std::string& peer_key, bool initiator, const std::string& reason) {
    std::shared_ptr<PeerQps> set;
    {
      std::unique_lock<std::shared_mutex> lock(peers_mu_);
      auto& map = initiator ? initiators_ : targets_;
      auto it = map.find(peer_key);
      if (it == map.end()) return;
      set = it->second;
      map.erase(it);
      for (auto& ctx : set->qps) by_qpn_.erase(ctx->qp->qpn());
    }
    for (auto& ctx : set->qps) FailQp(*ctx, StrCat("disconnected from '", peer_key, "': ", reason));
  }

  static std::string DeadMessage(const QpContext& ctx) {
    return StrCat("RDMA QP ", ctx.qp->qpn(), " to '", ctx.peer_key, "' has failed");
  }

  uint32_t AllocRecord(uint64_t uid, RdmaCompletion done, uint32_t due,
                       const std::shared_ptr<Registration>& reg) {
    std::lock_guard<std::mutex> lock(records_mu_);
    if (free_slots_.empty()) {
      MORI_THROW(InvalidStateError, "RDMA: ", kMaxRecords,
                 " transfers already in flight; wait for some to finish");
    }
    uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    Record& r = records_[slot];
    r.live = true;
    r.uid = uid;
    r.remaining = due;
    r.code = StatusDetail::SUCCESS;
    r.message.clear();
    r.done = std::move(done);
    r.reg = reg;
    reg->inflight.fetch_add(1, std::memory_order_acq_rel);
    return slot;
  }

  // `count` signaled completions of `slot` are accounted (with a failure, or not).
  void FinishParts(uint32_t slot, uint32_t count, StatusDetail code, const std::string& message) {
    RdmaCompletion done;
    std::shared_ptr<Registration> reg;
    StatusDetail final_code;
    std::string final_message;
    {
      std::lock_guard<std::mutex> lock(records_mu_);
      Record& r = records_[slot];
      if (!r.live) return;
      if (code != StatusDetail::SUCCESS && r.code == StatusDetail::SUCCESS) {
        r.code = code;
        r.message = StrCat("transfer uid ", r.uid, ": ", message);
      }
      r.remaining -= std::min(count, r.remaining);
      if (r.remaining != 0) return;
      done = std::move(r.done);
      reg = std::move(r.reg);
      final_code = r.code;
      final_message = std::move(r.message);
      r.live = false;
      free_slots_.push_back(slot);
    }
    reg->inflight.fetch_sub(1, std::memory_order_acq_rel);
    if (done) done(final_code, final_message);
  }

  // Posts what fits of the pending slices; returns 0 or the errno of a failed post.
  int TryPostLocked(QpContext& ctx) {
    while (!ctx.pending.empty()) {
      PendingSlice& p = ctx.pending.front();
      size_t end = p.next;
      while (!p.plan.wrs[end].batch_end) ++end;
      ++end;
      size_t len = end - p.next;
      if (!ctx.sq.Fits(len)) return 0;  // a completion will make room and call again
      size_t posted = 0;
      int rc = ctx.qp->PostChain(&p.plan.wrs[p.next], len, p.plan.sges.data(), p.target, p.slot,
                                 &posted);
      if (rc != 0) return rc;
      ctx.sq.Posted(&p.plan.wrs[p.next], len, p.slot);
      p.next = end;
      if (p.next == p.plan.wrs.size()) ctx.pending.pop_front();
    }
    return 0;
  }

  // The QP broke (or is being torn down): every transfer with work on it fails.
  void FailQp(QpContext& ctx, const std::string& message,
              StatusDetail code = StatusDetail::ERR_PEER_LOST) {
    std::vector<std::pair<uint32_t, uint32_t> > due;
    {
      std::lock_guard<std::mutex> lock(ctx.mu);
      if (ctx.dead) return;
      ctx.dead = true;
      ctx.qp->MarkError();
      due = ctx.sq.Drain();
      for (const PendingSlice& p : ctx.pending) due.emplace_back(p.slot, p.UnpostedSignaled());
      ctx.pending.clear();
    }
    if (!due.empty())
      MORI_LOG_WARN(kIo, "rdma: ", message, "; failing ", due.size(), " transfer part(s)");
    for (auto& [slot, count] : due) FinishParts(slot, count, code, message);
  }

  std::shared_ptr<QpContext> FindQp(uint32_t qpn) {
    std::shared_lock<std::shared_mutex> lock(peers_mu_);
    auto it = by_qpn_.find(qpn);
    return it == by_qpn_.end() ? nullptr : it->second;
  }

  void HandleCompletion(const ibv_wc& wc) {
    std::shared_ptr<QpContext> ctx = FindQp(wc.qp_num);
    if (!ctx) return;  // a QP already torn down: its transfers were failed then
    WrId id{};
    try {
      id = DecodeWrId(wc.wr_id);
    } catch (const Error& e) {
      FailQp(*ctx, e.what(), StatusDetail::ERR_TRANSPORT);
      return;
    }
    if (id.kind == WrKind::kRecv) {
      if (wc.status != IBV_WC_SUCCESS) {
        if (wc.status != IBV_WC_WR_FLUSH_ERR) {
          FailQp(*ctx, StrCat("receive on QP ", wc.qp_num,
                              " failed: ", DescribeWcStatus(&api_, wc.status)));
        }
        return;
      }
      if ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
        try {
          ImmData imm = DecodeImm(ntohl(wc.imm_data));
          std::lock_guard<std::mutex> lock(handler_mu_);
          if (inbound_) inbound_(ctx->peer_key, imm.uid24, imm.parts, imm.read);
        } catch (const Error& e) {
          MORI_LOG_WARN(kIo, "rdma: notification from ", LogSafe(ctx->peer_key),
                        " ignored: ", e.what());
        }
      }
      std::lock_guard<std::mutex> lock(ctx->mu);
      if (!ctx->dead && ctx->qp->PostReceives(1) != 0) {
        MORI_LOG_WARN(kIo, "rdma: reposting a receive on QP ", wc.qp_num, " failed");
      }
      return;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      FailQp(*ctx,
             StrCat("RDMA work request on QP ", wc.qp_num, " to '", ctx->peer_key,
                    "' failed: ", DescribeWcStatus(&api_, wc.status), " (vendor error 0x", std::hex,
                    wc.vendor_err, ")"),
             StatusForWc(wc.status));
      return;
    }
    uint32_t slot = 0;
    int rc = 0;
    {
      std::lock_guard<std::mutex> lock(ctx->mu);
      if (ctx->dead) return;
      try {
        slot = ctx->sq.Completed(wc.wr_id);
      } catch (const Error& e) {
        rc = -1;
        MORI_LOG_ERROR(kIo, "rdma: ", e.what());
      }
      if (rc == 0) rc = TryPostLocked(*ctx);
    }
    if (rc == -1) {
      FailQp(*ctx, "send-queue accounting mismatch", StatusDetail::ERR_TRANSPORT);
      return;
    }
    FinishParts(slot, 1, StatusDetail::SUCCESS, "");
    if (rc != 0) FailQp(*ctx, StrCat("ibv_post_send failed: ", std::strerror(rc)));
  }

  void PollLoop(size_t index) {
    const CompletionQueue& q = device_->cqs()[index];
    bool event_mode = q.channel != nullptr;
    ibv_wc wc[32];
    uint32_t idle = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      if (event_mode && idle > 0) {
        pollfd pfd{q.channel->fd, POLLIN, 0};
        if (::poll(&pfd, 1, 100) <= 0) continue;  // re-checks stop_ every 100 ms
        ibv_cq* cq = nullptr;
        void* cq_ctx = nullptr;
        if (api_.get_cq_event(q.channel, &cq, &cq_ctx) == 0) {
          api_.ack_cq_events(cq, 1);
          ibv_req_notify_cq(cq, 0);
        }
        idle = 0;
      }
      int n = ibv_poll_cq(q.cq, 32, wc);
      if (n < 0) {
        MORI_LOG_ERROR(kIo, "rdma: ibv_poll_cq failed (", n, ") on CQ ", index);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (n == 0) {
        ++idle;
        if (!event_mode && idle > 1024) std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      idle = 0;
      for (int i = 0; i < n; ++i) HandleCompletion(wc[i]);
    }
  }

  const VerbsApi& api_;
  RdmaBackendConfig config_;
  std::unique_ptr<VerbsDevice> device_;  // first member destroyed last
  uint32_t max_sge_ = 1;
  uint64_t max_message_ = 1;
  std::string describe_;

  mutable std::shared_mutex regions_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Registration> > regions_;

  mutable std::shared_mutex peers_mu_;
  std::unordered_map<std::string, std::shared_ptr<PeerQps> > initiators_;
  std::unordered_map<std::string, std::shared_ptr<PeerQps> > targets_;
  std::unordered_map<uint32_t, std::shared_ptr<QpContext> > by_qpn_;
  std::atomic<uint32_t> next_cq_{0};

  std::mutex records_mu_;
  std::vector<Record> records_;
  std::vector<uint32_t> free_slots_;

  std::mutex handler_mu_;
  RdmaInboundHandler inbound_;

  std::atomic<bool> stop_{false};
  std::vector<std::thread> pollers_;
};

}  // namespace

std::unique_ptr<RdmaBackend> RdmaBackend::Create(const RdmaBackendConfig& config) {
  if (std::unique_ptr<RdmaBackend> test_double = FromTestFactory(config)) return test_double;
  ValidateRdmaBackendConfig(config);
  std::string reason;
  const VerbsApi* api = Verbs(&reason);
  if (api == nullptr) MORI_THROW(NotSupportedError, "RDMA backend unavailable: ", reason);
  topology::DiscoverOptions options;
  options.discover_gpus = config.gpu_index >= 0;
  topology::Topology topo = topology::Discover(options);
  if (topo.rdma_devices.empty()) {
    MORI_THROW(NotSupportedError,
               "RDMA backend unavailable: no RDMA device under /sys/class/infiniband");
  }
  const topology::Gpu* gpu = nullptr;
  if (config.gpu_index >= 0) {
    for (const topology::Gpu& g : topo.gpus) {
      if (g.index == config.gpu_index) gpu = &g;
    }
    MORI_CHECK_ARG(gpu != nullptr, "RdmaBackendConfig.gpu_index ", config.gpu_index,
                   " but the topology lists ", topo.gpus.size(), " GPU(s)",
                   topo.gpu_unavailable_reason.empty() ? "" : ": ", topo.gpu_unavailable_reason);
  }
  RdmaPortChoice choice = ChooseRdmaPort(topo.rdma_devices, gpu, config.device_name, config.port);
  MORI_LOG_INFO(kIo, "rdma: ", choice.reason);
  return std::make_unique<RdmaBackendImpl>(*api, config, choice);
}

#endif  // MORI_IO_WITH_RDMA

}  // namespace mori::io::rdma
