// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "registry/backend_select.hpp"

namespace mori::io {

struct Conn;
struct ShmMapping;

// The transports an engine routes over, in the order of their state slots.
enum TransportSlot : size_t { kTcpSlot = 0, kShmSlot, kP2pSlot, kRdmaSlot, kTransportSlots };

// What a transport keeps per remote engine, under its own lock (Transport::NewPeerState).
struct PeerState {
  virtual ~PeerState() = default;
};

// The control connections to one remote engine. Built once under the peer's connect_mu
// and kept in `owned`; submitters read `owned` under that lock.
struct PeerConnections {
  std::vector<std::shared_ptr<Conn>> conns;
};

// What a remote EngineDesc says about its engine.
struct PeerDesc {
  std::string key;
  std::string host;
  uint16_t port = 0;
  std::string host_id;       // its host identity
  int pid = 0;               // its process id (same-host copies into/out of it)
  bool remote_shm = false;   // its EngineDesc lists SHM
  bool remote_p2p = false;   // ... P2P
  bool remote_rdma = false;  // ... RDMA
  std::string secret;        // presented in our hellos
};

// The ring a same-host target granted for this engine's write announcements
// (samehost/same_host.hpp). Decided once under `mu`: `ring` is set before `state` leaves
// 0 (release) and never changes after, so writers read both without the lock. 0: not
// asked yet, 1: mapped, -1: none (announcements over TCP).
struct PeerNoticeRing {
  std::mutex mu;
  std::shared_ptr<ShmMapping> ring;
  std::atomic<int> state{0};
};

struct Peer : PeerDesc {
  uint64_t generation = 0;  // registration number: a re-registered peer is a new Peer
  std::unique_ptr<PeerConnections> owned;  // guarded by connect_mu
  std::mutex connect_mu;                   // serializes connecting; guards `owned`
  // `owned` once connected, for readers that must not wait for a connect in progress
  // (shutting a replaced peer's connections down).
  std::atomic<PeerConnections*> published{nullptr};
  std::atomic<bool> failed{false};
  std::string fail_reason;  // written once before `failed` is set
  std::mutex fail_mu;
  std::atomic<uint32_t> next_conn{0};
  // The engine's route per (local location, remote location): 4 bits per pair (0
  // undecided, else the transport slot + 1), bits 48+ the override they were decided
  // under + 1 (a different override decides again).
  mutable std::atomic<uint64_t> routes{0};
  // Each transport's state of this peer (null where it keeps none), made at registration.
  std::array<std::unique_ptr<PeerState>, kTransportSlots> state;
  // Where SHM and P2P announce their writes into it.
  PeerNoticeRing notice;

  template <class T>
  T& StateOf(TransportSlot slot) const {
    return static_cast<T&>(*state[slot]);
  }
  // A connection for a message, round robin.
  std::shared_ptr<Conn> NextConn(const PeerConnections& pc) {
    return pc.conns[next_conn.fetch_add(1, std::memory_order_relaxed) % pc.conns.size()];
  }
  void MarkFailed(const std::string& reason);
  std::string FailReason();
};

// The remote engines registered with one engine, by key.
class PeerRegistry {
 public:
  // Replaces any peer of that key; returns the one replaced (or null).
  std::shared_ptr<Peer> Put(std::shared_ptr<Peer> peer);
  // Replaces `old` by `fresh` (same key) if `old` is still the registered one.
  bool Replace(const std::shared_ptr<Peer>& old, std::shared_ptr<Peer> fresh);
  // Removes and returns the peer of `key` (null if none).
  std::shared_ptr<Peer> Take(const std::string& key);
  std::shared_ptr<Peer> Find(const std::string& key) const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  uint64_t next_generation_ = 1;
};

}  // namespace mori::io
