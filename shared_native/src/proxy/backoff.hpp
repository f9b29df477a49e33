// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// How the proxy thread and the host producers wait without burning a core that other
// ranks' threads need: spin briefly (the next command or counter usually comes within
// a microsecond), then yield, then sleep in short steps.

#include <sched.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace mori::proxy::internal {

class Backoff {
 public:
  void Reset() { rounds_ = 0; }
  // True while still in the spinning phase (no system call made).
  bool Pause() {
    ++rounds_;
    if (rounds_ <= kSpin) return true;
    if (rounds_ <= kYield) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return false;
  }

 private:
  static constexpr uint32_t kSpin = 256;
  static constexpr uint32_t kYield = 2048;
  uint32_t rounds_ = 0;
};

}  // namespace mori::proxy::internal
