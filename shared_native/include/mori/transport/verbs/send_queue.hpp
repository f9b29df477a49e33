// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Send-queue bookkeeping of one RC QP, without the QP: how many WRs occupy the queue,
// which signaled completions are still due (an RC QP completes its WRs in posting
// order), and what to fail when the QP breaks. Pure, so it is unit-tested.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "mori/transport/verbs/work_request_plan.hpp"

namespace mori::transport::verbs {

class MORI_API SendQueueTracker {
 public:
  // depth: the QP's max_send_wr (>= 1).
  explicit SendQueueTracker(uint32_t depth);

  uint32_t depth() const { return depth_; }
  uint32_t outstanding() const { return outstanding_; }
  size_t expected_completions() const { return expected_.size(); }
  bool Fits(size_t n) const { return n <= depth_ - outstanding_; }

  // Accounts a posted chain of `n` WRs of the transfer in `slot`. The chain must fit and
  // end with a signaled WR, whose retire counts must add up to n: otherwise some
  // queue slots would never be freed (InvalidArgumentError).
  void Posted(const PlannedWr* wrs, size_t n, uint32_t slot);

  // A successful completion. It must be the oldest one due, with the same slot and
  // retire count (InternalError otherwise: the queue and the tracker disagree). Frees
  // its slots and returns the transfer slot.
  uint32_t Completed(uint64_t wr_id);

  // The QP broke: every completion still due, merged per slot in order, as
  // (slot, completions); the tracker is empty afterwards.
  std::vector<std::pair<uint32_t, uint32_t>> Drain();

 private:
  struct Due {
    uint32_t slot;
    uint32_t retire;
  };
  uint32_t depth_;
  uint32_t outstanding_ = 0;
  std::deque<Due> expected_;
};

}  // namespace mori::transport::verbs
