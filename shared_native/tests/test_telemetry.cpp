// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "mori/core/telemetry.hpp"

namespace mori::telemetry {
namespace {

const TimerStats* Find(const std::vector<TimerStats>& all, const std::string& name) {
  for (const auto& s : all) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

void TimedWork(int n) {
  for (int i = 0; i < n; ++i) {
    MORI_SCOPED_TIMER(kEp, "test.timed_work");
  }
}

void TimedSleep() {
  MORI_SCOPED_TIMER(kEp, "test.timed_sleep");
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

uint64_t CountOf(const std::string& name) {
  auto snap = Snapshot();
  const TimerStats* s = Find(snap, name);
  return s ? s->count : 0;
}

TEST(Telemetry, OffRecordsNothing) {
  Enable(log::Module::kEp, false);
  const uint64_t before = CountOf("test.timed_work");
  TimedWork(1000);
  EXPECT_EQ(CountOf("test.timed_work"), before);
}

TEST(Telemetry, OnCountsEveryScopeAcrossThreads) {
  Enable(log::Module::kEp, true);
  Reset();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([] { TimedWork(2500); });
  for (auto& t : threads) t.join();
  TimedSleep();
  Enable(log::Module::kEp, false);
  auto snap = Snapshot();
  const TimerStats* work = Find(snap, "test.timed_work");
  ASSERT_NE(work, nullptr);
  EXPECT_EQ(work->count, 10000u);
  EXPECT_EQ(work->module, "ep");
  EXPECT_LE(work->min_ns, work->max_ns);
  const TimerStats* sleep = Find(snap, "test.timed_sleep");
  ASSERT_NE(sleep, nullptr);
  EXPECT_EQ(sleep->count, 1u);
  EXPECT_GE(sleep->total_ns, 2'000'000u);
  Reset();
  EXPECT_EQ(Find(Snapshot(), "test.timed_work")->count, 0u);
}

TEST(Telemetry, TwoTimersInOneScope) {
  Enable(log::Module::kEp, true);
  Reset();
  {
    MORI_SCOPED_TIMER(kEp, "test.outer");
    MORI_SCOPED_TIMER(kEp, "test.inner");
  }
  Enable(log::Module::kEp, false);
  auto snap = Snapshot();
  ASSERT_NE(Find(snap, "test.outer"), nullptr);
  ASSERT_NE(Find(snap, "test.inner"), nullptr);
  EXPECT_EQ(Find(snap, "test.outer")->count, 1u);
}

}  // namespace
}  // namespace mori::telemetry
