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

#include "registry/backend_select.hpp"
#include "registry/inbound_statuses.hpp"
#include "registry/memory_registry.hpp"
#include "registry/peer_registry.hpp"
#include "grants/region_grants.hpp"
#include "ledger/submission_ledger.hpp"
#include "ledger/transfer_state.hpp"
#include "host/transport.hpp"
#include "p2p/p2p_backend.hpp"
#include "rdma/rdma_backend.hpp"
#include "control/control_channel.hpp"
#include "control/tcp_config.hpp"

namespace mori::io {

class ShmTransport;
class P2pTransport;
class RdmaTransport;
class TcpTransport;

// Ablation switches, read once per engine from the environment.
struct HotPathOptions {
  bool shm_map = true;                // MORI_IO_SHM_MAP=0: SHM always copies with CMA, even for
                                      // regions in the target's shared host memory
  bool notice_ring = true;            // MORI_IO_NOTICE_RING=0: same-host write announcements
                                      // go over TCP instead of a shared-memory ring
  uint32_t notice_ring_slots = 4096;  // MORI_IO_NOTICE_RING_SLOTS: slots of the rings this
                                      // engine grants (a power of two; 0: grants none)
  uint32_t max_notice_rings = 256;    // MORI_IO_MAX_NOTICE_RINGS: rings this engine grants at
                                      // most at a time (beyond: announcements over TCP)
  uint32_t max_grant_holders = 1024;  // MORI_IO_MAX_GRANT_HOLDERS: initiators holding region
                                      // grants (CMA, map, P2P) at a time (beyond: refused)
  uint32_t max_grants = 1 << 16;      // MORI_IO_MAX_GRANTS: (initiator, region) grants held
                                      // at a time (beyond: refused)
  bool cma_cache = true;              // MORI_IO_CMA_CACHE=0: every CMA part asks the target
                                      // for a grant (two round trips per write)
  bool liveness_word = true;          // MORI_IO_SHM_LIVENESS_WORD=0: same-host copies poll the
                                      // target's pidfd (a syscall) instead of its liveness word
  bool tcp_waiter_reads = true;       // MORI_IO_TCP_WAITER_READS=0: the thread waiting for a
                                      // single TCP write never reads its answer itself (the
                                      // reactor reads it and wakes the waiter)
  uint32_t tcp_busy_poll_us = 20;     // MORI_IO_TCP_BUSY_POLL_US: after a read pass a reactor
                                      // polls its sockets without sleeping this long (0: off),
                                      // so the next request of a burst finds it awake; at most
                                      // this much CPU per pass (BENCHMARKS.md)
  // MORI_IO_SHM_SPLIT_BYTES: a same-host copy (mapped or cached CMA) of at least this many
  // bytes is split into shares of at least half that, copied at once by the submitting
  // thread and the reactors (one share per reactor at most, no more shares than CPUs);
  // 0: one thread always.
  uint64_t shm_split_bytes = 2 << 20;
  static HotPathOptions FromEnv();
};

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

// The transfer engine: registries of local regions and remote engines, the inbound
// statuses, the submission ledger, and a router over the transports (tcp/, shm/, p2p/,
// rdma/), each of which serves its own messages on the TCP control channel. A transfer
// is validated here, routed once per (peer, local location, remote location) and
// submitted to the transport the route names.
class IoEngine {
 public:
  IoEngine(std::string key, std::string host, uint16_t port);
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  const std::string& key() const { return key_; }
  // The secret a connecting initiator must present (wire::kSecretBytes, in the
  // EngineDesc): getrandom bytes drawn at construction.
  const std::string& secret() const { return secret_; }
  // Whether a hello's secret is ours (constant time).
  bool SecretMatches(const char* data, size_t n) const;
  // Whether a hello that presented our secret may speak for initiator `key` with
  // `credential` (secret.hpp InitiatorCredential): if `key` is registered here, the
  // credential must be the one its EngineDesc's secret gives; otherwise it must match the
  // credential of the key's connections still open here (the first one binds it).
  bool InitiatorAccepted(const std::string& key, const std::string& credential,
                         std::string* why_not);
  // Inbound connections closed because their hello lacked our secret.
  uint64_t hellos_refused() const { return hellos_refused_.load(std::memory_order_relaxed); }
  void CountRefusedHello() { hellos_refused_.fetch_add(1, std::memory_order_relaxed); }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  const std::string& host_id() const { return host_id_; }
  const HotPathOptions& options() const { return options_; }

  // The control channel's reactors start with the TCP backend; SHM, P2P and RDMA start
  // them with the default config when TCP was not created first (their messages ride
  // on it).
  void CreateTcpBackend(const TcpBackendConfig& config);
  bool HasTcpBackend() const { return channel_.running(); }
  const TcpBackendConfig& tcp_config() const { return tcp_config_; }
  void CreateShmBackend();
  bool HasShmBackend() const;
  // Throws NotSupportedError where CUDA or a device is missing.
  void CreateP2pBackend(const P2pBackendConfig& config);
  // rdma::RdmaBackend::Create(config): NotSupportedError where RDMA cannot run (a test
  // build may substitute its double there).
  void CreateRdmaBackend(const rdma::RdmaBackendConfig& config);

  void SetBackendOverride(BackendOverride o) { override_.store(o, std::memory_order_relaxed); }
  BackendOverride backend_override() const { return override_.load(std::memory_order_relaxed); }
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

  SubmissionLedger& ledger() { return *ledger_; }
  // Inbound statuses (announcements drained first).
  InboundStatuses::Stats inbound_stats();
  // The target closed `old`'s connections as idle: a fresh peer of the same EngineDesc
  // replaces it (unless it was replaced already), so the next transfer connects again.
  void ReconnectLater(const std::shared_ptr<Peer>& old, const std::string& why);
  // Whether an idle connection of initiator `key` may be closed: it holds nothing of
  // this engine (grants, rings, queue pairs) that its connections keep valid.
  bool InitiatorIdleClosable(const std::string& key);
  uint64_t idle_closed() const { return idle_closed_.load(std::memory_order_relaxed); }
  // An inbound connection of initiator `key` that had passed its hello closed.
  void InboundClosed(const std::string& key);
  void CountIdleClosed() { idle_closed_.fetch_add(1, std::memory_order_relaxed); }
  // Write announcements refused: the initiator held no grant of the region named.
  uint64_t announcements_refused() const {
    return announcements_refused_.load(std::memory_order_relaxed);
  }
  void CountRefusedAnnouncements(size_t n) {
    announcements_refused_.fetch_add(n, std::memory_order_relaxed);
  }
  // Answers of TCP writes read by the thread waiting for them (tcp/answer_reader.hpp).
  uint64_t answers_read_by_waiters() const {
    return answers_read_by_waiters_.load(std::memory_order_relaxed);
  }
  void CountAnswerReadByWaiter() {
    answers_read_by_waiters_.fetch_add(1, std::memory_order_relaxed);
  }
  std::shared_ptr<Peer> FindPeer(const std::string& key) const { return peers_.Find(key); }

  // The transfer path shared by engine calls and sessions; peer may be null.
  std::shared_ptr<TransferState> Submit(Op op, const MemoryRegion& local,
                                        const std::shared_ptr<Peer>& peer,
                                        const RemoteRegion& remote, const TransferSpan* spans,
                                        size_t n, uint64_t uid);

  // For the transports.
  MemoryRegistry& memory() { return memory_; }
  InboundStatuses& inbound() { return inbound_; }
  ControlChannel& channel() { return channel_; }
  RegionGrants& grants() { return grants_; }
  TcpTransport& tcp() { return *tcp_; }
  ShmTransport& shm() { return *shm_; }
  P2pTransport& p2p() { return *p2p_; }
  // What the route of (peer, local_loc, remote_loc) depends on, for ChooseBackend.
  BackendChoiceInput ChoiceInput(const Peer& peer, MemoryLocationType local_loc,
                                 MemoryLocationType remote_loc) const;
  void ForEachTransport(const std::function<void(Transport&)>& fn);
  void CompletePart(uint64_t record_id, StatusDetail code, const std::string& message);
  // Enters the local region and admits a ledger record of `parts` parts: on success
  // *rid names it and the state is in progress; otherwise *rid is kNoRecord and the
  // returned state is already finished with the reason.
  std::shared_ptr<TransferState> BeginTransfer(const MemoryRegion& local, uint32_t parts,
                                               bool long_spin, uint64_t* rid);
  // Enters the local region for a transfer finished on the submitting thread (no ledger
  // record; the caller leaves the region before making its status): nullptr, or a
  // finished ERR_NOT_FOUND when the region was deregistered.
  std::shared_ptr<TransferState> EnterLocal(const MemoryRegion& local);
  // A finished ERR_OUT_OF_BOUNDS naming the first span past `limit` bytes of the target's
  // region, or nullptr when every span fits.
  static std::shared_ptr<TransferState> RemoteBoundsError(const TransferRequest& req,
                                                          uint64_t limit);
  static std::shared_ptr<TransferState> Finished(StatusDetail code, std::string message);

 private:
  // The transport the rule names for the pair, decided once per (peer, pair, override).
  Transport& Route(const Peer& peer, MemoryLocationType local_loc,
                   MemoryLocationType remote_loc) const;
  PeerConnections* Connected(const std::shared_ptr<Peer>& peer, std::string* error);
  void StartChannel(const TcpBackendConfig& config);
  void Shutdown();

  std::string key_;
  std::string secret_;
  std::atomic<uint64_t> hellos_refused_{0};
  std::atomic<uint64_t> idle_closed_{0};
  std::atomic<uint64_t> announcements_refused_{0};
  std::atomic<uint64_t> answers_read_by_waiters_{0};
  std::string host_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  HotPathOptions options_;
  TcpBackendConfig tcp_config_;
  std::string host_id_;
  std::atomic<BackendOverride> override_{BackendOverride::kAuto};
  // Moves when a backend is created: routes decided before are decided again.
  std::atomic<uint32_t> backends_epoch_{0};

  MemoryRegistry memory_;
  PeerRegistry peers_;
  InboundStatuses inbound_;
  std::atomic<uint64_t> next_uid_{1};
  std::unique_ptr<SubmissionLedger> ledger_;
  ControlChannel channel_;
  RegionGrants grants_;
  // Last: destroyed (completion threads joined, finishing every copy) before the ledger
  // and connections their callbacks use; Shutdown shuts them down first.
  std::unique_ptr<TcpTransport> tcp_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<P2pTransport> p2p_;
  std::unique_ptr<RdmaTransport> rdma_;
  std::array<Transport*, kTransportSlots> by_slot_{};
};

}  // namespace mori::io
