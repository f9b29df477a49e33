// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "mori/core/error.hpp"

namespace mori::python {

// Longer timeouts mean "practically forever" and are clamped to this, so that
// steady_clock::now() + timeout stays far inside its int64 nanosecond range.
constexpr double kMaxTimeoutS = 365.0 * 24 * 3600;

// The one conversion of a Python timeout in seconds: NaN, zero and negative are
// refused naming the value; inf and anything above kMaxTimeoutS saturate; a positive
// one below a nanosecond is a nanosecond (it truncated to 0, which read "timed out
// after 0 ms", or "no timeout" where 0 means that).
inline std::chrono::nanoseconds TimeoutFromSeconds(double seconds, const char* name) {
  MORI_CHECK_ARG(!std::isnan(seconds) && seconds > 0, name, " ", seconds,
                 " must be a positive number of seconds (inf means practically forever)");
  const double ns = std::ceil(std::min(seconds, kMaxTimeoutS) * 1e9);
  return std::chrono::nanoseconds(std::max<int64_t>(1, static_cast<int64_t>(ns)));
}

// For the native APIs that take milliseconds; rounded up so a tiny positive
// timeout stays positive.
inline std::chrono::milliseconds TimeoutMsFromSeconds(double seconds, const char* name) {
  return std::chrono::ceil<std::chrono::milliseconds>(TimeoutFromSeconds(seconds, name));
}

// Timeouts where 0 means "none" (the diagnostic kernels' trap).
inline uint64_t OptionalTimeoutNs(double seconds, const char* name) {
  if (seconds == 0) return 0;
  return static_cast<uint64_t>(TimeoutFromSeconds(seconds, name).count());
}

}  // namespace mori::python
