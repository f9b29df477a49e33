// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/io_engine.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "control/socket_io.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/macros.hpp"
#include "mori/core/telemetry.hpp"
#include "mori/core/timeout.hpp"
#include "wire/log_safe.hpp"
#include "wire/secret.hpp"

namespace mori::io {

namespace {

// Transfers in flight at most per engine (the submission ledger's admission limit).
constexpr size_t kLedgerLimit = (1 << 14) - 1;

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

}  // namespace

IoEngine::IoEngine(std::string key, std::string host, uint16_t port)
    : TransportHost(std::move(key), HotPathOptions::FromEnv(), kLedgerLimit),
      host_(std::move(host)) {
  if (host_.empty()) host_ = "127.0.0.1";
  listen_fd_ = ListenOn(host_, port, StrCat("engine '", key_, "'"), &port_);
  SetBackendOverride(ParseBackendOverride(options_.backend));
  // Each transport registers its control messages; the table is complete before any
  // reactor runs.
  grants().RegisterHandlers(channel().handlers());
  grants().Configure(options_.max_grant_holders, options_.max_grants);
  transports_ = std::make_unique<Transports>(this, [this] {
    if (!channel().running()) CreateTcpBackend(TcpBackendConfig{});
  });
  SetTransports(transports_->by_slot());
  MORI_LOG_DEBUG(kIo, "engine '", key_, "' listening on ", host_, ":", port_);
}

IoEngine::~IoEngine() { Shutdown(); }

void IoEngine::Shutdown() {
  ForEachTransport([](Transport& t) { t.Shutdown(); });  // P2P copies in flight finish
  channel().Stop();  // closes every connection, failing what was pending
  ForEachTransport([](Transport& t) { t.ChannelStopped(); });
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void IoEngine::CreateTcpBackend(const TcpBackendConfig& config) {
  MORI_CHECK_ARG(!channel().running(), "engine '", key_,
                 Created(kShmSlot) ? "' already runs the reactors its SHM backend started: create "
                                     "the TCP backend before SHM to configure them"
                                   : "' already has a TCP backend");
  MORI_CHECK_ARG(config.num_worker_threads >= 1 && config.num_worker_threads <= 64,
                 "num_worker_threads ", config.num_worker_threads, " not in [1, 64]");
  MORI_CHECK_ARG(config.qp_per_transfer >= 1 && config.qp_per_transfer <= 64, "qp_per_transfer ",
                 config.qp_per_transfer, " not in [1, 64]");
  MORI_CHECK_ARG(config.chunk_size >= 4096, "chunk_size ", config.chunk_size, " below 4096");
  TimeoutMs(config.peer_timeout_ms, "peer_timeout_ms", INT_MAX, false);
  TimeoutMs(config.transfer_timeout_ms, "transfer_timeout_ms", INT_MAX, false);
  MORI_CHECK_ARG(config.max_pending_hellos >= 1 && config.max_pending_hellos <= (1 << 20),
                 "max_pending_hellos ", config.max_pending_hellos, " not in [1, 2^20]");
  MORI_CHECK_ARG(
      config.max_connections_per_peer >= 1 && config.max_connections_per_peer <= (1 << 20),
      "max_connections_per_peer ", config.max_connections_per_peer, " not in [1, 2^20]");
  MORI_CHECK_ARG(config.max_inbound_statuses >= 1, "max_inbound_statuses must be at least 1");
  MORI_CHECK_ARG(config.max_inbound_status_bytes >= InboundStatuses::kMinBytes,
                 "max_inbound_status_bytes ", config.max_inbound_status_bytes, " below ",
                 InboundStatuses::kMinBytes);
  TimeoutMs(config.idle_timeout_ms, "idle_timeout_ms", INT_MAX, true);
  tcp_config_ = config;
  inbound_.Configure(config.enable_notification, config.max_inbound_statuses,
                     config.max_inbound_status_bytes);
  ForEachTransport([](Transport& t) { t.ChannelStarting(); });
  channel().Start(
      config, listen_fd_,
      [this] { ForEachTransport([](Transport& t) { t.OnControlThread(true); }); },
      [this] { ForEachTransport([](Transport& t) { t.OnControlThread(false); }); });
  backends_epoch_.fetch_add(1, std::memory_order_release);
}

void IoEngine::CreateShmBackend() {
  MORI_CHECK_ARG(!Created(kShmSlot), "engine '", key_, "' already has an SHM backend");
  transports_->CreateShm();
  backends_epoch_.fetch_add(1, std::memory_order_release);
}

void IoEngine::CreateP2pBackend(const P2pBackendConfig& config) {
  MORI_CHECK_ARG(!Created(kP2pSlot), "engine '", key_, "' already has a P2P backend");
  transports_->CreateP2p(config);
  backends_epoch_.fetch_add(1, std::memory_order_release);
}

void IoEngine::CreateRdmaBackend(const rdma::RdmaBackendConfig& config) {
  MORI_CHECK_ARG(!Created(kRdmaSlot), "engine '", key_, "' already has an RDMA backend");
  transports_->CreateRdma(config);
  backends_epoch_.fetch_add(1, std::memory_order_release);
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
    if (slot != 0) return transport(static_cast<TransportSlot>(slot - 1));
  }
  const TransportSlot slot =
      SlotOf(ChooseBackend(ChoiceInput(peer, local_loc, remote_loc)).backend);
  const uint64_t base = same_key ? cached : key << 40;
  peer.routes.store(base | (uint64_t{slot} + 1) << (4 * pair), std::memory_order_release);
  return transport(slot);
}

BackendChoice IoEngine::BackendFor(MemoryLocationType local_loc, const RemoteRegion& remote) {
  std::shared_ptr<Peer> peer = FindPeer(remote.engine_key);
  if (!peer) {
    MORI_THROW(NotFoundError, "backend_for: remote engine '", remote.engine_key,
               "' is not registered with engine '", key_, "'");
  }
  BackendChoice choice = ChooseBackend(ChoiceInput(*peer, local_loc, remote.loc));
  if (local_loc != MemoryLocationType::CPU || remote.loc != MemoryLocationType::CPU) return choice;
  if (!channel().running()) return {BackendType::kTcp, "no backend created yet"};
  std::string error;
  if (Connected(peer, &error) == nullptr) {
    return {BackendType::kTcp, "TCP: the remote engine is unreachable: " + error};
  }
  return transport(SlotOf(choice.backend)).Explain(peer, remote, std::move(choice));
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
  steps.granted = [this](uint64_t region) { return grants().Has(region); };
  steps.revoke = [this](uint64_t region) { grants().Revoke(region); };
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
  std::shared_ptr<Peer> peer = NewPeer(desc);
  std::shared_ptr<Peer> old = peers_.Put(peer);
  if (!desc.secret.empty()) {
    // From now on its hellos must prove this EngineDesc (InitiatorAccepted); connections
    // that spoke for that key before without it (one that took the key of an initiator
    // we had not registered) are closed too.
    const std::string credential = InitiatorCredential(desc.secret, secret_, desc.key);
    if (size_t n = channel().CutOffOthers(desc.key, credential)) {
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

PeerConnections* IoEngine::Connected(const std::shared_ptr<Peer>& peer, std::string* error) {
  // Read under the peer's connect lock, uncontended once connected (a lock-free read of
  // the published pointer measured no faster end to end: BENCHMARKS.md, ablation).
  {
    std::lock_guard<std::mutex> lock(peer->connect_mu);
    if (PeerConnections* pc = peer->owned.get()) return pc;
  }
  return channel().Connect(
      peer,
      [&](PeerConnections& conns) {
        ForEachTransport([&](Transport& t) { t.PeerConnecting(*peer, conns); });
      },
      error);
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
  if (!channel().running()) {
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
  if (!transport->CanHandle(*peer, local.loc, remote.loc)) transport = &this->transport(kTcpSlot);
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
