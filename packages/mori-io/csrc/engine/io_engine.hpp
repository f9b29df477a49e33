// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "control/tcp_config.hpp"
#include "engine/transport_factory.hpp"
#include "host/transport_host.hpp"
#include "ledger/transfer_state.hpp"
#include "registry/backend_select.hpp"
#include "registry/transfer_request.hpp"

namespace mori::io {

class IoEngine;

// A bound (local memory, remote memory) pair. Each operation looks the remote engine up
// in the engine's peer table (a shared lock), so a session follows a peer registered
// again, or deregistered, from its next operation on; a session may be used from
// several threads.
class Session {
 public:
  Session(IoEngine* engine, MemoryRegion local, RemoteRegion remote);
  std::shared_ptr<TransferState> Transfer(Op op, const TransferSpan* spans, size_t n, uint64_t uid);
  bool Alive();
  BackendChoice Backend();

 private:
  std::shared_ptr<Peer> CurrentPeer();
  IoEngine* engine_;
  const MemoryRegion local_;
  const RemoteRegion remote_;
};

// The transfer engine, the top floor: the application's calls (regions, peers,
// transfers, sessions, create_backend) are validated here, each (peer, local location,
// remote location) is routed once to a transport (cached in the peer) and its transfers
// are handed to that transport. The engine is the transports' host (TransportHost: key,
// options, ledger, registries, inbound statuses, control channel, grants), which is all
// a transport sees of it; the transports come from the factory
// (engine/transport_factory.hpp).
class IoEngine : public TransportHost {
 public:
  IoEngine(std::string key, std::string host, uint16_t port);
  ~IoEngine() override;

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }

  // The control channel's reactors start with the TCP backend; SHM, P2P and RDMA start
  // them with the default config when TCP was not created first (their messages ride
  // on it).
  void CreateTcpBackend(const TcpBackendConfig& config);
  bool HasTcpBackend() const { return channel().running(); }
  void CreateShmBackend();
  bool HasShmBackend() const { return Created(kShmSlot); }
  // Throws NotSupportedError where CUDA or a device is missing.
  void CreateP2pBackend(const P2pBackendConfig& config);
  // rdma::RdmaBackend::Create(config): NotSupportedError where RDMA cannot run (a test
  // build may substitute its double there).
  void CreateRdmaBackend(const rdma::RdmaBackendConfig& config);

  // The backend a transfer between these memory locations and `remote`'s region uses,
  // and why (for SHM: which copy, mapped memcpy or CMA); connects (and probes CMA, asks
  // for the region's mapping) if no transfer did yet. Throws NotFoundError for an
  // unregistered engine.
  BackendChoice BackendFor(MemoryLocationType local_loc, const RemoteRegion& remote);

  MemoryRegion RegisterMemory(uintptr_t addr, uint64_t size, int device_id, MemoryLocationType loc);
  void DeregisterMemory(uint64_t id);
  // Copy of the region, or throws NotFoundError.
  MemoryRegion LocalRegion(uint64_t id) const { return memory_.Get(id); }

  // `desc.secret`: the remote EngineDesc's (without it the remote refuses our connections).
  void RegisterRemoteEngine(const PeerDesc& desc);
  void DeregisterRemoteEngine(const std::string& key);
  bool HasRemoteEngine(const std::string& key) const { return peers_.Find(key) != nullptr; }

  uint64_t AllocateTransferUid() { return next_uid_.fetch_add(1, std::memory_order_relaxed); }

  std::shared_ptr<TransferState> Transfer(Op op, uint64_t local_mem, const RemoteRegion& remote,
                                          const TransferSpan* spans, size_t n, uint64_t uid);
  // Status of a transfer `remote_key` made into this engine with `uid`, once all its
  // parts' data is in place (or failed); removed when returned. nullptr if not (yet).
  std::shared_ptr<TransferState> PopInboundTransferStatus(const std::string& remote_key,
                                                          uint64_t uid);
  std::shared_ptr<Session> CreateSession(uint64_t local_mem, const RemoteRegion& remote);

  // Inbound statuses (announcements drained first).
  InboundStatuses::Stats inbound_stats();

  // The transfer path shared by engine calls and sessions; peer may be null.
  std::shared_ptr<TransferState> Submit(Op op, const MemoryRegion& local,
                                        const std::shared_ptr<Peer>& peer,
                                        const RemoteRegion& remote, const TransferSpan* spans,
                                        size_t n, uint64_t uid);

  // For the test hooks.
  Transports& transports() { return *transports_; }

 private:
  // The transport the rule names for the pair, decided once per (peer, pair, override).
  Transport& Route(const Peer& peer, MemoryLocationType local_loc,
                   MemoryLocationType remote_loc) const;
  PeerConnections* Connected(const std::shared_ptr<Peer>& peer, std::string* error);
  void Shutdown();

  std::string host_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  // Moves when a backend is created: routes decided before are decided again.
  std::atomic<uint32_t> backends_epoch_{0};
  std::atomic<uint64_t> next_uid_{1};
  // Last: destroyed (completion threads joined, finishing every copy) before the ledger
  // and connections their callbacks use; Shutdown shuts them down first.
  std::unique_ptr<Transports> transports_;
};

}  // namespace mori::io
