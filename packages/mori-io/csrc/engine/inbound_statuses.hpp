// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "engine/transfer_state.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

// One part a target received (write) or served (read), accounted per read pass.
struct InboundPart {
  uint64_t uid;
  uint32_t num_parts;
  wire::WireStatus status;
  uint64_t mem_id;
  uint64_t offset;
  uint64_t length;
};

// The statuses of transfers other engines made into this one, for
// pop_inbound_transfer_status: counted per (initiator key, uid) until every part is in,
// bounded by `max_held` (the oldest dropped first).
class InboundStatuses {
 public:
  explicit InboundStatuses(std::string engine_key) : engine_key_(std::move(engine_key)) {}

  // enable_notification and max_inbound_statuses of the TCP config (set before use).
  void Configure(bool enabled, uint64_t max_held) {
    enabled_ = enabled;
    max_held_ = max_held;
  }
  // Transfers announced with only the low bits of their uid (RDMA's immediate data) are
  // found under those bits too.
  void AlsoMatchUidBits(uint64_t mask) { uid_alias_mask_ = mask; }

  // Accounts parts of one read pass under one lock (runs of one uid: one lookup).
  void Record(const std::string& remote_key, const InboundPart* parts, size_t n);
  // The status once all parts are in (or one failed), removed; nullptr if not (yet).
  std::shared_ptr<TransferState> Pop(const std::string& remote_key, uint64_t uid);
  size_t held();
  uint64_t evicted();

 private:
  struct Entry {
    uint64_t seq = 0;  // insertion number, for evicting the oldest
    uint32_t seen = 0;
    uint32_t total = 0;
    bool failed = false;
    std::string message;
  };
  // Entries in insertion order (key, uid, seq); an item whose entry was popped or
  // replaced is stale and skipped. Compacted when stale items dominate.
  struct Order {
    // Shared with every other item of that initiator (keys_): a key is up to 4 KiB, and
    // a copy per held status made 65,536 statuses of one long key cost 256 MiB.
    std::shared_ptr<const std::string> key;
    uint64_t uid;
    uint64_t seq;
  };
  bool Live(const Order& o) const;
  void EvictLocked(size_t cap);  // with mu_ held

  std::string engine_key_;
  bool enabled_ = true;
  uint64_t max_held_ = 1 << 16;
  uint64_t uid_alias_mask_ = 0;
  std::mutex mu_;
  std::unordered_map<std::string, std::unordered_map<uint64_t, Entry>> by_key_;
  std::deque<Order> order_;
  std::unordered_map<std::string, std::shared_ptr<const std::string>> keys_;
  size_t count_ = 0;
  uint64_t seq_ = 0;
  uint64_t evicted_ = 0;
};

}  // namespace mori::io
