// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/submission_ledger.hpp"

namespace mori::io {

SubmissionLedger::SubmissionLedger(size_t capacity, bool use_map) : use_map_(use_map) {
  size_t cap = 2;
  while (cap < capacity) cap <<= 1;
  capacity_ = cap;
  mask_ = cap - 1;
  slots_.reset(new Slot[cap]);
  for (size_t i = 0; i < cap; ++i) slots_[i].tag.store(kEmptyTag, std::memory_order_relaxed);
}

SubmissionLedger::~SubmissionLedger() = default;

uint64_t SubmissionLedger::Admit() noexcept {
  if (use_map_) {
    std::lock_guard<std::mutex> lock(map_mu_);
    if (map_.size() >= admission_limit()) return kNoRecord;
    uint64_t id = head_.fetch_add(1, std::memory_order_relaxed);
    map_.emplace(id, std::make_unique<TransferRecord>());
    live_.fetch_add(1, std::memory_order_relaxed);
    return id;
  }
  uint64_t head = head_.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t tail = tail_.load(std::memory_order_acquire);
    // A stale tail only makes admission more conservative. A stale head can be behind
    // the tail (records admitted and released since it was read): the difference is
    // then negative, not a full window, and the CAS below fails and reloads it.
    if (static_cast<int64_t>(head - tail) >= static_cast<int64_t>(admission_limit())) {
      return kNoRecord;
    }
    if (head_.compare_exchange_weak(head, head + 1, std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
      break;
    }
  }
  Slot& slot = slots_[head & mask_];
  // The slot's previous id (head - capacity) is below the tail, so it was released
  // and nobody looks it up any more.
  slot.record.parts_left.store(0, std::memory_order_relaxed);
  slot.record.error_code.store(0, std::memory_order_relaxed);
  slot.record.error_message.clear();
  slot.tag.store(2 * head + 1, std::memory_order_release);
  live_.fetch_add(1, std::memory_order_relaxed);
  return head;
}

TransferRecord* SubmissionLedger::Lookup(uint64_t record_id) noexcept {
  if (use_map_) {
    std::lock_guard<std::mutex> lock(map_mu_);
    auto it = map_.find(record_id);
    return it == map_.end() ? nullptr : it->second.get();
  }
  Slot& slot = slots_[record_id & mask_];
  if (slot.tag.load(std::memory_order_acquire) != 2 * record_id + 1) return nullptr;
  return &slot.record;
}

bool SubmissionLedger::Release(uint64_t record_id) noexcept {
  if (use_map_) {
    std::unique_ptr<TransferRecord> dead;
    std::lock_guard<std::mutex> lock(map_mu_);
    auto it = map_.find(record_id);
    if (it == map_.end()) return false;
    dead = std::move(it->second);
    map_.erase(it);
    live_.fetch_sub(1, std::memory_order_relaxed);
    tail_.store(head_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return true;
  }
  Slot& slot = slots_[record_id & mask_];
  // Only the thread that completed a record's last part releases it, so the state can
  // be dropped before the tag says released.
  if (slot.tag.load(std::memory_order_acquire) != 2 * record_id + 1) return false;
  slot.record.state.reset();
  // seq_cst with AdvanceTail's loads: of two releasers of neighbouring ids, at least
  // one sees the other's release, so the tail never stalls behind a released id.
  slot.tag.store(2 * record_id, std::memory_order_seq_cst);
  live_.fetch_sub(1, std::memory_order_relaxed);
  AdvanceTail();
  return true;
}

void SubmissionLedger::AdvanceTail() noexcept {
  // Several releasers may race here; the CAS lets exactly one move the tail past each
  // released id, and ids are never reused, so there is no ABA.
  uint64_t tail = tail_.load(std::memory_order_seq_cst);
  while (tail != head_.load(std::memory_order_seq_cst) &&
         slots_[tail & mask_].tag.load(std::memory_order_seq_cst) == 2 * tail) {
    if (tail_.compare_exchange_weak(tail, tail + 1, std::memory_order_seq_cst)) {
      ++tail;
    }
  }
}

size_t SubmissionLedger::window() const noexcept {
  if (use_map_) return live();
  return static_cast<size_t>(head_.load(std::memory_order_acquire) -
                             tail_.load(std::memory_order_acquire));
}

}  // namespace mori::io
