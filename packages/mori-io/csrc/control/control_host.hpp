// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "control/tcp_config.hpp"
#include "ledger/submission_ledger.hpp"
#include "ledger/transfer_state.hpp"
#include "registry/hot_path_options.hpp"
#include "registry/inbound_statuses.hpp"
#include "registry/memory_registry.hpp"
#include "registry/peer_registry.hpp"
#include "registry/transfer_request.hpp"

namespace mori::io {

// What the control channel (and every transport, through TransportHost) knows of the
// engine it serves: its key and secret, its options, the submission ledger, the
// registries of regions and peers, the inbound statuses and the transfer bookkeeping on
// them; all of it concrete, so a message or a part costs no virtual call. The few
// events the channel reports up (a hello to accept, a connection idle, lost or closed)
// are virtual: they happen per connection, not per part, and are answered above
// (host/transport_host.hpp), where the transports and grants are known.
class ControlHost {
 public:
  ControlHost(std::string key, HotPathOptions options, size_t ledger_limit);
  virtual ~ControlHost();
  ControlHost(const ControlHost&) = delete;
  ControlHost& operator=(const ControlHost&) = delete;

  const std::string& key() const { return key_; }
  // The secret a connecting initiator must present (wire::kSecretBytes, in the
  // EngineDesc): getrandom bytes drawn at construction.
  const std::string& secret() const { return secret_; }
  // Whether a hello's secret is ours (constant time).
  bool SecretMatches(const char* data, size_t n) const;
  const HotPathOptions& options() const { return options_; }
  // The control channel's configuration (the TCP backend's, or the default one SHM,
  // P2P and RDMA start the channel with).
  const TcpBackendConfig& tcp_config() const { return tcp_config_; }

  SubmissionLedger& ledger() { return *ledger_; }
  MemoryRegistry& memory() { return memory_; }
  PeerRegistry& peers() { return peers_; }
  InboundStatuses& inbound() { return inbound_; }
  std::shared_ptr<Peer> FindPeer(const std::string& key) const { return peers_.Find(key); }

  // One part of ledger record `record_id` ended with `code`; the last one finishes the
  // transfer (leaving its local region first).
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

  // Counters the engine reports.
  uint64_t hellos_refused() const { return hellos_refused_.load(std::memory_order_relaxed); }
  void CountRefusedHello() { hellos_refused_.fetch_add(1, std::memory_order_relaxed); }
  // Inbound connections dropped while still in their hello (max_pending_hellos).
  uint64_t hellos_dropped() const { return hellos_dropped_.load(std::memory_order_relaxed); }
  void CountDroppedHello() { hellos_dropped_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t idle_closed() const { return idle_closed_.load(std::memory_order_relaxed); }
  void CountIdleClosed() { idle_closed_.fetch_add(1, std::memory_order_relaxed); }
  // Write announcements refused: the initiator held no grant of the region named.
  uint64_t announcements_refused() const {
    return announcements_refused_.load(std::memory_order_relaxed);
  }
  void CountRefusedAnnouncements(size_t n) {
    announcements_refused_.fetch_add(n, std::memory_order_relaxed);
  }
  // Answers of TCP writes read by the thread waiting for them (control/answer_reader.hpp).
  uint64_t answers_read_by_waiters() const {
    return answers_read_by_waiters_.load(std::memory_order_relaxed);
  }
  void CountAnswerReadByWaiter() {
    answers_read_by_waiters_.fetch_add(1, std::memory_order_relaxed);
  }

  // Events of the control channel, answered above.
  // Whether a hello that presented our secret may speak for initiator `key` with
  // `credential` (secret.hpp InitiatorCredential).
  virtual bool InitiatorAccepted(const std::string& key, const std::string& credential,
                                 std::string* why_not) = 0;
  // The target closed `old`'s connections as idle: a fresh peer of the same EngineDesc
  // replaces it (unless it was replaced already), so the next transfer connects again.
  virtual void ReconnectLater(const std::shared_ptr<Peer>& old, const std::string& why) = 0;
  // Whether an idle connection of initiator `key` may be closed: it holds nothing of
  // this engine (grants, rings, queue pairs) that its connections keep valid.
  virtual bool InitiatorIdleClosable(const std::string& key) = 0;
  // An inbound connection of initiator `key` that had passed its hello closed.
  virtual void InboundClosed(const std::string& key) = 0;
  // A reactor's periodic scan of its connections ended.
  virtual void ConnectionsScanned() = 0;

 protected:
  std::string key_;
  std::string secret_;
  HotPathOptions options_;
  TcpBackendConfig tcp_config_;
  MemoryRegistry memory_;
  PeerRegistry peers_;
  InboundStatuses inbound_;
  std::unique_ptr<SubmissionLedger> ledger_;

 private:
  std::atomic<uint64_t> hellos_refused_{0};
  std::atomic<uint64_t> hellos_dropped_{0};
  std::atomic<uint64_t> idle_closed_{0};
  std::atomic<uint64_t> announcements_refused_{0};
  std::atomic<uint64_t> answers_read_by_waiters_{0};
};

}  // namespace mori::io
