// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ledger/transfer_state.hpp"

namespace mori::io {

struct RegionUse;

// What the engine keeps about one submitted transfer until its last part completes.
struct TransferRecord {
  std::shared_ptr<TransferState> state;
  // Parts not yet completed; set before any part is sent, so it cannot reach zero
  // early. The thread that brings it to zero finishes the state and releases the record.
  std::atomic<uint32_t> parts_left{0};
  // First failure (a StatusDetail, 0 = none) and its message, written by the part that
  // set it before its decrement of parts_left, so the last part reads them.
  std::atomic<uint32_t> error_code{0};
  std::string error_message;
  // The local region's use count, entered at submission and left when the last part
  // completes. Not owned: the registry keeps the region while the count is nonzero.
  struct RegionUse* local_use = nullptr;
};

// The records of in-flight transfers, by record id, under one mutex. Ids are handed out
// in increasing order and never reused; records may be released in any order. A record
// is allocated at admission and stays at one address until released, so the parts of a
// transfer use the pointer Lookup returned without the lock.
//
// Admission control bounds the live records by the admission limit, so a stream of
// transfers nobody waits for fails fast instead of growing without bound. (A lock-free
// power-of-two ring indexed by id measured no faster end to end: BENCHMARKS.md,
// ablation.)
class SubmissionLedger {
 public:
  static constexpr uint64_t kNoRecord = ~uint64_t{0};

  // `admission_limit`: live records at most, at least 1.
  explicit SubmissionLedger(size_t admission_limit);
  ~SubmissionLedger();
  SubmissionLedger(const SubmissionLedger&) = delete;
  SubmissionLedger& operator=(const SubmissionLedger&) = delete;

  size_t admission_limit() const noexcept { return limit_; }

  // A new record id, or kNoRecord when the live records are at the admission limit.
  uint64_t Admit();
  // The live record of `record_id`, or nullptr if that id is not live.
  TransferRecord* Lookup(uint64_t record_id) noexcept;
  // Ends `record_id`'s life; its record (and state pointer) is dropped. Releasing an id
  // that is not live is a no-op that returns false.
  bool Release(uint64_t record_id) noexcept;

  size_t live() const noexcept { return live_.load(std::memory_order_relaxed); }
  uint64_t next_id() const noexcept { return next_id_.load(std::memory_order_relaxed); }

 private:
  size_t limit_;
  std::atomic<uint64_t> next_id_{0};
  std::atomic<size_t> live_{0};
  std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<TransferRecord>> records_;
};

}  // namespace mori::io
