// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ledger/wait_options.hpp"
#include "mori/core/timeout.hpp"

namespace mori::io {

// MORI's StatusCode: its names and numbers. A failure is any code above ERR_BEGIN.
// ERR_RDMA_OP means "the transport operation failed" whichever backend moved the bytes.
enum class StatusCode : uint32_t {
  SUCCESS = 0,
  INIT = 1,
  IN_PROGRESS = 2,
  ERR_BEGIN = 10,
  ERR_INVALID_ARGS = 11,
  ERR_NOT_FOUND = 12,
  ERR_RDMA_OP = 13,
  ERR_BAD_STATE = 14,
  ERR_GPU_OP = 15,
};

// mori's finer reason behind a StatusCode. A detail below 20 has the number of the
// StatusCode it reports as; the others refine one: OUT_OF_BOUNDS is an invalid
// argument, PEER_LOST and TIMEOUT are failed transport operations.
enum class StatusDetail : uint32_t {
  SUCCESS = 0,
  INIT = 1,
  IN_PROGRESS = 2,
  ERR_INVALID_ARGS = 11,
  ERR_NOT_FOUND = 12,
  ERR_TRANSPORT = 13,
  ERR_BAD_STATE = 14,
  ERR_GPU_OP = 15,
  ERR_OUT_OF_BOUNDS = 21,
  ERR_PEER_LOST = 22,
  ERR_TIMEOUT = 23,
};

constexpr StatusCode CodeOf(StatusDetail d) noexcept {
  switch (d) {
    case StatusDetail::ERR_OUT_OF_BOUNDS:
      return StatusCode::ERR_INVALID_ARGS;
    case StatusDetail::ERR_PEER_LOST:
    case StatusDetail::ERR_TIMEOUT:
      return StatusCode::ERR_RDMA_OP;
    default:
      return static_cast<StatusCode>(static_cast<uint32_t>(d));
  }
}

// The detail a caller-set StatusCode is recorded as (the same number).
constexpr StatusDetail DetailOf(StatusCode c) noexcept {
  return c == StatusCode::ERR_BEGIN ? StatusDetail::ERR_TRANSPORT
                                    : static_cast<StatusDetail>(static_cast<uint32_t>(c));
}

const char* StatusCodeName(StatusCode code) noexcept;
const char* StatusDetailName(StatusDetail detail) noexcept;

// The shared state behind a Python TransferStatus. The engine finishes it exactly
// once (Finish: first call wins). The message is written before the code is published
// (release), under mu_ so that MORI's caller-side setters (SetCode, SetMessage,
// Update) may race with readers; a finish without a message takes no lock.
class TransferState {
 public:
  TransferState() = default;
  explicit TransferState(StatusDetail detail) : code_(static_cast<uint32_t>(detail)) {}
  // Already finished (a later Finish is ignored): for a transfer that ended before its
  // status was made, so nobody can be waiting on it yet.
  TransferState(StatusDetail detail, std::string message)
      : code_(static_cast<uint32_t>(detail)), finishing_(true), message_(std::move(message)) {}

  StatusDetail Detail() const noexcept {
    return static_cast<StatusDetail>(code_.load(std::memory_order_acquire));
  }
  StatusCode Code() const noexcept { return CodeOf(Detail()); }
  // MORI's predicates: INIT is neither in progress nor finished.
  bool InProgress() const noexcept { return Detail() == StatusDetail::IN_PROGRESS; }
  bool Init() const noexcept { return Detail() == StatusDetail::INIT; }
  bool Succeeded() const noexcept { return Detail() == StatusDetail::SUCCESS; }
  bool Failed() const noexcept { return Code() > StatusCode::ERR_BEGIN; }
  std::string Message() const {
    std::lock_guard<std::mutex> lock(mu_);
    return message_;
  }

  void SetInProgress() noexcept {
    code_.store(static_cast<uint32_t>(StatusDetail::IN_PROGRESS), std::memory_order_release);
  }

  // First call wins; later calls are ignored. Returns whether this call finished it.
  bool Finish(StatusDetail detail, std::string message = {}) {
    if (finishing_.exchange(true, std::memory_order_acq_rel)) return false;
    if (!message.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      message_ = std::move(message);
    }
    code_.store(static_cast<uint32_t>(detail), std::memory_order_seq_cst);
    // seq_cst pairs with the waiter's increment: either the waiter sees the final code
    // or we see the waiter and notify under the mutex.
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    return true;
  }

  // MORI's setters, for statuses a caller drives itself. SetCode stores
  // unconditionally; Update keeps a failure already recorded (first failure wins).
  void SetCode(StatusCode code) {
    std::lock_guard<std::mutex> lock(mu_);
    code_.store(static_cast<uint32_t>(DetailOf(code)), std::memory_order_seq_cst);
    cv_.notify_all();
  }
  void SetMessage(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    message_ = message;
  }
  void Update(StatusCode code, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (Failed()) return;
    message_ = message;
    code_.store(static_cast<uint32_t>(DetailOf(code)), std::memory_order_seq_cst);
    cv_.notify_all();
  }

  // Polls before a waiter sleeps on the condition variable (WaitOptions).
  static int WaitSpins() { return WaitOptions::Process().spins; }

  // Transfers whose completion is noticed by a polling thread of ours (P2P copies:
  // GPU events) rather than a socket: the waiter keeps spinning this long before it
  // sleeps, so it is not put to sleep moments before the end (a futex wake-up costs
  // more than such a transfer). WaitOptions; 0 disables.
  static int64_t LongSpinNs() { return WaitOptions::Process().long_spin_ns; }
  void SetLongSpin() noexcept { long_spin_ = true; }

  // A transport that can finish this transfer on the waiting thread (TCP: the waiter
  // reads its answer from the socket itself instead of being woken by the reactor that
  // read it). `help` runs at the start of a WaitFor, one waiter at a time, until the
  // status is final, the deadline passes (steady-clock ns) or it gives up; the usual
  // wait follows. Set by the submitting thread before the status is handed out; `ctx`
  // is kept alive by this state.
  using WaitHelp = void (*)(const std::shared_ptr<void>& ctx, TransferState& state,
                            int64_t deadline_ns);
  void SetWaitHelp(WaitHelp help, std::shared_ptr<void> ctx) noexcept {
    help_ = help;
    help_ctx_ = std::move(ctx);
  }
  // For a status polled instead of waited for: one pass of the helper that does not
  // block (TCP: one non-blocking read), so a polled transfer still finishes.
  void Poll() {
    if (help_ == nullptr || !InProgress() || helping_.exchange(true, std::memory_order_acquire)) {
      return;
    }
    help_(help_ctx_, *this, 0);
    helping_.store(false, std::memory_order_release);
  }

  // Waits while IN_PROGRESS, until `timeout_ms` passes (negative: no limit). Spins
  // briefly first: most small transfers finish within microseconds. True when the
  // status is no longer IN_PROGRESS.
  bool WaitFor(int64_t timeout_ms) {
    using Clock = std::chrono::steady_clock;
    // Saturated at kMaxTimeout (mori/core/timeout.hpp): start + timeout_ms cannot overflow.
    timeout_ms = std::min<int64_t>(timeout_ms, kMaxTimeout.count());
    auto start = Clock::now();
    if (help_ != nullptr && InProgress() && !helping_.exchange(true, std::memory_order_acquire)) {
      const int64_t start_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count();
      help_(help_ctx_, *this, timeout_ms < 0 ? INT64_MAX : start_ns + timeout_ms * 1000000);
      helping_.store(false, std::memory_order_release);
    }
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
  std::atomic<uint32_t> code_{static_cast<uint32_t>(StatusDetail::INIT)};
  std::atomic<bool> finishing_{false};
  std::string message_;
  std::atomic<int> waiters_{0};
  bool long_spin_ = false;   // set before the state is shared
  WaitHelp help_ = nullptr;  // set before the state is handed out (SetWaitHelp)
  std::shared_ptr<void> help_ctx_;
  std::atomic<bool> helping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace mori::io
