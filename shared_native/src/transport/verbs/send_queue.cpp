// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/verbs/send_queue.hpp"

#include "mori/core/error.hpp"

namespace mori::transport::verbs {

SendQueueTracker::SendQueueTracker(uint32_t depth) : depth_(depth) {
  MORI_CHECK_ARG(depth >= 1, "send queue depth ", depth, " must be >= 1");
}

void SendQueueTracker::Posted(const PlannedWr* wrs, size_t n, uint32_t slot) {
  MORI_CHECK_ARG(n >= 1, "an empty chain was posted");
  MORI_CHECK_ARG(Fits(n), "chain of ", n, " WRs does not fit the send queue (", outstanding_,
                 " of ", depth_, " slots in use)");
  MORI_CHECK_ARG((wrs[n - 1].send_flags & send_flag::kSignaled) != 0, "chain of ", n,
                 " WRs ends unsignaled: its slots would never be freed");
  size_t retired = 0;
  for (size_t i = 0; i < n; ++i) {
    if ((wrs[i].send_flags & send_flag::kSignaled) != 0) retired += wrs[i].retire;
  }
  MORI_CHECK_ARG(retired == n, "chain of ", n, " WRs whose signaled WRs retire ", retired);
  for (size_t i = 0; i < n; ++i) {
    if ((wrs[i].send_flags & send_flag::kSignaled) != 0) expected_.push_back({slot, wrs[i].retire});
  }
  outstanding_ += static_cast<uint32_t>(n);
}

uint32_t SendQueueTracker::Completed(uint64_t wr_id) {
  WrId id = DecodeWrId(wr_id);
  MORI_CHECK(id.kind == WrKind::kSend, "receive completion 0x", std::hex, wr_id,
             " given to the send-queue tracker");
  MORI_CHECK(!expected_.empty(), "completion for slot ", id.slot, " but none is due");
  const Due& due = expected_.front();
  MORI_CHECK(due.slot == id.slot && due.retire == id.retire, "completion for slot ", id.slot,
             " retiring ", id.retire, " but slot ", due.slot, " retiring ", due.retire,
             " is due first (RC completes in order)");
  outstanding_ -= due.retire;
  expected_.pop_front();
  return id.slot;
}

std::vector<std::pair<uint32_t, uint32_t>> SendQueueTracker::Drain() {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const Due& d : expected_) {
    if (!out.empty() && out.back().first == d.slot) {
      ++out.back().second;
    } else {
      out.emplace_back(d.slot, 1);
    }
  }
  expected_.clear();
  outstanding_ = 0;
  return out;
}

}  // namespace mori::transport::verbs
