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

#include "engine/transfer_state.hpp"

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

// The records of in-flight transfers: a power-of-two ring indexed by
// `record_id & mask`. Ids are handed out in increasing order; records may be released
// in any order, and the tail (the oldest live id) advances over released slots.
//
// Admission control keeps the window [tail, head) of ids strictly below capacity, so
// the slot of a new id never aliases a live record and head == tail means empty. No
// allocation after construction; Admit is lock-free (one CAS), Release is lock-free.
//
// MORI_IO_LEDGER=map (ablation) replaces the ring by a mutex-guarded hash map that
// allocates a record per transfer: the layout MORI profiled away.
class SubmissionLedger {
 public:
  static constexpr uint64_t kNoRecord = ~uint64_t{0};

  // capacity is rounded up to a power of two, at least 2.
  explicit SubmissionLedger(size_t capacity, bool use_map = false);
  ~SubmissionLedger();
  SubmissionLedger(const SubmissionLedger&) = delete;
  SubmissionLedger& operator=(const SubmissionLedger&) = delete;

  size_t capacity() const noexcept { return capacity_; }
  // The most records that can be live at once: capacity - 1.
  size_t admission_limit() const noexcept { return capacity_ - 1; }
  bool uses_map() const noexcept { return use_map_; }

  // A new record id, or kNoRecord when admitting it would make the window reach
  // capacity (or, with a map, the live count reach the admission limit).
  uint64_t Admit() noexcept;
  // The live record of `record_id`, or nullptr if that id is not live.
  TransferRecord* Lookup(uint64_t record_id) noexcept;
  // Ends `record_id`'s life; its state pointer is dropped. Releasing an id that is not
  // live is a no-op that returns false.
  bool Release(uint64_t record_id) noexcept;

  // Ids admitted and not yet passed by the tail (live plus released-but-not-retired).
  size_t window() const noexcept;
  size_t live() const noexcept { return live_.load(std::memory_order_relaxed); }
  uint64_t next_id() const noexcept { return head_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    // 2*id+1 while id is live, 2*id once released, kEmptyTag before first use.
    std::atomic<uint64_t> tag;
    TransferRecord record;
  };
  static constexpr uint64_t kEmptyTag = ~uint64_t{0};
  void AdvanceTail() noexcept;

  size_t capacity_;
  uint64_t mask_;
  bool use_map_;
  std::unique_ptr<Slot[]> slots_;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) std::atomic<size_t> live_{0};

  std::mutex map_mu_;
  std::unordered_map<uint64_t, std::unique_ptr<TransferRecord>> map_;
};

}  // namespace mori::io
