// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ledger/transfer_state.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

// One part a target received (write) or served (read).
struct InboundPart {
  uint64_t uid;
  uint32_t num_parts;
  wire::WireStatus status;
  uint64_t mem_id;
  uint64_t offset;
  uint64_t length;
};

// The statuses of transfers other engines made into this one, for
// pop_inbound_transfer_status: counted per (initiator key, uid) until every part is in.
// Bounded by `max_held` statuses and by `max_bytes` of what they hold (each initiator's
// key once, plus a fixed cost per status): past either bound the oldest is dropped and
// counted. A part refused because it named no region this engine holds under that
// capability (or a backend it lacks) starts no status, it is only counted: such a
// request is about nothing this engine's application waits for, and recording it let a
// peer holding only the EngineDesc grow the table. Such a refusal of a transfer whose
// earlier parts were recorded (its region withdrawn meanwhile) is recorded, as its
// failure.
class InboundStatuses {
 public:
  // The least max_bytes accepted: one status under the longest key fits with room.
  static constexpr uint64_t kMinBytes = 64 << 10;

  explicit InboundStatuses(std::string engine_key) : engine_key_(std::move(engine_key)) {}

  // enable_notification, max_inbound_statuses and max_inbound_status_bytes of the TCP
  // config (set before use).
  void Configure(bool enabled, uint64_t max_held, uint64_t max_bytes) {
    enabled_ = enabled;
    max_held_ = max_held;
    max_bytes_ = max_bytes;
  }
  // Transfers announced with only the low bits of their uid (RDMA's immediate data) are
  // found under those bits too.
  void AlsoMatchUidBits(uint64_t mask) { uid_alias_mask_ = mask; }

  // Accounts parts under one lock (a reactor records one part per call; the notice
  // ring's drain several; runs of one uid: one lookup).
  void Record(const std::string& remote_key, const InboundPart* parts, size_t n);
  // The status once all parts are in (or one failed), removed; nullptr if not (yet).
  std::shared_ptr<TransferState> Pop(const std::string& remote_key, uint64_t uid);

  struct Stats {
    size_t held = 0;          // statuses held
    size_t initiators = 0;    // keys they are held under
    uint64_t bytes = 0;       // what the bound counts (estimate)
    uint64_t evicted = 0;     // dropped by either bound, oldest first
    uint64_t unrecorded = 0;  // refused parts not recorded (see above)
  };
  Stats stats();

  // Whether a part with this status is recorded: the target found the region it named
  // under its capability, or the initiator announced (or reported the failure of) a
  // write it was granted.
  static bool Recorded(wire::WireStatus s);

 private:
  struct Entry {
    uint64_t seq = 0;  // insertion number, for evicting the oldest
    uint32_t seen = 0;
    uint32_t total = 0;
    // The first failed part (kOk: none); the message is made when popped.
    wire::WireStatus failure = wire::WireStatus::kOk;
    uint64_t mem_id = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  struct Initiator {
    uint64_t id = 0;  // never reused: order items of an erased initiator go stale
    std::unordered_map<uint64_t, Entry> by_uid;
  };
  using ByKey = std::unordered_map<std::string, Initiator>;
  // Statuses in insertion order; an item whose entry was popped or replaced, or whose
  // initiator was erased, is stale and skipped. Compacted when stale items dominate.
  struct Order {
    uint64_t initiator;
    uint64_t uid;
    uint64_t seq;
  };
  // What the byte bound charges: a status (its entry, hash node and up to two order
  // items), and an initiator (its node and bucket) beside its key's length.
  static constexpr uint64_t kStatusBytes = sizeof(Entry) + 2 * sizeof(Order) + 48;
  static constexpr uint64_t kInitiatorBytes = sizeof(ByKey::value_type) + 64;

  bool Live(const Order& o) const;
  void EvictLocked();                                                      // with mu_ held
  bool HasEntryLocked(const std::string& remote_key, uint64_t uid) const;  // with mu_ held
  void EraseLocked(ByKey::iterator it,  // one status of initiator `it`; the initiator too
                   std::unordered_map<uint64_t, Entry>::iterator e);  // once it has none

  std::string engine_key_;
  bool enabled_ = true;
  uint64_t max_held_ = 1 << 16;
  uint64_t max_bytes_ = 32 << 20;
  uint64_t uid_alias_mask_ = 0;
  std::mutex mu_;
  ByKey by_key_;                                            // each key held once
  std::unordered_map<uint64_t, ByKey::value_type*> by_id_;  // nodes of by_key_ (stable)
  std::deque<Order> order_;
  size_t count_ = 0;
  uint64_t bytes_ = 0;
  uint64_t seq_ = 0;
  uint64_t next_initiator_ = 1;
  uint64_t evicted_ = 0;
  uint64_t unrecorded_ = 0;
};

}  // namespace mori::io
