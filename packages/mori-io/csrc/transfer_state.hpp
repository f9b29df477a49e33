// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace mori::io {

// MORI's StatusCode values (SUCCESS, INIT, ERROR, NOT_FOUND) keep their numbers; the
// others say more precisely why a transfer failed.
enum class StatusCode : uint32_t {
  SUCCESS = 0,
  INIT = 1,
  ERROR = 2,
  NOT_FOUND = 3,
  IN_PROGRESS = 4,
  ERR_INVALID_ARGS = 5,
  ERR_OUT_OF_BOUNDS = 6,
  ERR_PEER_LOST = 7,
  ERR_TIMEOUT = 8,
  ERR_BAD_STATE = 9,
};

const char* StatusCodeName(StatusCode code) noexcept;

// The shared state behind a Python TransferStatus. Finished exactly once; the message
// is written before the code is published (release) and never changes after, so a
// reader that saw a final code (acquire) reads the message without a lock.
class TransferState {
 public:
  TransferState() = default;
  explicit TransferState(StatusCode code) : code_(static_cast<uint32_t>(code)) {}

  StatusCode Code() const noexcept {
    return static_cast<StatusCode>(code_.load(std::memory_order_acquire));
  }
  static bool IsPending(StatusCode c) noexcept {
    return c == StatusCode::INIT || c == StatusCode::IN_PROGRESS;
  }
  bool InProgress() const noexcept { return IsPending(Code()); }
  bool Succeeded() const noexcept { return Code() == StatusCode::SUCCESS; }
  bool Failed() const noexcept {
    StatusCode c = Code();
    return !IsPending(c) && c != StatusCode::SUCCESS;
  }
  // Empty until finished.
  std::string Message() const {
    if (InProgress()) return {};
    return message_;
  }

  void SetInProgress() noexcept {
    code_.store(static_cast<uint32_t>(StatusCode::IN_PROGRESS), std::memory_order_release);
  }

  // First call wins; later calls are ignored. Returns whether this call finished it.
  bool Finish(StatusCode code, std::string message = {}) {
    if (finishing_.exchange(true, std::memory_order_acq_rel)) return false;
    message_ = std::move(message);
    code_.store(static_cast<uint32_t>(code), std::memory_order_seq_cst);
    // seq_cst pairs with the waiter's increment: either the waiter sees the final code
    // or we see the waiter and notify under the mutex.
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    return true;
  }

  // Polls before a waiter sleeps on the condition variable (MORI_IO_WAIT_SPIN, read
  // once per process).
  static int WaitSpins() {
    static const int spins = [] {
      const char* v = std::getenv("MORI_IO_WAIT_SPIN");
      return v != nullptr && *v != '\0' ? std::atoi(v) : 2000;
    }();
    return spins;
  }

  // Transfers whose completion is noticed by a polling thread of ours (P2P copies:
  // GPU events) rather than a socket: the waiter keeps spinning this long before it
  // sleeps, so it is not put to sleep moments before the end (a futex wake-up costs
  // more than such a transfer). MORI_IO_WAIT_SPIN_US, read once; 0 disables.
  static int64_t LongSpinNs() {
    static const int64_t ns = [] {
      const char* v = std::getenv("MORI_IO_WAIT_SPIN_US");
      return (v != nullptr && *v != '\0' ? std::atoll(v) : 1000) * 1000;
    }();
    return ns;
  }
  void SetLongSpin() noexcept { long_spin_ = true; }

  // Waits until finished or `timeout_ms` passes (negative: no limit). Spins briefly
  // first: most small transfers finish within microseconds.
  bool WaitFor(int64_t timeout_ms) {
    using Clock = std::chrono::steady_clock;
    auto start = Clock::now();
    const int spins = WaitSpins();
    for (int i = 0; i < spins; ++i) {
      if (!InProgress()) return true;
      if ((i & 63) == 63) std::this_thread::yield();
    }
    if (long_spin_) {
      int64_t limit = LongSpinNs();
      if (timeout_ms >= 0) limit = std::min<int64_t>(limit, timeout_ms * 1000000);
      auto until = start + std::chrono::nanoseconds(limit);
      for (int i = 0;; ++i) {
        if (!InProgress()) return true;
        if ((i & 63) == 63) {
          if (Clock::now() >= until) break;
          std::this_thread::yield();
        }
      }
    }
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    std::unique_lock<std::mutex> lock(mu_);
    auto done = [&] { return !InProgress(); };
    bool ok;
    if (timeout_ms < 0) {
      cv_.wait(lock, done);
      ok = true;
    } else {
      ok = cv_.wait_until(lock, start + std::chrono::milliseconds(timeout_ms), done);
    }
    waiters_.fetch_sub(1, std::memory_order_relaxed);
    return ok;
  }

 private:
  std::atomic<uint32_t> code_{static_cast<uint32_t>(StatusCode::INIT)};
  std::atomic<bool> finishing_{false};
  std::string message_;
  std::atomic<int> waiters_{0};
  bool long_spin_ = false;  // set before the state is shared
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace mori::io
