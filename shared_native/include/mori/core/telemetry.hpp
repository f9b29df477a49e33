// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "mori/core/logging.hpp"
#include "mori/core/macros.hpp"

namespace mori::telemetry {

// Telemetry switch per module: MORI_TELEMETRY=all or a comma list ("io,ep"), or
// Enable()/Disable() at run time.
MORI_API extern std::atomic<bool> g_enabled[log::kModuleCount];

inline bool Enabled(log::Module module) noexcept {
  return g_enabled[static_cast<int>(module)].load(std::memory_order_relaxed);
}
MORI_API void Enable(log::Module module, bool on) noexcept;

inline uint64_t NowNs() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// One timed code site. Has a constexpr constructor so that a function-local
// `static TimerSite` is constant-initialized: no guard variable, no first-use cost.
// It joins the registry the first time it records.
struct TimerSite {
  constexpr TimerSite(log::Module m, const char* n) noexcept : module(m), name(n) {}
  log::Module module;
  const char* name;
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> total_ns{0};
  std::atomic<uint64_t> min_ns{UINT64_MAX};
  std::atomic<uint64_t> max_ns{0};
  std::atomic<bool> registered{false};
};

MORI_API void Record(TimerSite& site, uint64_t elapsed_ns) noexcept;

struct TimerStats {
  std::string module;
  std::string name;
  uint64_t count;
  uint64_t total_ns;
  uint64_t min_ns;
  uint64_t max_ns;
};
// Sites that have recorded at least once, in registration order.
MORI_API std::vector<TimerStats> Snapshot();
MORI_API void Reset() noexcept;

// When the module's telemetry is off the constructor costs one relaxed load and a
// predicted-not-taken branch, and the destructor a test of a register that is
// null; nothing else (measured by shared_native/tests/bench_telemetry.cpp).
class ScopedTimer {
 public:
  explicit ScopedTimer(TimerSite& site) noexcept
      : site_(MORI_UNLIKELY(Enabled(site.module)) ? &site : nullptr) {
    if (MORI_UNLIKELY(site_ != nullptr)) start_ns_ = NowNs();
  }
  ~ScopedTimer() {
    if (MORI_UNLIKELY(site_ != nullptr)) Record(*site_, NowNs() - start_ns_);
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  TimerSite* site_;
  uint64_t start_ns_ = 0;
};

}  // namespace mori::telemetry

// Times the rest of the enclosing scope under `name` (a string literal) for
// `module` (kCore, kShmem, kIo, kEp, kCcl). The two names it declares carry the
// line number, so several timers can share a scope.
#define MORI_SCOPED_TIMER(module, name)                                        \
  static ::mori::telemetry::TimerSite MORI_CONCAT(mori_timer_site_, __LINE__){ \
      ::mori::log::Module::module, name};                                      \
  ::mori::telemetry::ScopedTimer MORI_CONCAT(mori_timer_, __LINE__) {          \
    MORI_CONCAT(mori_timer_site_, __LINE__)                                    \
  }
