// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "submission_ledger.hpp"
#include "transfer_state.hpp"
#include "wire_protocol.hpp"

namespace mori::io {

enum class MemoryLocationType : uint32_t { Unknown = 0, CPU = 1, GPU = 2 };

struct TcpBackendConfig {
  int num_worker_threads = 1;  // epoll reactors
  int qp_per_transfer = 2;     // TCP connections per remote engine
  bool enable_chunking = true;
  uint64_t chunk_size = 1 << 20;  // bytes per part when chunking
  int peer_timeout_ms = 5000;     // connect timeout and TCP_USER_TIMEOUT
  int sock_buf_bytes = 4 << 20;   // SO_SNDBUF/SO_RCVBUF; 0 leaves the kernel's
};

struct MemoryRegion {
  uint64_t id;
  uintptr_t addr;
  uint64_t size;
  int device_id;
  MemoryLocationType loc;
};

// Ablation switches, read once per engine from the environment.
struct HotPathOptions {
  bool lockfree_endpoint = true;  // MORI_IO_LOCKFREE_ENDPOINT=0: connections under a mutex
  bool epoch_snapshot = true;     // MORI_IO_EPOCH_SNAPSHOT=0: sessions look the peer up per op
  bool ledger_ring = true;        // MORI_IO_LEDGER=map: hash map records
  bool target_batching = true;    // MORI_IO_TARGET_BATCHING=0: the target looks the region
                                  // up and records inbound parts under a lock per part
  static HotPathOptions FromEnv();
};

class Worker;
struct Conn;

// The connections to one remote engine. Built once, then published with a release
// store; submitters read it with an acquire load and take no lock.
struct PeerConnections {
  std::vector<std::shared_ptr<Conn>> conns;
};

struct Peer {
  std::string key;
  std::string host;
  uint16_t port = 0;
  uint64_t generation = 0;  // registration number: a re-registered peer is a new Peer
  std::atomic<PeerConnections*> published{nullptr};
  std::unique_ptr<PeerConnections> owned;
  std::mutex connect_mu;  // serializes connecting; also guards `owned` when the
                          // lock-free endpoint read is switched off
  std::atomic<bool> failed{false};
  std::string fail_reason;  // written once before `failed` is set
  std::mutex fail_mu;
  std::atomic<uint32_t> next_conn{0};

  void MarkFailed(const std::string& reason);
  std::string FailReason();
};

enum class Op { kRead, kWrite };

struct TransferSpan {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t size;
};

class IoEngine;

// A bound (local memory, remote memory) pair; caches the peer and revalidates it only
// when the engine's peer epoch moves.
class Session {
 public:
  Session(IoEngine* engine, MemoryRegion local, std::string remote_key, uint64_t remote_mem,
          uint64_t remote_size);
  std::shared_ptr<TransferState> Transfer(Op op, const TransferSpan* spans, size_t n, uint64_t uid);
  bool Alive();

 private:
  std::shared_ptr<Peer> CurrentPeer();
  IoEngine* engine_;
  MemoryRegion local_;
  std::string remote_key_;
  uint64_t remote_mem_;
  uint64_t remote_size_;
  uint64_t epoch_ = ~uint64_t{0};
  std::shared_ptr<Peer> peer_;
  std::mutex mu_;
};

// One part a target received (write) or served (read), accounted per read pass.
struct InboundPart {
  uint64_t uid;
  uint32_t num_parts;
  wire::WireStatus status;
  uint64_t mem_id;
  uint64_t offset;
  uint64_t length;
};

struct InboundEntry {
  uint32_t seen = 0;
  uint32_t total = 0;
  bool failed = false;
  std::string message;
};

class IoEngine {
 public:
  IoEngine(std::string key, std::string host, uint16_t port);
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  const std::string& key() const { return key_; }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  const HotPathOptions& options() const { return options_; }

  void CreateTcpBackend(const TcpBackendConfig& config);
  bool HasTcpBackend() const { return !workers_.empty(); }
  const TcpBackendConfig& tcp_config() const { return tcp_config_; }

  MemoryRegion RegisterMemory(uintptr_t addr, uint64_t size, int device_id, MemoryLocationType loc);
  void DeregisterMemory(uint64_t id);
  // Copy of the region, or throws NotFoundError.
  MemoryRegion LocalRegion(uint64_t id) const;

  void RegisterRemoteEngine(const std::string& key, const std::string& host, uint16_t port);
  void DeregisterRemoteEngine(const std::string& key);
  bool HasRemoteEngine(const std::string& key) const;

  uint64_t AllocateTransferUid() { return next_uid_.fetch_add(1, std::memory_order_relaxed); }

  std::shared_ptr<TransferState> Transfer(Op op, uint64_t local_mem, const std::string& remote_key,
                                          uint64_t remote_mem, uint64_t remote_size,
                                          const TransferSpan* spans, size_t n, uint64_t uid);
  // Status of a transfer `remote_key` made into this engine with `uid`, once all its
  // parts' data is in place (or failed); removed when returned. nullptr if not (yet).
  std::shared_ptr<TransferState> PopInboundTransferStatus(const std::string& remote_key,
                                                          uint64_t uid);

  std::shared_ptr<Session> CreateSession(uint64_t local_mem, const std::string& remote_key,
                                         uint64_t remote_mem, uint64_t remote_size);

  SubmissionLedger& ledger() { return *ledger_; }
  uint64_t peer_epoch() const { return peer_epoch_.load(std::memory_order_acquire); }
  std::shared_ptr<Peer> FindPeer(const std::string& key) const;

  // Used by the reactors.
  struct Lookup {
    wire::WireStatus status;
    char* base;
  };
  Lookup CheckTarget(uint64_t mem_id, uint64_t offset, uint64_t length) const;
  // Copies region `id` into *out; false if it is not registered.
  bool FindRegion(uint64_t id, MemoryRegion* out) const;
  // Moves on every register/deregister: a cached region is valid while it stays put.
  uint64_t memory_epoch() const { return memory_epoch_.load(std::memory_order_acquire); }
  // Accounts parts of one read pass under one lock (runs of one uid: one lookup).
  void RecordInboundParts(const std::string& remote_key, const InboundPart* parts, size_t n);
  void CompletePart(uint64_t record_id, StatusCode code, const std::string& message);
  void AssignInbound(std::shared_ptr<Conn> conn);

  // The transfer path shared by engine calls and sessions; peer may be null.
  std::shared_ptr<TransferState> Submit(Op op, const MemoryRegion& local,
                                        const std::shared_ptr<Peer>& peer,
                                        const std::string& remote_key, uint64_t remote_mem,
                                        uint64_t remote_size, const TransferSpan* spans, size_t n,
                                        uint64_t uid);

 private:
  PeerConnections* Connect(const std::shared_ptr<Peer>& peer, std::string* error);
  void Shutdown();

  std::string key_;
  std::string host_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  HotPathOptions options_;
  TcpBackendConfig tcp_config_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint32_t> next_worker_{0};

  mutable std::shared_mutex mem_mu_;
  std::unordered_map<uint64_t, MemoryRegion> memory_;
  uint64_t next_mem_id_ = 1;
  std::atomic<uint64_t> memory_epoch_{0};

  mutable std::shared_mutex peer_mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::atomic<uint64_t> peer_epoch_{0};
  uint64_t next_peer_generation_ = 1;

  std::mutex inbound_mu_;
  std::unordered_map<std::string, std::unordered_map<uint64_t, InboundEntry>> inbound_;

  std::atomic<uint64_t> next_uid_{1};
  std::unique_ptr<SubmissionLedger> ledger_;
};

}  // namespace mori::io
