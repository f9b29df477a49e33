// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace mori::io {

// A warning a peer can cause at will (a failed accept, a refused hello, a refused notice
// ring, a dropped connection) is written at most once per interval per cause: the others
// are counted, and the next one written says how many it stands for, so a peer cannot
// flood the log and nothing goes unreported. One object per cause; any thread.
class LogThrottle {
 public:
  static constexpr int64_t kDefaultIntervalMs = 1000;
  explicit LogThrottle(int64_t interval_ms = kDefaultIntervalMs)
      : interval_ns_(interval_ms * 1000000) {}

  // Whether this occurrence is to be logged; if so, *suppressed is the number of
  // occurrences not logged since the last one that was.
  bool Due(uint64_t* suppressed) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = last_ns_.load(std::memory_order_relaxed);
    if (now - last < interval_ns_ ||
        !last_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      suppressed_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }

 private:
  const int64_t interval_ns_;
  std::atomic<int64_t> last_ns_{INT64_MIN / 2};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace mori::io
