// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"

namespace mori {
namespace {

using namespace std::chrono_literals;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string RefusalOf(double seconds) {
  try {
    TimeoutFromSeconds(seconds, "timeout_s");
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(Timeout, InfAndHugeSecondsSaturateToAYear) {
  for (double huge : {kInf, 1e300, 1e10, kMaxTimeoutS}) {
    EXPECT_EQ(TimeoutMsFromSeconds(huge, "timeout_s"), kMaxTimeout) << huge;
    EXPECT_EQ(TimeoutSeconds(huge, "timeout_s"), kMaxTimeoutS) << huge;
  }
  // The deadline a wait computes stays far inside steady_clock's range.
  const auto deadline = std::chrono::steady_clock::now() + TimeoutFromSeconds(kInf, "t");
  EXPECT_GT(deadline, std::chrono::steady_clock::now() + 300 * 24h);
}

TEST(Timeout, NanZeroAndNegativeSecondsAreRefusedNamingTheValue) {
  EXPECT_EQ(RefusalOf(kNaN).rfind("timeout_s nan must be > 0", 0), 0u) << RefusalOf(kNaN);
  EXPECT_EQ(RefusalOf(0).rfind("timeout_s 0 must be > 0", 0), 0u) << RefusalOf(0);
  EXPECT_EQ(RefusalOf(-1).rfind("timeout_s -1 must be > 0", 0), 0u) << RefusalOf(-1);
  EXPECT_EQ(RefusalOf(-kInf).rfind("timeout_s -inf must be > 0", 0), 0u) << RefusalOf(-kInf);
}

TEST(Timeout, TinyPositiveTimeoutsRoundUpToOneUnit) {
  EXPECT_EQ(TimeoutFromSeconds(1e-300, "t"), 1ns);
  EXPECT_EQ(TimeoutMsFromSeconds(1e-300, "t"), 1ms);
  EXPECT_EQ(CheckedTimeout(1ns, "t"), 1ms);
}

TEST(Timeout, KernelNanosecondsNeverOverflow) {
  // A year of nanoseconds, whatever the caller's duration: milliseconds::max() * 1e6
  // overflowed uint64 and the kernels' globaltimer - t0 > timeout_ns fired at once.
  const uint64_t year_ns = static_cast<uint64_t>(kMaxTimeout.count()) * 1000000ull;
  EXPECT_EQ(KernelTimeoutNs(std::chrono::milliseconds::max(), "timeout"), year_ns);
  EXPECT_EQ(KernelTimeoutNs(std::chrono::seconds::max(), "timeout"), year_ns);
  EXPECT_EQ(KernelTimeoutNs(std::chrono::hours::max(), "timeout"), year_ns);
  EXPECT_EQ(KernelTimeoutNs(2500ms, "timeout"), 2500000000ull);
  EXPECT_LT(year_ns, std::numeric_limits<uint64_t>::max() / 2);  // + any globaltimer value
  EXPECT_THROW(KernelTimeoutNs(0ms, "timeout"), InvalidArgumentError);
  EXPECT_THROW(CheckedTimeout(-1ms, "timeout"), InvalidArgumentError);
}

TEST(Timeout, MillisecondFieldsAndWaits) {
  EXPECT_EQ(TimeoutMs(kInf, "peer_timeout_ms", 2147483647, false), 2147483647);
  EXPECT_EQ(TimeoutMs(1e300, "peer_timeout_ms", INT64_MAX, false), kMaxTimeout.count());
  EXPECT_EQ(TimeoutMs(0.5, "peer_timeout_ms", 2147483647, false), 1);
  EXPECT_EQ(TimeoutMs(0, "idle_timeout_ms", 2147483647, true), 0);
  EXPECT_THROW(TimeoutMs(0, "peer_timeout_ms", 2147483647, false), InvalidArgumentError);
  EXPECT_THROW(TimeoutMs(kNaN, "idle_timeout_ms", 2147483647, true), InvalidArgumentError);
  EXPECT_THROW(TimeoutMs(-1, "idle_timeout_ms", 2147483647, true), InvalidArgumentError);
  EXPECT_EQ(WaitTimeoutMs(-5, "timeout_ms"), -1);
  EXPECT_EQ(WaitTimeoutMs(0, "timeout_ms"), 0);
  EXPECT_EQ(WaitTimeoutMs(kInf, "timeout_ms"), kMaxTimeout.count());
  EXPECT_EQ(WaitTimeoutMs(0.25, "timeout_ms"), 1);
  EXPECT_THROW(WaitTimeoutMs(kNaN, "timeout_ms"), InvalidArgumentError);
}

}  // namespace
}  // namespace mori
