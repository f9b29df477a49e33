// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "shm/shm_transport.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "control/part_requests.hpp"
#include "control/reactor.hpp"
#include "control/socket_io.hpp"
#include "host/transport_host.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/macros.hpp"
#include "mori/core/telemetry.hpp"
#include "samehost/same_host.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

ShmTransport::ShmTransport(TransportHost* host, SameHost* same_host)
    : host_(host), same_host_(same_host) {
  cookie_ = (uint64_t{std::random_device{}()} << 32 | std::random_device{}()) | 1;
  conn_slot_ = host->channel().handlers().AllocateConnExtension();
  RegisterInitiatorHandlers();
  RegisterTargetHandlers();
}

ShmTransport::~ShmTransport() = default;

ShmTransport::PeerShm& ShmTransport::StateOf(Peer& peer) { return peer.StateOf<PeerShm>(kShmSlot); }

std::unique_ptr<PeerState> ShmTransport::NewPeerState() { return std::make_unique<PeerShm>(); }

void ShmTransport::SetSelfProbe(bool available, const std::string& reason) {
  self_ok_ = available;
  self_reason_ = reason;
  host_->SetCmaProbe(self_ok_, self_reason_);
  if (!available) {
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': SHM backend created, but ", reason,
                  "; same-host transfers fall back to TCP");
  }
}

void ShmTransport::OnControlThread(bool starting) { same_host_->OnControlThread(starting); }

void ShmTransport::ChannelStopped() { same_host_->ChannelStopped(); }

void ShmTransport::DrainInbound(const std::string* key) { same_host_->DrainInbound(key); }

bool ShmTransport::KeepsInitiator(const std::string& key) {
  return same_host_->KeepsInitiator(key);
}

bool ShmTransport::CanHandle(const Peer& peer, MemoryLocationType, MemoryLocationType) const {
  const PeerShm& s = peer.StateOf<PeerShm>(kShmSlot);
  return s.probed && !s.refused.load(std::memory_order_relaxed);
}

void ShmTransport::PeerConnecting(Peer& peer, PeerConnections& pc) {
  PeerShm& s = StateOf(peer);
  BackendChoiceInput in =
      host_->ChoiceInput(peer, MemoryLocationType::CPU, MemoryLocationType::CPU);
  s.host_choice = ChooseBackend(in);
  if (s.host_choice.backend != BackendType::kShm) return;
  // The first use of CMA for this pair, before any transfer relies on it.
  std::string why = ProbePeer(*pc.conns[0], peer);
  if (why.empty()) {
    s.probed = true;
    return;
  }
  in.cma_ok = false;
  in.cma_reason = why;
  s.host_choice = ChooseBackend(in);
  MORI_LOG_WARN(kIo, "engine '", host_->key(), "' -> ", LogSafe(peer.key), ": ",
                s.host_choice.reason);
}

std::string ShmTransport::ProbePeer(Conn& conn, const Peer& peer) {
  constexpr size_t kHdr = sizeof(wire::Header);
  const int fd = conn.fd;
  const int timeout = host_->tcp_config().peer_timeout_ms;
  wire::Header req = wire::MakeHeader(wire::MsgType::kShmProbe);
  std::string error;
  if (!SendAll(fd, reinterpret_cast<const char*>(&req), kHdr, timeout, &error)) {
    return "the probe request could not be sent: " + error;
  }
  wire::Header ack{};
  if (!RecvAll(fd, reinterpret_cast<char*>(&ack), kHdr, timeout, &error)) {
    return "the probe got no answer: " + error;
  }
  if (ack.type == static_cast<uint8_t>(wire::MsgType::kIdleClose) &&
      ack.version == wire::kVersion) {
    // The target refused our hello and closes: as the reactor would on reading this, the
    // peer is replaced when the close comes, and the next transfer connects again.
    conn.idle_closed = true;
    return "the target refused this engine's hello";
  }
  if (ack.type != static_cast<uint8_t>(wire::MsgType::kShmProbeAck) ||
      ack.version != wire::kVersion) {
    return StrCat("unexpected probe answer (type ", int(ack.type), ", version ", ack.version, ")");
  }
  if (ack.status != static_cast<uint8_t>(wire::WireStatus::kOk)) {
    return wire::WireStatusText(static_cast<wire::WireStatus>(ack.status));
  }
  if (ack.mem_id != static_cast<uint64_t>(peer.pid)) {
    return StrCat("the peer reports pid ", ack.mem_id, " but its EngineDesc says ", peer.pid);
  }
  uint64_t cookie = 0;
  int err = CmaCopy(peer.pid, false, reinterpret_cast<char*>(&cookie), ack.offset, sizeof(cookie));
  if (err != 0) {
    return StrCat("process_vm_readv of pid ", peer.pid, " failed: ", ErrnoText(err),
                  err == EPERM ? " (ptrace rules: kernel.yama.ptrace_scope, or another user)" : "");
  }
  if (cookie != ack.uid) return StrCat("pid ", peer.pid, " is not the remote engine's process");
  return {};
}

BackendChoice ShmTransport::Explain(const std::shared_ptr<Peer>& peer, const RemoteRegion& remote,
                                    BackendChoice choice) {
  PeerShm& s = StateOf(*peer);
  if (!s.probed) return s.host_choice;
  if (s.refused.load(std::memory_order_acquire)) {
    return {BackendType::kTcp, "TCP: CMA was refused (EPERM) on use after the probe had passed"};
  }
  // Which SHM copy moves this region's bytes, decided as Submit decides it.
  BackendChoiceInput in =
      host_->ChoiceInput(*peer, MemoryLocationType::CPU, MemoryLocationType::CPU);
  in.shm_path = ShmPath::kCma;
  if (!host_->options().shm_map) {
    in.shm_path_why = "mapping switched off (MORI_IO_SHM_MAP=0)";
  } else if (MappingFor(*peer, remote, &in.shm_path_why)) {
    in.shm_path = ShmPath::kMapped;
  }
  return ChooseBackend(in);
}

std::shared_ptr<TransferState> ShmTransport::Submit(const TransferRequest& req) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < req.n; ++i) bytes += req.spans[i].size;
  if (bytes == 0) return ControlHost::Finished(StatusDetail::SUCCESS, {});
  const HotPathOptions& options = host_->options();
  if (options.shm_map) {
    if (std::shared_ptr<ShmMapping> m = MappingFor(*req.peer, req.remote)) {
      return SubmitMapped(req, std::move(m));
    }
  }
  if (options.cma_cache) {
    StatusDetail code = StatusDetail::SUCCESS;
    std::string error;
    wire::WireStatus refusal = wire::WireStatus::kOk;
    std::shared_ptr<CmaRemote> g = CmaRemoteFor(*req.peer, req.remote, &code, &error, &refusal);
    if (g) return SubmitCma(req, std::move(g));
    // The target holds as many region grants as it allows: a grant per part instead,
    // which its connection holds only until the part is done.
    if (refusal != wire::WireStatus::kTooManyGrants) {
      return ControlHost::Finished(code, std::move(error));
    }
  }
  // A grant per part, asked for on the control connections and answered in order.
  return PostParts(*host_, req, wire::MsgType::kShmWriteReq, wire::MsgType::kShmReadReq);
}

namespace {

// How long a region the target refused at its grant bounds goes by a grant per part
// before this engine asks for a mapping or a CMA grant of it again.
constexpr int64_t kGrantRetryNs = 1'000'000'000;

// Whether `mem_id` was refused at the target's grant bounds less than kGrantRetryNs ago
// (an expired entry is erased).
bool RefusedRecently(std::unordered_map<uint64_t, int64_t>& retry_ns, uint64_t mem_id) {
  auto it = retry_ns.find(mem_id);
  if (it == retry_ns.end()) return false;
  if (NowNs() < it->second) return true;
  retry_ns.erase(it);
  return false;
}

}  // namespace

std::shared_ptr<ShmMapping> ShmTransport::MappingFor(Peer& peer, const RemoteRegion& remote,
                                                     std::string* why_not) {
  const uint64_t mem_id = remote.mem_id;
  PeerShm& s = StateOf(peer);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.maps.find(mem_id);
  if (it != s.maps.end()) {
    if (!it->second && why_not != nullptr) *why_not = s.unmapped_why[mem_id];
    return it->second;
  }
  if (RefusedRecently(s.map_retry_ns, mem_id)) {
    if (why_not != nullptr) *why_not = "no mapping granted: the target is at its grant bounds";
    return nullptr;
  }
  std::string answer, error;
  StatusDetail code = StatusDetail::SUCCESS;
  wire::WireStatus status = wire::WireStatus::kOk;
  if (!host_->channel().SideRequest(peer, wire::MsgType::kShmMapReq, wire::MsgType::kShmMapGrant,
                                    mem_id, remote.capability, {}, &answer, &code, &error,
                                    &status)) {
    // Not shareable: CMA from now on for this region. Anything else (unknown memory,
    // an unreachable peer) is left to the CMA path to report, and asked again later.
    if (status == wire::WireStatus::kNotShareable) {
      error = "the target region is not in shared host memory (allocate_shared_host_memory)";
      s.maps.emplace(mem_id, nullptr);
      s.unmapped_why[mem_id] = error;
    } else if (status == wire::WireStatus::kTooManyGrants) {
      s.map_retry_ns[mem_id] = NowNs() + kGrantRetryNs;
    }
    if (why_not != nullptr) {
      *why_not = status == wire::WireStatus::kNotShareable ? error : "no mapping granted: " + error;
    }
    return nullptr;
  }
  std::shared_ptr<ShmMapping> m;
  try {
    const ShmMapGrant g = UnpackShmMapGrant(answer);
    std::shared_ptr<const TargetLiveness> owner = LivenessOf(peer, g.pid, g.live, &error);
    if (owner) m = MapPeerRegion(g, &error);
    if (m) m->owner = std::move(owner);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!m) {
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': mapping memory ", mem_id, " of ",
                  LogSafe(peer.key), " failed (", error, "); CMA moves it");
    s.unmapped_why[mem_id] = "mapping the target's shared region failed: " + error;
    if (why_not != nullptr) *why_not = s.unmapped_why[mem_id];
  }
  s.maps.emplace(mem_id, m);
  return m;
}

// The liveness of the peer that sent a grant naming `pid` and `live`; opened once per
// peer (its mu held). nullptr with *error when the grant's pid is not the peer's or its
// page cannot be mapped.
std::shared_ptr<const TargetLiveness> ShmTransport::LivenessOf(Peer& peer, int pid,
                                                               const LivenessGrant& live,
                                                               std::string* error) {
  // The pid of the process that answered is not taken on trust: our copies go to the
  // pid of the EngineDesc (same host identity, so the same pid namespace).
  if (peer.pid > 0 && pid != peer.pid) {
    *error = StrCat("the grant names pid ", pid, ", the remote EngineDesc pid ", peer.pid);
    return nullptr;
  }
  PeerShm& s = StateOf(peer);
  if (s.liveness) return s.liveness;
  const bool use_word = host_->options().liveness_word;
  std::shared_ptr<TargetLiveness> t = TargetLiveness::Open(pid, live, use_word, error);
  if (!t) return nullptr;
  if (use_word && !t->uses_word()) {
    MORI_LOG_INFO(kIo, "engine '", host_->key(), "': ", LogSafe(peer.key),
                  " offers no liveness word; its pidfd is polled per same-host copy");
  }
  s.liveness = std::move(t);
  return s.liveness;
}

std::shared_ptr<CmaRemote> ShmTransport::CmaRemoteFor(Peer& peer, const RemoteRegion& remote,
                                                      StatusDetail* code, std::string* error,
                                                      wire::WireStatus* status) {
  const uint64_t mem_id = remote.mem_id;
  PeerShm& s = StateOf(peer);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.cma_grants.find(mem_id);
  if (it != s.cma_grants.end()) return it->second;
  if (RefusedRecently(s.cma_retry_ns, mem_id)) {
    *status = wire::WireStatus::kTooManyGrants;
    return nullptr;
  }
  // Held across the request: a revoke of this region (RemoteRegionRevoked takes mu) that
  // the target sent after granting is handled only once the grant is cached here.
  const std::string what = StrCat("SHM: no CMA grant for memory ", mem_id, " of remote engine ",
                                  LogSafe(peer.key), ": ");
  std::string answer;
  if (!host_->channel().SideRequest(peer, wire::MsgType::kShmCmaReq, wire::MsgType::kShmCmaGrant,
                                    mem_id, remote.capability, {}, &answer, code, error, status)) {
    if (*status == wire::WireStatus::kTooManyGrants) {
      s.cma_retry_ns[mem_id] = NowNs() + kGrantRetryNs;
    }
    *error = what + *error;
    return nullptr;
  }
  auto r = std::make_shared<CmaRemote>();
  try {
    const CmaGrant g = UnpackCmaGrant(answer);
    r->owner = LivenessOf(peer, g.pid, g.live, error);
    r->pid = g.pid;
    r->addr = g.addr;
    r->size = g.size;
  } catch (const std::exception& e) {
    *error = e.what();
  }
  if (!r->owner) {
    *code = StatusDetail::ERR_TRANSPORT;
    *error = what + *error;
    return nullptr;
  }
  s.cma_grants.emplace(mem_id, r);
  return r;
}

void ShmTransport::RemoteRegionRevoked(Peer& peer, uint64_t mem_id,
                                       const std::shared_ptr<void>& released) {
  std::shared_ptr<ShmMapping> map;  // shared host memory mapped here
  std::shared_ptr<CmaRemote> cma;   // a CMA grant held here
  {
    PeerShm& s = StateOf(peer);
    std::lock_guard<std::mutex> lock(s.mu);
    auto sit = s.maps.find(mem_id);
    if (sit != s.maps.end()) {
      map = std::move(sit->second);
      s.maps.erase(sit);
    }
    s.unmapped_why.erase(mem_id);
    s.map_retry_ns.erase(mem_id);
    s.cma_retry_ns.erase(mem_id);
    auto cit = s.cma_grants.find(mem_id);
    if (cit != s.cma_grants.end()) {
      cma = std::move(cit->second);
      s.cma_grants.erase(cit);
    }
  }
  // Acknowledged once the last copy holding either ended and it is unmapped.
  if (map) map->released = [released] {};
  if (cma) cma->released = [released] {};
}

void ShmTransport::RegisterInitiatorHandlers() {
  ControlHandlers& handlers = host_->channel().handlers();
  auto grant = [this](Reactor& r, Conn& c, const Pending& p, std::string*) {
    return OnGrant(r, c, p);
  };
  handlers.OnResponse(wire::MsgType::kShmGrant, wire::MsgType::kShmWriteReq, grant);
  handlers.OnResponse(wire::MsgType::kShmGrant, wire::MsgType::kShmReadReq, grant);
  handlers.OnResponse(wire::MsgType::kShmDoneAck, wire::MsgType::kShmWriteDone,
                      [this](Reactor&, Conn&, const Pending& p, std::string*) {
                        if (p.record_id != SubmissionLedger::kNoRecord) {
                          host_->CompletePart(p.record_id, StatusDetail::SUCCESS, {});
                        }
                        return true;
                      });
}

// The initiator's half of an SHM part: copy into (write) or out of (read) the granted
// range of the target, then for a write tell the target, which accounts the part and
// acknowledges; the part completes on that acknowledgement, so a completed write's
// inbound status is already recorded at the target (as over TCP).
bool ShmTransport::OnGrant(Reactor& r, Conn& c, const Pending& p) {
  const wire::Header& h = c.cur;
  auto status = static_cast<wire::WireStatus>(h.status);
  if (status != wire::WireStatus::kOk) {
    host_->CompletePart(p.record_id, wire::WireStatusCode(status), r.Refusal(c, p, status));
    return true;
  }
  const bool write = p.type == wire::MsgType::kShmWriteReq;
  int err;
  {
    MORI_SCOPED_TIMER(kIo, "io.shm.cma_copy");
    err = CmaCopy(c.remote_pid, write, p.local, h.offset, p.length);
  }
  std::string error;
  if (err != 0) {
    error = StrCat(write ? "process_vm_writev" : "process_vm_readv", " of ", p.length,
                   " bytes with pid ", c.remote_pid, " (remote engine ", LogSafe(c.remote_key),
                   ", memory ", p.mem_id, " offset ", p.offset, ") failed: ", ErrnoText(err));
    if (err == EPERM) {
      // Allowed at connect, refused now: later transfers of this pair go over TCP.
      if (auto peer = c.peer.lock()) StateOf(*peer).refused.store(true, std::memory_order_release);
      MORI_LOG_WARN(kIo, "engine '", host_->key(), "': ", error,
                    "; transfers to it fall back to TCP");
    }
  }
  StatusDetail code = err == ESRCH ? StatusDetail::ERR_PEER_LOST : StatusDetail::ERR_TRANSPORT;
  if (!write) {
    // Our copy out of the region has ended (either way): the target may release its
    // hold (the done leaves at the end of this read pass).
    wire::Header d = wire::MakeHeader(wire::MsgType::kShmReadDone, p.mem_id);
    d.uid = p.uid;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.sendq.push_back({d, nullptr, 0, 0, nullptr});
      c.need_flush = true;
    }
    host_->CompletePart(p.record_id, err == 0 ? StatusDetail::SUCCESS : code, error);
    return true;
  }
  Pending done = p;
  done.type = wire::MsgType::kShmWriteDone;
  if (err != 0) {
    host_->CompletePart(p.record_id, code, error);
    done.record_id = SubmissionLedger::kNoRecord;
  }
  wire::Header d = wire::MakeHeader(wire::MsgType::kShmWriteDone, p.mem_id);
  d.status = static_cast<uint8_t>(err == 0 ? wire::WireStatus::kOk : wire::WireStatus::kCopyFailed);
  d.num_parts = p.num_parts;
  d.uid = p.uid;
  d.offset = p.offset;
  d.length = p.length;
  // Request and pending entry together under the lock: a submitter's requests
  // interleave whole, so responses still match pending entries in order.
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.pending.empty()) c.progress_ns = NowNs();
  c.sendq.push_back({d, nullptr, 0, 0, nullptr});
  c.pending.push_back(done);
  c.need_flush = true;
  return true;
}

int ShmTransport::MappingState(const std::string& remote_key, uint64_t mem_id) {
  std::shared_ptr<Peer> peer = host_->FindPeer(remote_key);
  if (!peer) return -1;
  PeerShm& s = StateOf(*peer);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.maps.find(mem_id);
  return it == s.maps.end() ? -1 : (it->second ? 1 : 0);
}

int ShmTransport::CmaGrantState(const std::string& remote_key, uint64_t mem_id) {
  std::shared_ptr<Peer> peer = host_->FindPeer(remote_key);
  if (!peer) return 0;
  PeerShm& s = StateOf(*peer);
  std::lock_guard<std::mutex> lock(s.mu);
  return s.cma_grants.count(mem_id) != 0 ? 1 : 0;
}

std::string ShmTransport::Liveness(const std::string& remote_key) {
  std::shared_ptr<Peer> peer = host_->FindPeer(remote_key);
  if (!peer) return {};
  PeerShm& s = StateOf(*peer);
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.liveness) return {};
  return s.liveness->uses_word() ? "word" : "pidfd";
}

}  // namespace mori::io
