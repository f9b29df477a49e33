// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The one conversion of every timeout a caller gives mori, in every package: NaN,
// zero and negative are refused naming the value and the argument; inf and anything
// above kMaxTimeoutS saturate to it ("practically forever"), so that no deadline
// (steady_clock::now() + timeout, the kernels' start + timeout_ns) can overflow; a
// positive value below the unit it is counted in rounds up to one unit. Python reaches
// the same rules through mori.core.timeouts.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "mori/core/error.hpp"

namespace mori {

// A year: longer timeouts mean "practically forever" and are clamped to this.
inline constexpr double kMaxTimeoutS = 365.0 * 24 * 3600;
inline constexpr std::chrono::milliseconds kMaxTimeout{static_cast<int64_t>(kMaxTimeoutS) * 1000};

// A timeout in seconds, checked and saturated (seconds).
inline double TimeoutSeconds(double seconds, const char* name) {
  MORI_CHECK_ARG(!std::isnan(seconds) && seconds > 0, name, " ", seconds,
                 " must be > 0 (a number of seconds; inf means practically forever)");
  return std::min(seconds, kMaxTimeoutS);
}

// The same as nanoseconds, at least one.
inline std::chrono::nanoseconds TimeoutFromSeconds(double seconds, const char* name) {
  const double ns = std::ceil(TimeoutSeconds(seconds, name) * 1e9);
  return std::chrono::nanoseconds(std::max<int64_t>(1, static_cast<int64_t>(ns)));
}

// For the native APIs that count milliseconds: rounded up, at least one.
inline std::chrono::milliseconds TimeoutMsFromSeconds(double seconds, const char* name) {
  return std::chrono::ceil<std::chrono::milliseconds>(TimeoutFromSeconds(seconds, name));
}

// Timeouts where 0 means "none" (the diagnostic kernels' trap), as nanoseconds.
inline uint64_t OptionalTimeoutNs(double seconds, const char* name) {
  if (seconds == 0) return 0;
  return static_cast<uint64_t>(TimeoutFromSeconds(seconds, name).count());
}

// A timeout a C++ caller built as a duration (the packages' native constructors):
// refused unless positive, saturated at kMaxTimeout, so that a kernel's
// globaltimer + timeout_ns or a host deadline cannot overflow.
template <class Rep, class Period>
std::chrono::milliseconds CheckedTimeout(std::chrono::duration<Rep, Period> timeout,
                                         const char* name) {
  const double seconds = std::chrono::duration<double>(timeout).count();
  MORI_CHECK_ARG(seconds > 0, name, " ", seconds * 1000,
                 " ms must be > 0 (kMaxTimeout means practically forever)");
  if (seconds >= kMaxTimeoutS) return kMaxTimeout;
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::ceil<std::chrono::milliseconds>(timeout));
}

// The same timeout as the nanoseconds a kernel compares globaltimer deltas with.
template <class Rep, class Period>
uint64_t KernelTimeoutNs(std::chrono::duration<Rep, Period> timeout, const char* name) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(CheckedTimeout(timeout, name)).count());
}

// A timeout in whole milliseconds (mori-io's config fields, which are ints): refused
// unless positive (or 0 where `zero_means_never`), saturated at `max_ms`.
inline int64_t TimeoutMs(double ms, const char* name, int64_t max_ms, bool zero_means_never) {
  if (zero_means_never && ms == 0) return 0;
  MORI_CHECK_ARG(!std::isnan(ms) && ms > 0, name, " ", ms, " must be > 0",
                 zero_means_never ? " or 0 (never)" : "",
                 " (milliseconds; inf means practically forever)");
  const double limit =
      std::min<double>(static_cast<double>(max_ms), static_cast<double>(kMaxTimeout.count()));
  return static_cast<int64_t>(std::ceil(std::min(ms, limit)));
}

// MORI's wait timeouts in milliseconds: negative waits without a limit (-1), 0 polls
// once, a positive one is rounded up and saturated at kMaxTimeout; NaN is refused.
inline int64_t WaitTimeoutMs(double ms, const char* name) {
  MORI_CHECK_ARG(!std::isnan(ms), name, " ", ms,
                 " must be a number of milliseconds (negative: no limit, 0: poll once)");
  if (ms < 0) return -1;
  return static_cast<int64_t>(std::ceil(std::min(ms, static_cast<double>(kMaxTimeout.count()))));
}

}  // namespace mori
