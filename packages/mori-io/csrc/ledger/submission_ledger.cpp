// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "ledger/submission_ledger.hpp"

namespace mori::io {

SubmissionLedger::SubmissionLedger(size_t admission_limit)
    : limit_(admission_limit > 0 ? admission_limit : 1) {}

SubmissionLedger::~SubmissionLedger() = default;

uint64_t SubmissionLedger::Admit() {
  auto record = std::make_unique<TransferRecord>();  // allocated before the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (records_.size() >= limit_) return kNoRecord;
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  records_.emplace(id, std::move(record));
  live_.store(records_.size(), std::memory_order_relaxed);
  return id;
}

TransferRecord* SubmissionLedger::Lookup(uint64_t record_id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(record_id);
  return it == records_.end() ? nullptr : it->second.get();
}

bool SubmissionLedger::Release(uint64_t record_id) noexcept {
  std::unique_ptr<TransferRecord> dead;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(record_id);
  if (it == records_.end()) return false;
  dead = std::move(it->second);
  records_.erase(it);
  live_.store(records_.size(), std::memory_order_relaxed);
  return true;
}

}  // namespace mori::io
