// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/io_engine.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/macros.hpp"
#include "mori/core/telemetry.hpp"
#include "p2p/p2p_transport.hpp"
#include "rdma/rdma_transport.hpp"
#include "shm/shm_transport.hpp"
#include "control/socket_io.hpp"
#include "tcp/tcp_transport.hpp"
#include "wire/log_safe.hpp"
#include "wire/secret.hpp"

namespace mori::io {

namespace {

// Transfers in flight at most per engine (the submission ledger's admission limit).
constexpr size_t kLedgerLimit = (1 << 14) - 1;

bool EnvFlag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return !(std::strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 || strcasecmp(v, "false") == 0);
}

TransportSlot SlotOf(BackendType b) {
  switch (b) {
    case BackendType::kShm:
      return kShmSlot;
    case BackendType::kP2P:
      return kP2pSlot;
    case BackendType::kRdma:
      return kRdmaSlot;
    default:
      return kTcpSlot;
  }
}

// Closes the peer's control connections: their reactors see a hang-up and fail what was
// pending on them.
void ShutDownConnections(Peer& peer) {
  if (PeerConnections* pc = peer.published.load(std::memory_order_acquire)) {
    for (auto& c : pc->conns) {
      std::lock_guard<std::mutex> lock(c->mu);
      if (!c->dead) ::shutdown(c->fd, SHUT_RDWR);
    }
  }
}

}  // namespace

HotPathOptions HotPathOptions::FromEnv() {
  HotPathOptions o;
  o.shm_map = EnvFlag("MORI_IO_SHM_MAP", true);
  o.notice_ring = EnvFlag("MORI_IO_NOTICE_RING", true);
  o.cma_cache = EnvFlag("MORI_IO_CMA_CACHE", true);
  o.liveness_word = EnvFlag("MORI_IO_SHM_LIVENESS_WORD", true);
  o.tcp_waiter_reads = EnvFlag("MORI_IO_TCP_WAITER_READS", true);
  if (const char* us = std::getenv("MORI_IO_TCP_BUSY_POLL_US")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(us, &end, 10);
    if (end == us || *end != '\0' || v > 1000000) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_TCP_BUSY_POLL_US='", us,
                 "': expected microseconds in [0, 1000000]");
    }
    o.tcp_busy_poll_us = static_cast<uint32_t>(v);
  }
  if (const char* split = std::getenv("MORI_IO_SHM_SPLIT_BYTES")) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(split, &end, 10);
    if (end == split || *end != '\0' || (v != 0 && (v < 4096 || v > (1ull << 40)))) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_SHM_SPLIT_BYTES='", split,
                 "': expected 0 (never split) or bytes in [4096, 2^40]");
    }
    o.shm_split_bytes = v;
  }
  if (const char* slots = std::getenv("MORI_IO_NOTICE_RING_SLOTS")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(slots, &end, 10);
    if (end == slots || *end != '\0' || (v != 0 && (v < 2 || v > (1u << 20) || (v & (v - 1))))) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_NOTICE_RING_SLOTS='", slots,
                 "': expected 0 or a power of two in [2, 1048576]");
    }
    o.notice_ring_slots = static_cast<uint32_t>(v);
  }
  auto count = [](const char* name, unsigned long lo, unsigned long hi, uint32_t* out) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    char* end = nullptr;
    unsigned long n = std::strtoul(v, &end, 10);
    if (end == v || *end != '\0' || n < lo || n > hi) {
      MORI_THROW(InvalidArgumentError, name, "='", v, "': expected a count in [", lo, ", ", hi,
                 "]");
    }
    *out = static_cast<uint32_t>(n);
  };
  count("MORI_IO_MAX_GRANT_HOLDERS", 1, 1u << 20, &o.max_grant_holders);
  count("MORI_IO_MAX_GRANTS", 1, 1u << 24, &o.max_grants);
  if (const char* rings = std::getenv("MORI_IO_MAX_NOTICE_RINGS")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(rings, &end, 10);
    if (end == rings || *end != '\0' || v > (1u << 16)) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_MAX_NOTICE_RINGS='", rings,
                 "': expected a count in [0, 65536]");
    }
    o.max_notice_rings = static_cast<uint32_t>(v);
  }
  return o;
}

IoEngine::IoEngine(std::string key, std::string host, uint16_t port)
    : key_(std::move(key)),
      host_(std::move(host)),
      options_(HotPathOptions::FromEnv()),
      memory_(key_),
      inbound_(key_),
      channel_(this),
      grants_(this) {
  MORI_CHECK_ARG(!key_.empty(), "engine key must not be empty");
  MORI_CHECK_ARG(key_.size() <= 4096, "engine key of ", key_.size(), " bytes exceeds 4096");
  if (host_.empty()) host_ = "127.0.0.1";
  listen_fd_ = ListenOn(host_, port, key_, &port_);
  ledger_ = std::make_unique<SubmissionLedger>(kLedgerLimit);
  host_id_ = LocalHostIdentity();
  const char* forced = std::getenv("MORI_IO_BACKEND");
  override_ = ParseBackendOverride(forced != nullptr ? forced : "");
  secret_ = RandomSecret(wire::kSecretBytes);
  // Each transport registers its control messages; the table is complete before any
  // reactor runs.
  grants_.RegisterHandlers(channel_.handlers());
  grants_.Configure(options_.max_grant_holders, options_.max_grants);
  tcp_ = std::make_unique<TcpTransport>(this);
  shm_ = std::make_unique<ShmTransport>(this);
  p2p_ = std::make_unique<P2pTransport>(this);
  rdma_ = std::make_unique<RdmaTransport>(this);
  by_slot_ = {tcp_.get(), shm_.get(), p2p_.get(), rdma_.get()};
  MORI_LOG_DEBUG(kIo, "engine '", key_, "' listening on ", host_, ":", port_);
}

IoEngine::~IoEngine() { Shutdown(); }

void IoEngine::Shutdown() {
  ForEachTransport([](Transport& t) { t.Shutdown(); });  // P2P copies in flight finish
  channel_.Stop();  // closes every connection, failing what was pending
  ForEachTransport([](Transport& t) { t.ChannelStopped(); });
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void IoEngine::ForEachTransport(const std::function<void(Transport&)>& fn) {
  for (Transport* t : by_slot_) {
    if (t != nullptr) fn(*t);
  }
}

void IoEngine::CreateTcpBackend(const TcpBackendConfig& config) {
  MORI_CHECK_ARG(!channel_.running(), "engine '", key_,
                 shm_->created() ? "' already runs the reactors its SHM backend started: create "
                                   "the TCP backend before SHM to configure them"
                                 : "' already has a TCP backend");
  MORI_CHECK_ARG(config.num_worker_threads >= 1 && config.num_worker_threads <= 64,
                 "num_worker_threads ", config.num_worker_threads, " not in [1, 64]");
  MORI_CHECK_ARG(config.qp_per_transfer >= 1 && config.qp_per_transfer <= 64, "qp_per_transfer ",
                 config.qp_per_transfer, " not in [1, 64]");
  MORI_CHECK_ARG(config.chunk_size >= 4096, "chunk_size ", config.chunk_size, " below 4096");
  MORI_CHECK_ARG(config.peer_timeout_ms > 0, "peer_timeout_ms must be positive");
  MORI_CHECK_ARG(config.transfer_timeout_ms > 0, "transfer_timeout_ms ", config.transfer_timeout_ms,
                 " must be positive");
  MORI_CHECK_ARG(config.max_inbound_statuses >= 1, "max_inbound_statuses must be at least 1");
  MORI_CHECK_ARG(config.max_inbound_status_bytes >= InboundStatuses::kMinBytes,
                 "max_inbound_status_bytes ", config.max_inbound_status_bytes, " below ",
                 InboundStatuses::kMinBytes);
  MORI_CHECK_ARG(config.idle_timeout_ms >= 0, "idle_timeout_ms ", config.idle_timeout_ms,
                 " must be 0 (off) or positive");
  tcp_config_ = config;
  inbound_.Configure(config.enable_notification, config.max_inbound_statuses,
                     config.max_inbound_status_bytes);
  ForEachTransport([](Transport& t) { t.ChannelStarting(); });
  channel_.Start(
      config, listen_fd_,
      [this] { ForEachTransport([](Transport& t) { t.OnControlThread(true); }); },
      [this] { ForEachTransport([](Transport& t) { t.OnControlThread(false); }); });
  backends_epoch_.fetch_add(1, std::memory_order_release);
}

void IoEngine::CreateShmBackend() {
  MORI_CHECK_ARG(!shm_->created(), "engine '", key_, "' already has an SHM backend");
  shm_->ProbeSelf();
  if (!channel_.running()) CreateTcpBackend(TcpBackendConfig{});
  shm_->MarkCreated();
  backends_epoch_.fetch_add(1, std::memory_order_release);
}

bool IoEngine::HasShmBackend() const { return shm_->created(); }

void IoEngine::CreateP2pBackend(const P2pBackendConfig& config) {
  MORI_CHECK_ARG(!p2p_->created(), "engine '", key_, "' already has a P2P backend");
  auto backend = std::make_unique<P2pBackend>(config);  // throws where CUDA is missing
  if (!channel_.running()) CreateTcpBackend(TcpBackendConfig{});
  p2p_->Adopt(std::move(backend));
  backends_epoch_.fetch_add(1, std::memory_order_release);
}

void IoEngine::CreateRdmaBackend(const rdma::RdmaBackendConfig& config) {
  MORI_CHECK_ARG(!rdma_->created(), "engine '", key_, "' already has an RDMA backend");
  std::unique_ptr<rdma::RdmaBackend> backend = rdma::RdmaBackend::Create(config);
  if (!channel_.running()) CreateTcpBackend(TcpBackendConfig{});
  rdma_->Adopt(std::move(backend));
  backends_epoch_.fetch_add(1, std::memory_order_release);
}

BackendChoiceInput IoEngine::ChoiceInput(const Peer& peer, MemoryLocationType local_loc,
                                         MemoryLocationType remote_loc) const {
  BackendChoiceInput in;
  in.local_host_id = host_id_;
  in.remote_host_id = peer.host_id;
  in.local_loc = local_loc;
  in.remote_loc = remote_loc;
  in.local_shm = shm_->created();
  in.remote_shm = peer.remote_shm && peer.pid > 0;
  in.local_p2p = p2p_->created();
  in.remote_p2p = peer.remote_p2p;
  in.local_rdma = rdma_->created();
  in.remote_rdma = peer.remote_rdma;
  in.cma_ok = shm_->self_probe_ok();
  in.cma_reason = shm_->self_probe_reason();
  in.override_choice = backend_override();
  return in;
}

Transport& IoEngine::Route(const Peer& peer, MemoryLocationType local_loc,
                           MemoryLocationType remote_loc) const {
  // ChooseBackend copies host ids and builds reason strings: decided once per (peer,
  // location pair, override, set of created backends), then one acquire load.
  const unsigned pair =
      static_cast<unsigned>(local_loc) % 3 * 3 + static_cast<unsigned>(remote_loc) % 3;
  const uint64_t key = (uint64_t{backends_epoch_.load(std::memory_order_acquire)} & 0xffff) << 8 |
                       (static_cast<uint64_t>(backend_override()) + 1);
  const uint64_t cached = peer.routes.load(std::memory_order_acquire);
  const bool same_key = (cached >> 40) == key;
  if (same_key) {
    const unsigned slot = (cached >> (4 * pair)) & 15u;
    if (slot != 0) return *by_slot_[slot - 1];
  }
  const TransportSlot slot =
      SlotOf(ChooseBackend(ChoiceInput(peer, local_loc, remote_loc)).backend);
  const uint64_t base = same_key ? cached : key << 40;
  peer.routes.store(base | (uint64_t{slot} + 1) << (4 * pair), std::memory_order_release);
  return *by_slot_[slot];
}

BackendChoice IoEngine::BackendFor(MemoryLocationType local_loc, const RemoteRegion& remote) {
  std::shared_ptr<Peer> peer = FindPeer(remote.engine_key);
  if (!peer) {
    MORI_THROW(NotFoundError, "backend_for: remote engine '", remote.engine_key,
               "' is not registered with engine '", key_, "'");
  }
  BackendChoice choice = ChooseBackend(ChoiceInput(*peer, local_loc, remote.loc));
  if (local_loc != MemoryLocationType::CPU || remote.loc != MemoryLocationType::CPU) return choice;
  if (!channel_.running()) return {BackendType::kTcp, "no backend created yet"};
  std::string error;
  if (Connected(peer, &error) == nullptr) {
    return {BackendType::kTcp, "TCP: the remote engine is unreachable: " + error};
  }
  return by_slot_[SlotOf(choice.backend)]->Explain(peer, remote, std::move(choice));
}

MemoryRegion IoEngine::RegisterMemory(uintptr_t addr, uint64_t size, int device_id,
                                      MemoryLocationType loc) {
  return memory_.Add(addr, size, device_id, loc, [this](const MemoryRegion& r) {
    ForEachTransport([&](Transport& t) { t.RegionRegistered(r); });
  });
}

void IoEngine::DeregisterMemory(uint64_t id) {
  WithdrawalSteps steps;
  steps.in_flight = [this](uint64_t region) {
    uint64_t n = 0;
    ForEachTransport([&](Transport& t) { n += t.RegionInFlight(region); });
    return n;
  };
  steps.granted = [this](uint64_t region) { return grants_.Has(region); };
  steps.revoke = [this](uint64_t region) { grants_.Revoke(region); };
  steps.withdrawn = [this](uint64_t region) {
    ForEachTransport([&](Transport& t) { t.RegionWithdrawn(region); });
  };
  memory_.Remove(id, steps);
}

void IoEngine::RegisterRemoteEngine(const PeerDesc& desc) {
  MORI_CHECK_ARG(!desc.key.empty(), "register_remote_engine: empty engine key");
  MORI_CHECK_ARG(desc.secret.empty() || desc.secret.size() == wire::kSecretBytes,
                 "register_remote_engine: secret of ", desc.secret.size(), " bytes (expected ",
                 wire::kSecretBytes, ")");
  auto peer = std::make_shared<Peer>();
  static_cast<PeerDesc&>(*peer) = desc;
  ForEachTransport([&](Transport& t) { peer->state[t.slot()] = t.NewPeerState(); });
  std::shared_ptr<Peer> old = peers_.Put(peer);
  if (!desc.secret.empty()) {
    // From now on its hellos must prove this EngineDesc (InitiatorAccepted); connections
    // that spoke for that key before without it (one that took the key of an initiator
    // we had not registered) are closed too.
    const std::string credential = InitiatorCredential(desc.secret, secret_, desc.key);
    if (size_t n = channel_.CutOffOthers(desc.key, credential)) {
      MORI_LOG_WARN(kIo, "engine '", key_, "': closed ", n, " inbound connection(s) of ",
                    LogSafe(desc.key), " that did not prove the EngineDesc registered now");
    }
  }
  if (old) {
    ForEachTransport(
        [&](Transport& t) { t.PeerLost(desc.key, "the remote engine was registered again"); });
    ShutDownConnections(*old);
  }
}

void IoEngine::ReconnectLater(const std::shared_ptr<Peer>& old, const std::string& why) {
  auto fresh = std::make_shared<Peer>();
  static_cast<PeerDesc&>(*fresh) = static_cast<const PeerDesc&>(*old);
  ForEachTransport([&](Transport& t) { fresh->state[t.slot()] = t.NewPeerState(); });
  if (!peers_.Replace(old, fresh)) return;  // registered again or deregistered meanwhile
  old->MarkFailed(why);
  ForEachTransport([&](Transport& t) { t.PeerLost(old->key, why); });
  ShutDownConnections(*old);
}

void IoEngine::InboundClosed(const std::string& key) { grants_.ConnectionClosed(key); }

bool IoEngine::InitiatorIdleClosable(const std::string& key) {
  if (grants_.HoldsAny(key)) return false;
  bool closable = true;
  ForEachTransport([&](Transport& t) { closable = closable && !t.KeepsInitiator(key); });
  return closable;
}

void IoEngine::DeregisterRemoteEngine(const std::string& key) {
  std::shared_ptr<Peer> old = peers_.Take(key);
  if (!old) {
    MORI_THROW(NotFoundError, "remote engine '", key, "' is not registered with engine '", key_,
               "'");
  }
  old->MarkFailed("the remote engine was deregistered");
  ForEachTransport([&](Transport& t) { t.PeerLost(key, "the remote engine was deregistered"); });
  ShutDownConnections(*old);
}

bool IoEngine::SecretMatches(const char* data, size_t n) const {
  return SecretEqual(secret_, data, n);
}

bool IoEngine::InitiatorAccepted(const std::string& key, const std::string& credential,
                                 std::string* why_not) {
  std::shared_ptr<Peer> peer = FindPeer(key);
  if (peer && !peer->secret.empty()) {
    // Registered here: its EngineDesc's secret is known, so its hellos must prove it.
    std::string expected = InitiatorCredential(peer->secret, secret_, key);
    if (SecretEqual(expected, credential.data(), credential.size())) return true;
    *why_not = credential.empty() ? "no credential, and that engine is registered here"
                                  : "its credential is not that of the registered EngineDesc";
    return false;
  }
  // Not registered (MORI's flows need not register the reading side): the first
  // connection of the key binds its credential while any of its connections is open.
  if (channel_.CredentialConflicts(key, credential)) {
    *why_not = "another credential than that of its connections already open here";
    return false;
  }
  return true;
}

PeerConnections* IoEngine::Connected(const std::shared_ptr<Peer>& peer, std::string* error) {
  // Read under the peer's connect lock, uncontended once connected (a lock-free read of
  // the published pointer measured no faster end to end: BENCHMARKS.md, ablation).
  {
    std::lock_guard<std::mutex> lock(peer->connect_mu);
    if (PeerConnections* pc = peer->owned.get()) return pc;
  }
  return channel_.Connect(
      peer,
      [&](PeerConnections& conns) {
        ForEachTransport([&](Transport& t) { t.PeerConnecting(*peer, conns); });
      },
      error);
}

void IoEngine::CompletePart(uint64_t record_id, StatusDetail code, const std::string& message) {
  TransferRecord* rec = ledger_->Lookup(record_id);
  if (rec == nullptr) {
    MORI_LOG_ERROR(kIo, "engine '", key_, "': completion for record ", record_id,
                   " that is not live");
    return;
  }
  if (code != StatusDetail::SUCCESS) {
    uint32_t none = 0;
    if (rec->error_code.compare_exchange_strong(none, static_cast<uint32_t>(code),
                                                std::memory_order_acq_rel)) {
      rec->error_message = message;
    }
  }
  if (rec->parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::shared_ptr<TransferState> state = std::move(rec->state);
  auto err = static_cast<StatusDetail>(rec->error_code.load(std::memory_order_acquire));
  std::string msg = err != StatusDetail::SUCCESS ? std::move(rec->error_message) : std::string();
  RegionUse* use = rec->local_use;
  rec->local_use = nullptr;
  ledger_->Release(record_id);
  // Before Finish: a caller that saw the transfer finish may deregister its memory.
  if (use != nullptr) use->Leave();
  if (state) state->Finish(err, std::move(msg));
}

std::shared_ptr<TransferState> IoEngine::PopInboundTransferStatus(const std::string& remote_key,
                                                                  uint64_t uid) {
  ForEachTransport([&](Transport& t) { t.DrainInbound(&remote_key); });
  return inbound_.Pop(remote_key, uid);
}

InboundStatuses::Stats IoEngine::inbound_stats() {
  ForEachTransport([](Transport& t) { t.DrainInbound(nullptr); });
  return inbound_.stats();
}

std::shared_ptr<TransferState> IoEngine::Finished(StatusDetail code, std::string message) {
  return std::make_shared<TransferState>(code, std::move(message));
}

std::shared_ptr<TransferState> IoEngine::RemoteBoundsError(const TransferRequest& req,
                                                           uint64_t limit) {
  for (size_t i = 0; i < req.n; ++i) {
    const TransferSpan& s = req.spans[i];
    if (s.size > limit || s.remote_offset > limit - s.size) {
      return Finished(StatusDetail::ERR_OUT_OF_BOUNDS,
                      StrCat(req.op == Op::kWrite ? "write " : "read ", i, ": remote range [",
                             s.remote_offset, ", +", s.size, ") exceeds memory ", req.remote.mem_id,
                             " as registered with '", req.peer->key, "' (", limit, " bytes)"));
    }
  }
  return nullptr;
}

std::shared_ptr<TransferState> IoEngine::BeginTransfer(const MemoryRegion& local, uint32_t parts,
                                                       bool long_spin, uint64_t* rid) {
  *rid = SubmissionLedger::kNoRecord;
  if (auto refused = EnterLocal(local)) return refused;
  RegionUse* use = local.use.get();
  uint64_t id = ledger_->Admit();
  if (id == SubmissionLedger::kNoRecord) {
    if (use != nullptr) use->Leave();
    return Finished(StatusDetail::ERR_BAD_STATE,
                    StrCat("too many transfers in flight: ", ledger_->live(),
                           " live records reach the submission ledger's admission limit of ",
                           ledger_->admission_limit(), "; wait for earlier transfers"));
  }
  auto state = std::make_shared<TransferState>();
  if (long_spin) state->SetLongSpin();
  state->SetInProgress();
  TransferRecord* rec = ledger_->Lookup(id);
  rec->state = state;
  rec->local_use = use;
  rec->parts_left.store(parts, std::memory_order_release);
  *rid = id;
  return state;
}

std::shared_ptr<TransferState> IoEngine::EnterLocal(const MemoryRegion& local) {
  RegionUse* use = local.use.get();
  if (use == nullptr || MORI_LIKELY(use->Enter())) return nullptr;
  return Finished(StatusDetail::ERR_NOT_FOUND,
                  StrCat("local memory ", local.id, " was deregistered from engine '", key_, "'"));
}

std::shared_ptr<TransferState> IoEngine::Transfer(Op op, uint64_t local_mem,
                                                  const RemoteRegion& remote,
                                                  const TransferSpan* spans, size_t n,
                                                  uint64_t uid) {
  MemoryRegion local;
  if (!memory_.Find(local_mem, &local)) {
    return Finished(StatusDetail::ERR_NOT_FOUND,
                    StrCat("local memory ", local_mem, " is not registered with engine '", key_,
                           "' (never, or deregistered)"));
  }
  return Submit(op, local, FindPeer(remote.engine_key), remote, spans, n, uid);
}

std::shared_ptr<TransferState> IoEngine::Submit(Op op, const MemoryRegion& local,
                                                const std::shared_ptr<Peer>& peer,
                                                const RemoteRegion& remote,
                                                const TransferSpan* spans, size_t n, uint64_t uid) {
  MORI_SCOPED_TIMER(kIo, "io.submit");
  const char* verb = op == Op::kWrite ? "write" : "read";
  if (!channel_.running()) {
    return Finished(StatusDetail::ERR_BAD_STATE,
                    StrCat("engine '", key_,
                           "' has no backend: call create_backend(BackendType.TCP or SHM) first"));
  }
  if (!peer) {
    return Finished(
        StatusDetail::ERR_NOT_FOUND,
        StrCat("remote engine '", remote.engine_key, "' is not registered with engine '", key_,
               "': call register_remote_engine with its EngineDesc"));
  }
  Transport* transport = &Route(*peer, local.loc, remote.loc);
  TransferRequest req{op, local, peer, remote, spans, n, uid};
  if (auto refused = transport->Precheck(req)) return refused;
  for (size_t i = 0; i < n; ++i) {
    const TransferSpan& s = spans[i];
    if (s.size > local.size || s.local_offset > local.size - s.size) {
      return Finished(StatusDetail::ERR_OUT_OF_BOUNDS,
                      StrCat(verb, " ", i, ": local range [", s.local_offset, ", +", s.size,
                             ") exceeds local memory ", local.id, " of ", local.size, " bytes"));
    }
    if (s.size > remote.size || s.remote_offset > remote.size - s.size) {
      return Finished(StatusDetail::ERR_OUT_OF_BOUNDS,
                      StrCat(verb, " ", i, ": remote range [", s.remote_offset, ", +", s.size,
                             ") exceeds remote memory ", remote.mem_id, " of '", remote.engine_key,
                             "' (", remote.size, " bytes)"));
    }
  }
  if (peer->failed.load(std::memory_order_acquire)) {
    return Finished(StatusDetail::ERR_PEER_LOST,
                    StrCat("remote engine '", remote.engine_key, "' is unreachable (",
                           peer->FailReason(), "); register it again to retry"));
  }
  std::string connect_error;
  req.conns = Connected(peer, &connect_error);
  if (req.conns == nullptr) {
    peer->MarkFailed(connect_error);
    return Finished(StatusDetail::ERR_PEER_LOST, connect_error);
  }
  // The route's transport, or TCP where it cannot serve the pair now.
  if (!transport->CanHandle(*peer, local.loc, remote.loc)) transport = tcp_.get();
  return transport->Submit(req);
}

std::shared_ptr<Session> IoEngine::CreateSession(uint64_t local_mem, const RemoteRegion& remote) {
  MemoryRegion local = LocalRegion(local_mem);
  if (!FindPeer(remote.engine_key)) {
    MORI_THROW(NotFoundError, "create_session: remote engine '", remote.engine_key,
               "' is not registered with engine '", key_, "'");
  }
  return std::make_shared<Session>(this, local, remote);
}

Session::Session(IoEngine* engine, MemoryRegion local, RemoteRegion remote)
    : engine_(engine), local_(std::move(local)), remote_(std::move(remote)) {}

BackendChoice Session::Backend() { return engine_->BackendFor(local_.loc, remote_); }

std::shared_ptr<Peer> Session::CurrentPeer() {
  // Looked up per operation: the session keeps no peer of its own, so it needs no lock
  // of its own, and a peer registered again is used from the next operation on.
  return engine_->FindPeer(remote_.engine_key);
}

std::shared_ptr<TransferState> Session::Transfer(Op op, const TransferSpan* spans, size_t n,
                                                 uint64_t uid) {
  return engine_->Submit(op, local_, CurrentPeer(), remote_, spans, n, uid);
}

bool Session::Alive() {
  std::shared_ptr<Peer> peer = CurrentPeer();
  return peer != nullptr && !peer->failed.load(std::memory_order_acquire);
}

}  // namespace mori::io
