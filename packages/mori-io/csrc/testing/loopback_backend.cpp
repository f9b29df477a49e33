// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The loopback test double of RdmaBackend: see loopback_backend.hpp for what it
// mirrors and where it differs. No verbs header, no NIC.
#include "testing/loopback_backend.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mori/core/env.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "wire/log_safe.hpp"

#if MORI_IO_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace mori::io::rdma {

bool LoopbackBackendRequested() { return env::Bool(kLoopbackEnvVar, false); }

namespace {

// The real backend's record table: a Submit past this many unfinished transfers throws.
constexpr uint64_t kMaxOutstanding = uint64_t{1} << 16;
// The GID every loopback endpoint carries, so a real backend's blob is recognised.
constexpr std::array<uint8_t, 16> kLoopbackGid = {'m', 'o', 'r', 'i', '-', 'i', 'o', ' ',
                                                  'l', 'o', 'o', 'p', 'b', 'a', 'c', 'k'};

class LoopbackCore;

// Backends of this process by id (the QPN of their endpoints). Leaked on purpose: a
// backend destroyed during static destruction still finds it.
struct Registry {
  std::mutex mu;
  std::unordered_map<uint32_t, std::weak_ptr<LoopbackCore> > cores;
  uint32_t next = 1;
};

Registry& GlobalRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

// 24-bit, non-zero: a connection's generation travels as the endpoints' PSN.
uint32_t NextGeneration() {
  static std::atomic<uint32_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) % kPsnMask + 1;
}

// Process-unique (until 2^32 registrations), so a key of a deregistered region, or of
// another backend, names no live registration.
uint32_t NextRkey() {
  static std::atomic<uint32_t> counter{0x1000};
  uint32_t v = counter.fetch_add(1, std::memory_order_relaxed);
  return v == 0 ? counter.fetch_add(1, std::memory_order_relaxed) : v;
}

struct Region {
  uint64_t mem_id = 0;
  uintptr_t addr = 0;
  uint64_t size = 0;
  uint32_t rkey = 0;
  // CUDA device memory: copied with cudaMemcpy (a NIC reaches it by GPUDirect;
  // memmove cannot, and faulted on it).
  bool device = false;
  // Transfers submitted from it plus copies into or out of it as a target. Changed
  // from 0 only under the owning core's mutex, so DeregisterRegion's check is exact.
  std::atomic<uint64_t> inflight{0};
};

// The initiator's side of a connection (the QPs it sends on). Fields below `ready`
// are guarded by the owning core's mutex.
struct InitiatorConn {
  InitiatorConn(std::string key, uint32_t gen, size_t qps)
      : peer_key(std::move(key)), generation(gen), num_qps(qps), qp_failure(qps) {}
  const std::string peer_key;
  const uint32_t generation;
  const size_t num_qps;
  std::atomic<uint32_t> next{0};  // round robin of the first slice's QP
  bool ready = false;
  bool disconnected = false;
  std::string disconnect_reason;
  std::vector<std::string> qp_failure;  // non-empty: that QP is dead, and why
  std::weak_ptr<LoopbackCore> target;
  uint32_t target_id = 0;
  uint32_t target_generation = 0;
};

// The target's side: the peer key it accepted the initiator under.
struct TargetConn {
  std::string peer_key;
  uint32_t generation = 0;
};

struct Transfer {
  uint64_t uid = 0;
  std::shared_ptr<Region> local;
  std::shared_ptr<InitiatorConn> conn;
  RegionKey remote;
  TransferPlan plan;
  uint32_t start = 0;
  RdmaCompletion done;
  std::atomic<bool> claimed{false};  // whoever sets it runs `done`
};

// A queued unit of the worker: a transfer to execute, or a notification to deliver.
struct Task {
  std::shared_ptr<Transfer> transfer;
  uint32_t generation = 0;  // of the TargetConn a notification arrived on
  ImmData imm{};
};

std::vector<EndpointInfo> LoopbackEndpoints(uint32_t id, uint32_t generation, size_t count) {
  EndpointInfo e;
  e.qpn = id;
  e.psn = generation;
  e.lid = 0;
  e.port_num = 1;
  e.active_mtu = static_cast<uint8_t>(kMtuMax);
  e.link_layer = LinkLayer::kEthernet;
  e.gid = kLoopbackGid;
  return std::vector<EndpointInfo>(count, e);
}

// The (backend id, generation) a loopback blob names; InvalidArgumentError for a blob of
// anything else.
std::pair<uint32_t, uint32_t> CheckLoopbackEndpoints(const std::vector<EndpointInfo>& eps,
                                                     const char* what) {
  for (size_t i = 0; i < eps.size(); ++i) {
    const EndpointInfo& e = eps[i];
    MORI_CHECK_ARG(e.gid == kLoopbackGid && e.qpn == eps[0].qpn && e.psn == eps[0].psn,
                   "RDMA loopback: the ", what, "'s endpoint ", i, " (QPN ", e.qpn,
                   ") is not a loopback backend's; both engines must run in this process with ",
                   kLoopbackEnvVar, "=1");
  }
  return {eps[0].qpn, eps[0].psn};
}

class LoopbackCore : public std::enable_shared_from_this<LoopbackCore> {
 public:
  static std::shared_ptr<LoopbackCore> Create(const RdmaBackendConfig& config) {
    auto core = std::shared_ptr<LoopbackCore>(new LoopbackCore(config));
    Registry& reg = GlobalRegistry();
    std::lock_guard<std::mutex> lock(reg.mu);
    MORI_CHECK(reg.cores.size() < kPsnMask, "RDMA loopback: ", reg.cores.size(),
               " backends alive, no 24-bit id left");
    while (reg.next == 0 || reg.cores.count(reg.next) != 0) reg.next = (reg.next + 1) & kPsnMask;
    core->id_ = reg.next;
    reg.next = (reg.next + 1) & kPsnMask;
    reg.cores[core->id_] = core;
    return core;
  }

  std::string Describe() const {
    return StrCat("loopback RDMA test double (", kLoopbackEnvVar,
                  "=1; memmove between backends of one process, no NIC): id ", id_, ", ",
                  config_.qp_per_transfer, " QP(s) per peer, notifications ",
                  config_.enable_notification ? "on" : "off");
  }

  std::string RegisterRegion(uint64_t mem_id, uintptr_t addr, uint64_t size) {
    MORI_CHECK_ARG(size > 0, "RDMA: cannot register memory id ", mem_id, " of 0 bytes");
    MORI_CHECK_ARG(addr + size > addr, "RDMA: memory id ", mem_id, " [0x", std::hex, addr, ", +0x",
                   size, ") wraps around the address space");
    auto region = std::make_shared<Region>();
    region->mem_id = mem_id;
    region->addr = addr;
    region->size = size;
    region->rkey = NextRkey();
    region->device = IsDeviceMemory(addr);
    RegionKey key{addr, size, region->rkey};
    std::lock_guard<std::mutex> lock(mu_);
    MORI_CHECK_ARG(regions_.count(mem_id) == 0, "RDMA: memory id ", mem_id,
                   " is already registered");
    rkeys_[region->rkey] = region;
    regions_[mem_id] = std::move(region);
    return EncodeRegionKey(key);
  }

  void DeregisterRegion(uint64_t mem_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(mem_id);
    if (it == regions_.end())
      MORI_THROW(NotFoundError, "RDMA: memory id ", mem_id, " not registered");
    CheckRegionIdle(mem_id, it->second->inflight.load(std::memory_order_acquire));
    rkeys_.erase(it->second->rkey);
    regions_.erase(it);
  }

  uint64_t InFlight(uint64_t mem_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(mem_id);
    return it == regions_.end() ? 0 : it->second->inflight.load(std::memory_order_acquire);
  }

  std::string OpenInitiator(const std::string& peer_key) {
    DisconnectInitiator(peer_key, "reconnecting");
    auto conn = std::make_shared<InitiatorConn>(peer_key, NextGeneration(),
                                                static_cast<size_t>(config_.qp_per_transfer));
    std::lock_guard<std::mutex> lock(mu_);
    initiators_[peer_key] = conn;
    return EncodeEndpoints(LoopbackEndpoints(id_, conn->generation, conn->num_qps));
  }

  std::string AcceptInitiator(const std::string& peer_key, const std::string& request) {
    std::vector<EndpointInfo> remote = DecodeEndpoints(request);
    CheckLoopbackEndpoints(remote, "request");
    auto conn = std::make_shared<TargetConn>();
    conn->peer_key = peer_key;
    conn->generation = NextGeneration();
    std::lock_guard<std::mutex> lock(mu_);
    DropTargetLocked(peer_key);  // the initiator reconnected: its old QPs are gone
    targets_[peer_key] = conn;
    target_gens_[conn->generation] = conn;
    return EncodeEndpoints(LoopbackEndpoints(id_, conn->generation, remote.size()));
  }

  void CompleteInitiator(const std::string& peer_key, const std::string& reply) {
    std::vector<EndpointInfo> remote = DecodeEndpoints(reply);
    auto [target_id, target_generation] = CheckLoopbackEndpoints(remote, "reply");
    // A target id that names no live backend connects (as QPs connect to a vanished
    // peer); its transfers fail with ERR_PEER_LOST.
    std::weak_ptr<LoopbackCore> target;
    {
      Registry& reg = GlobalRegistry();
      std::lock_guard<std::mutex> lock(reg.mu);
      auto it = reg.cores.find(target_id);
      if (it != reg.cores.end()) target = it->second;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = initiators_.find(peer_key);
    if (it == initiators_.end() || it->second->ready)
      MORI_THROW(InvalidStateError, "RDMA: no connection to '", peer_key, "' is being opened");
    InitiatorConn& conn = *it->second;
    MORI_CHECK_ARG(remote.size() == conn.num_qps, "RDMA: '", peer_key, "' answered with ",
                   remote.size(), " endpoints for ", conn.num_qps, " QPs");
    conn.target = std::move(target);
    conn.target_id = target_id;
    conn.target_generation = target_generation;
    conn.ready = true;
  }

  bool PeerReady(const std::string& peer_key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = initiators_.find(peer_key);
    return it != initiators_.end() && it->second->ready;
  }

  void DisconnectPeer(const std::string& peer_key, const std::string& reason) {
    DisconnectInitiator(peer_key, reason);
    std::lock_guard<std::mutex> lock(mu_);
    DropTargetLocked(peer_key);
  }

  void Submit(RdmaOp op, uint64_t local_mem, const std::string& peer_key, const RegionKey& remote,
              const PlanSpan* spans, size_t n, uint64_t uid, RdmaCompletion done) {
    std::shared_ptr<Region> local;
    std::shared_ptr<InitiatorConn> conn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = regions_.find(local_mem);
      if (it == regions_.end()) {
        MORI_THROW(NotFoundError, "RDMA: local memory id ", local_mem, " is not registered");
      }
      local = it->second;
      auto c = initiators_.find(peer_key);
      if (c != initiators_.end() && c->second->ready) conn = c->second;
    }
    if (!conn) MORI_THROW(InvalidStateError, "RDMA: not connected to '", peer_key, "'");

    // The limits the real backend plans with, less what only a device knows (its
    // max_sge and the port's max_msg_sz): the same config gives the same parts.
    PlanLimits limits;
    limits.local_size = local->size;
    limits.remote_size = remote.length;
    limits.max_message_bytes =
        config_.max_message_bytes > 0 ? config_.max_message_bytes : uint64_t{1} << 30;
    limits.max_sge = static_cast<uint32_t>(config_.max_sge > 0 ? config_.max_sge : 16);
    limits.signal_interval = static_cast<uint32_t>(config_.signal_interval);
    limits.post_batch_size =
        static_cast<uint32_t>(std::min(EffectivePostBatchSize(config_), config_.max_send_wr));
    limits.num_qps = static_cast<uint32_t>(conn->num_qps);
    limits.notify = config_.enable_notification;
    auto t = std::make_shared<Transfer>();
    t->plan =
        PlanTransfer(op == RdmaOp::kWrite ? PlanOp::kWrite : PlanOp::kRead, spans, n, limits, uid);
    if (t->plan.qps.empty()) {
      done(StatusDetail::SUCCESS, "");
      return;
    }
    t->uid = uid;
    t->local = local;
    t->conn = conn;
    t->remote = remote;
    t->done = std::move(done);
    t->start = conn->next.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = regions_.find(local_mem);
      if (it == regions_.end() || it->second != local) {
        MORI_THROW(NotFoundError, "RDMA: local memory id ", local_mem,
                   " was deregistered while the transfer was submitted");
      }
      if (outstanding_ >= kMaxOutstanding) {
        MORI_THROW(InvalidStateError, "RDMA: ", kMaxOutstanding,
                   " transfers already in flight; wait for some to finish");
      }
      ++outstanding_;
      local->inflight.fetch_add(1, std::memory_order_acq_rel);
      queue_.push_back(Task{std::move(t), 0, {}});
    }
    work_cv_.notify_one();
  }

  void SetInboundHandler(RdmaInboundHandler handler) {
    RdmaInboundHandler old;
    std::lock_guard<std::mutex> lock(handler_mu_);
    old = std::move(inbound_);
    inbound_ = std::move(handler);
  }

  // --- the target side, called by other backends' workers (and this one's) ---

  // Admits one slice of a transfer on connection `generation`: checks the key against
  // the live registrations (unless the slice moves no byte: a zero-length RDMA
  // operation checks no key) and leases the region for the copy. False, with the code
  // and the reason, where a NIC would have failed the work request.
  bool AcquireInbound(uint32_t generation, const RegionKey& key, bool moves_bytes,
                      std::shared_ptr<Region>* region, StatusDetail* code, std::string* why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      *code = StatusDetail::ERR_PEER_LOST;
      *why = StrCat("the target backend (loopback id ", id_,
                    ") was destroyed (a real QP: IBV_WC_RETRY_EXC_ERR)");
      return false;
    }
    if (target_gens_.count(generation) == 0) {
      *code = StatusDetail::ERR_PEER_LOST;
      *why = StrCat("the target (loopback id ", id_,
                    ") no longer has this connection: it disconnected the peer or the initiator "
                    "re-opened it (a real QP: IBV_WC_RETRY_EXC_ERR)");
      return false;
    }
    ++active_inbound_;
    if (!moves_bytes) return true;
    auto it = rkeys_.find(key.rkey);
    if (it == rkeys_.end()) {
      *code = StatusDetail::ERR_OUT_OF_BOUNDS;
      *why = StrCat("remote access error (IBV_WC_REM_ACCESS_ERR): rkey 0x", std::hex, key.rkey,
                    std::dec, " is not a live registration of the target (loopback id ", id_,
                    "): deregistered, or another backend's key");
      --active_inbound_;
      return false;
    }
    Region& r = *it->second;
    if (r.addr != key.addr || r.size != key.length) {
      *code = StatusDetail::ERR_OUT_OF_BOUNDS;
      *why = StrCat("remote access error (IBV_WC_REM_ACCESS_ERR): rkey 0x", std::hex, key.rkey,
                    " registers [0x", r.addr, ", +0x", r.size, ") but the key names [0x", key.addr,
                    ", +0x", key.length, ")", std::dec, " (memory id ", r.mem_id, ")");
      --active_inbound_;
      return false;
    }
    r.inflight.fetch_add(1, std::memory_order_acq_rel);
    *region = it->second;
    return true;
  }

  // Ends an admission (region: its lease, or null); queues the slice's notifications.
  void ReleaseInbound(const std::shared_ptr<Region>& region, uint32_t generation,
                      const std::vector<ImmData>& notes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (region) region->inflight.fetch_sub(1, std::memory_order_acq_rel);
      --active_inbound_;
      if (!stop_) {
        for (const ImmData& imm : notes) queue_.push_back(Task{nullptr, generation, imm});
      }
    }
    state_cv_.notify_all();
    if (!notes.empty()) work_cv_.notify_one();
  }

  // --- the worker and the shutdown ---

  void RunWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      worker_id_ = std::this_thread::get_id();
    }
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;  // what is left is failed by FailLeftovers
        task = std::move(queue_.front());
        queue_.pop_front();
        current_ = task.transfer;
      }
      if (task.transfer) {
        Execute(task.transfer);
      } else {
        Deliver(task);
      }
    }
  }

  // Step 1 of the destructor: no new work, no new copies into our regions, and wait for
  // those in progress (each is one slice's memmove).
  void Close() {
    {
      Registry& reg = GlobalRegistry();
      std::lock_guard<std::mutex> lock(reg.mu);
      reg.cores.erase(id_);
    }
    std::unique_lock<std::mutex> lock(mu_);
    closed_ = true;
    stop_ = true;
    work_cv_.notify_all();
    state_cv_.wait(lock, [&] { return active_inbound_ == 0; });
  }

  // Step 2, once the worker stopped: fail what was queued, drop every connection.
  void FailLeftovers() {
    std::deque<Task> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left.swap(queue_);
      for (auto& [key, conn] : initiators_) {
        conn->disconnected = true;
        conn->disconnect_reason = "the RDMA backend was shut down";
      }
      initiators_.clear();
      targets_.clear();
      target_gens_.clear();
      rkeys_.clear();
      regions_.clear();
    }
    for (Task& task : left) {
      if (task.transfer && Claim(*task.transfer)) {
        Complete(*task.transfer, StatusDetail::ERR_PEER_LOST, "the RDMA backend was shut down");
      }
    }
    SetInboundHandler(nullptr);
  }

 private:
  explicit LoopbackCore(const RdmaBackendConfig& config) : config_(config) {}

  void DisconnectInitiator(const std::string& peer_key, const std::string& reason) {
    std::vector<std::shared_ptr<Transfer> > failed;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto it = initiators_.find(peer_key);
      if (it == initiators_.end()) return;
      std::shared_ptr<InitiatorConn> conn = it->second;
      initiators_.erase(it);
      conn->disconnected = true;
      conn->disconnect_reason = reason;
      for (auto q = queue_.begin(); q != queue_.end();) {
        if (q->transfer && q->transfer->conn == conn) {
          failed.push_back(std::move(q->transfer));
          q = queue_.erase(q);
        } else {
          ++q;
        }
      }
      // No byte of this peer moves after we return: wait out the slice being copied
      // (the worker sees `disconnected` before its next slice). Never on the worker
      // itself, which is then in a callback, between transfers.
      if (std::this_thread::get_id() != worker_id_) {
        state_cv_.wait(lock, [&] { return !current_ || current_->conn != conn; });
      }
    }
    for (auto& t : failed) {
      if (Claim(*t)) {
        Complete(*t, StatusDetail::ERR_PEER_LOST,
                 StrCat("disconnected from '", peer_key, "': ", reason));
      }
    }
  }

  void DropTargetLocked(const std::string& peer_key) {
    auto it = targets_.find(peer_key);
    if (it == targets_.end()) return;
    target_gens_.erase(it->second->generation);
    targets_.erase(it);
  }

  static bool Claim(Transfer& t) { return !t.claimed.exchange(true, std::memory_order_acq_rel); }

  // Runs once per transfer, by whoever claimed it.
  void Complete(Transfer& t, StatusDetail code, const std::string& message) {
    RdmaCompletion done = std::move(t.done);
    t.local->inflight.fetch_sub(1, std::memory_order_acq_rel);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --outstanding_;
    }
    std::string full =
        code == StatusDetail::SUCCESS ? "" : StrCat("transfer uid ", t.uid, ": ", message);
    try {
      if (done) done(code, full);
    } catch (const std::exception& e) {
      MORI_LOG_ERROR(kIo, "rdma loopback: completion callback of transfer uid ", t.uid,
                     " threw: ", e.what());
    }
  }

  // Whether addr is CUDA device memory (host and managed memory take memmove).
  static bool IsDeviceMemory(uintptr_t addr) {
#if MORI_IO_WITH_CUDA
    int count = 0;
    cudaPointerAttributes a{};
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 ||
        cudaPointerGetAttributes(&a, reinterpret_cast<void*>(addr)) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
#else
    (void)addr;
    return false;
#endif
  }

  // Copies one slice; "" or why a CUDA copy failed. `device`: either side is CUDA
  // device memory (cudaMemcpy with cudaMemcpyDefault, synchronous).
  static std::string CopySlice(const QpPlan& slice, uintptr_t local_base, uintptr_t remote_base,
                               bool device) {
    for (const PlannedWr& wr : slice.wrs) {
      uintptr_t remote = remote_base + wr.remote_offset;
      for (uint32_t k = 0; k < wr.sge_count; ++k) {
        const PlannedSge& sge = slice.sges[wr.sge_begin + k];
        auto* l = reinterpret_cast<char*>(local_base + sge.local_offset);
        auto* r = reinterpret_cast<char*>(remote);
        char* dst = wr.opcode == WrOpcode::kRead ? l : r;
        const char* src = wr.opcode == WrOpcode::kRead ? r : l;
        remote += sge.length;
        if (!device) {
          // memmove: an engine may read or write a region of its own (self-connection).
          std::memmove(dst, src, sge.length);
          continue;
        }
#if MORI_IO_WITH_CUDA
        const cudaError_t e = cudaMemcpy(dst, src, sge.length, cudaMemcpyDefault);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          return StrCat("cudaMemcpy of ", sge.length, " bytes failed: ", cudaGetErrorString(e));
        }
#endif
      }
    }
    return {};
  }

  void Execute(const std::shared_ptr<Transfer>& t) {
    StatusDetail code = StatusDetail::SUCCESS;
    std::string message;
    auto fail = [&](StatusDetail c, std::string m) {
      if (code == StatusDetail::SUCCESS) {
        code = c;
        message = std::move(m);
      }
    };
    InitiatorConn& conn = *t->conn;
    for (size_t j = 0; j < t->plan.qps.size(); ++j) {
      size_t q = (t->start + j) % conn.num_qps;
      std::shared_ptr<LoopbackCore> target;
      uint32_t target_generation = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (conn.disconnected) {
          fail(StatusDetail::ERR_PEER_LOST,
               StrCat("disconnected from '", conn.peer_key, "': ", conn.disconnect_reason));
          continue;
        }
        if (!conn.qp_failure[q].empty()) {
          fail(StatusDetail::ERR_PEER_LOST,
               StrCat("RDMA QP ", q, " to '", conn.peer_key, "' has failed: ", conn.qp_failure[q]));
          continue;
        }
        target = conn.target.lock();
        target_generation = conn.target_generation;
      }
      StatusDetail wc = StatusDetail::ERR_PEER_LOST;
      std::string why = StrCat("the target backend (loopback id ", conn.target_id,
                               ") was destroyed (a real QP: IBV_WC_RETRY_EXC_ERR)");
      const QpPlan& slice = t->plan.qps[j];
      std::shared_ptr<Region> region;
      bool admitted = target && target->AcquireInbound(target_generation, t->remote,
                                                       slice.bytes > 0, &region, &wc, &why);
      if (!admitted) {
        std::string m = StrCat("loopback QP ", q, " to '", conn.peer_key, "' failed: ", why);
        {
          // An RC QP goes to the error state on a failed work request.
          std::lock_guard<std::mutex> lock(mu_);
          if (conn.qp_failure[q].empty()) conn.qp_failure[q] = why;
        }
        MORI_LOG_WARN(kIo, "rdma loopback: transfer uid ", t->uid, ": ", m);
        fail(wc, std::move(m));
        continue;
      }
      if (region) {
        std::string err =
            CopySlice(slice, t->local->addr, region->addr, t->local->device || region->device);
        if (!err.empty()) fail(StatusDetail::ERR_GPU_OP, StrCat("loopback QP ", q, ": ", err));
      }
      std::vector<ImmData> notes;
      for (const PlannedWr& wr : slice.wrs) {
        if (wr.opcode == WrOpcode::kWriteWithImm) notes.push_back(DecodeImm(wr.imm));
      }
      target->ReleaseInbound(region, target_generation, notes);
    }
    bool mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine = Claim(*t);
      current_.reset();
    }
    state_cv_.notify_all();
    if (mine) Complete(*t, code, message);
  }

  void Deliver(const Task& task) {
    std::string peer_key;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = target_gens_.find(task.generation);
      if (it == target_gens_.end()) return;  // the connection went: so did its receives
      peer_key = it->second->peer_key;
    }
    std::lock_guard<std::mutex> lock(handler_mu_);
    if (!inbound_) return;
    try {
      inbound_(peer_key, task.imm.uid24, task.imm.parts, task.imm.read);
    } catch (const std::exception& e) {
      MORI_LOG_ERROR(kIo, "rdma loopback: inbound handler threw for ", LogSafe(peer_key), " uid24 ",
                     task.imm.uid24, ": ", e.what());
    }
  }

  const RdmaBackendConfig config_;
  uint32_t id_ = 0;  // set once by Create

  // Guards everything below except the regions' atomic counters; never held while
  // another core's mutex is taken, nor while a callback runs.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // queue_ or stop_ changed
  std::condition_variable state_cv_;  // current_ or active_inbound_ changed
  std::unordered_map<uint64_t, std::shared_ptr<Region> > regions_;
  std::unordered_map<uint32_t, std::shared_ptr<Region> > rkeys_;
  std::unordered_map<std::string, std::shared_ptr<InitiatorConn> > initiators_;
  std::unordered_map<std::string, std::shared_ptr<TargetConn> > targets_;
  std::unordered_map<uint32_t, std::shared_ptr<TargetConn> > target_gens_;
  std::deque<Task> queue_;
  std::shared_ptr<Transfer> current_;  // the transfer the worker is copying
  uint64_t outstanding_ = 0;           // submitted, not yet completed
  uint64_t active_inbound_ = 0;        // slices being copied into/out of our regions
  bool stop_ = false;
  bool closed_ = false;
  std::thread::id worker_id_;

  std::mutex handler_mu_;
  RdmaInboundHandler inbound_;
};

class LoopbackBackend final : public RdmaBackend {
 public:
  explicit LoopbackBackend(const RdmaBackendConfig& config) : core_(LoopbackCore::Create(config)) {
    // The thread holds the core: if the backend is destroyed from one of its own
    // callbacks, the worker is detached and ends after that callback.
    worker_ = std::thread([core = core_] { core->RunWorker(); });
  }

  ~LoopbackBackend() override {
    core_->Close();
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();
    } else {
      worker_.join();
    }
    core_->FailLeftovers();
  }

  LoopbackBackend(const LoopbackBackend&) = delete;
  LoopbackBackend& operator=(const LoopbackBackend&) = delete;

  std::string Describe() const override { return core_->Describe(); }
  std::string RegisterRegion(uint64_t mem_id, uintptr_t addr, uint64_t size) override {
    return core_->RegisterRegion(mem_id, addr, size);
  }
  void DeregisterRegion(uint64_t mem_id) override { core_->DeregisterRegion(mem_id); }
  uint64_t InFlight(uint64_t mem_id) const override { return core_->InFlight(mem_id); }
  std::string OpenInitiator(const std::string& peer_key) override {
    return core_->OpenInitiator(peer_key);
  }
  std::string AcceptInitiator(const std::string& peer_key, const std::string& request) override {
    return core_->AcceptInitiator(peer_key, request);
  }
  void CompleteInitiator(const std::string& peer_key, const std::string& reply) override {
    core_->CompleteInitiator(peer_key, reply);
  }
  bool PeerReady(const std::string& peer_key) const override { return core_->PeerReady(peer_key); }
  void DisconnectPeer(const std::string& peer_key, const std::string& reason) override {
    core_->DisconnectPeer(peer_key, reason);
  }
  void Submit(RdmaOp op, uint64_t local_mem, const std::string& peer_key, const RegionKey& remote,
              const PlanSpan* spans, size_t n, uint64_t uid, RdmaCompletion done) override {
    core_->Submit(op, local_mem, peer_key, remote, spans, n, uid, std::move(done));
  }
  void SetInboundHandler(RdmaInboundHandler handler) override {
    core_->SetInboundHandler(std::move(handler));
  }

 private:
  std::shared_ptr<LoopbackCore> core_;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<RdmaBackend> CreateLoopbackBackend(const RdmaBackendConfig& config) {
  ValidateRdmaBackendConfig(config);
  MORI_LOG_WARN(kIo, "rdma: using the LOOPBACK test double (", kLoopbackEnvVar,
                "=1): memmove inside this process, no NIC");
  return std::make_unique<LoopbackBackend>(config);
}

void InstallLoopbackBackend() {
  SetRdmaBackendFactoryForTesting([](const RdmaBackendConfig& config) {
    return LoopbackBackendRequested() ? CreateLoopbackBackend(config)
                                      : std::unique_ptr<RdmaBackend>();
  });
}

}  // namespace mori::io::rdma
