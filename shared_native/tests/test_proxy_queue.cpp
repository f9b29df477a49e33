// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The proxy's command queue alone (no transport): slot reuse across laps, full-queue
// back-pressure and its bounded wait, per-producer ordering with several producers,
// retirement waits and failure propagation to the producers.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "mori/core/error.hpp"
#include "mori/proxy/queue.hpp"

namespace {

using namespace mori::proxy;
using std::chrono::milliseconds;

QueueOptions Small(uint64_t capacity, int timeout_ms = 2000) {
  QueueOptions o;
  o.capacity = capacity;
  o.timeout = milliseconds(timeout_ms);
  o.queue_id = 3;
  o.my_pe = 1;
  o.n_pes = 2;
  return o;
}

TEST(ProxyQueue, CapacityRoundsUpAndBadOptionsAreRefused) {
  EXPECT_EQ(CommandQueue(Small(5)).capacity(), 8u);
  EXPECT_EQ(CommandQueue(Small(1)).capacity(), 2u);
  EXPECT_EQ(CommandQueue(Small(1024)).capacity(), 1024u);
  EXPECT_THROW(CommandQueue(Small(uint64_t{1} << 31)), mori::InvalidArgumentError);
  EXPECT_THROW(CommandQueue(Small(8, 0)), mori::InvalidArgumentError);
  CommandQueue q(Small(4));
  EXPECT_THROW(q.DeviceView(), mori::InvalidStateError);
}

TEST(ProxyQueue, WrapsAroundManyLapsInOrder) {
  CommandQueue q(Small(4));
  const QueueView v = q.HostView();
  constexpr uint64_t kCount = 10000;
  std::thread consumer([&] {
    Command c;
    for (uint64_t i = 0; i < kCount;) {
      if (!q.TryPop(&c)) continue;
      ASSERT_EQ(c.seq, i + 1);
      ASSERT_EQ(c.op, static_cast<uint32_t>(Op::kWrite));
      ASSERT_EQ(c.pe, static_cast<int>(i % 2));
      ASSERT_EQ(c.dst_offset, i * 8);
      ASSERT_EQ(c.src_offset, i * 16);
      ASSERT_EQ(c.nbytes, i);
      q.Retire(i + 1);
      ++i;
    }
  });
  for (uint64_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(PushWrite(v, static_cast<int>(i % 2), i * 8, i * 16, i), i);
  }
  WaitRetired(v, kCount);
  consumer.join();
  EXPECT_EQ(q.popped(), kCount);
  EXPECT_EQ(v.control->tail, kCount);
}

TEST(ProxyQueue, FullQueueTimesOutNamingTheQueueAndDropsNothing) {
  CommandQueue q(Small(2, 150));
  const QueueView v = q.HostView();
  PushAtomicAdd(v, 0, 8, 1);
  PushAtomicAdd(v, 0, 8, 2);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    PushAtomicAdd(v, 0, 8, 3);
    FAIL() << "a push into a full queue returned";
  } catch (const mori::TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("proxy queue 3 of pe 1"), std::string::npos) << what;
    EXPECT_NE(what.find("full"), std::string::npos) << what;
    EXPECT_NE(what.find("capacity 2"), std::string::npos) << what;
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(150));
  // The two commands that fit are intact and in order.
  Command c;
  ASSERT_TRUE(q.TryPop(&c));
  EXPECT_EQ(c.value, 1u);
  ASSERT_TRUE(q.TryPop(&c));
  EXPECT_EQ(c.value, 2u);
}

TEST(ProxyQueue, FullQueueBackPressuresUntilTheConsumerPops) {
  CommandQueue q(Small(2, 5000));
  const QueueView v = q.HostView();
  PushAtomicAdd(v, 0, 0, 10);
  PushAtomicAdd(v, 0, 0, 11);
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    PushAtomicAdd(v, 0, 0, 12);
    pushed.store(true);
  });
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(pushed.load()) << "a push overtook a full queue";
  Command c;
  ASSERT_TRUE(q.TryPop(&c));
  EXPECT_EQ(c.value, 10u);
  producer.join();
  EXPECT_TRUE(pushed.load());
  ASSERT_TRUE(q.TryPop(&c));
  EXPECT_EQ(c.value, 11u);
  ASSERT_TRUE(q.TryPop(&c));
  EXPECT_EQ(c.value, 12u);
  EXPECT_FALSE(q.TryPop(&c));
}

TEST(ProxyQueue, SeveralProducersKeepTheirOwnOrder) {
  CommandQueue q(Small(16, 10000));
  const QueueView v = q.HostView();
  constexpr int kProducers = 4;
  constexpr uint64_t kEach = 5000;
  std::vector<uint64_t> last(kProducers, 0);
  uint64_t total = 0;
  std::thread consumer([&] {
    Command c;
    while (total < kProducers * kEach) {
      if (!q.TryPop(&c)) continue;
      const int who = c.pe;
      ASSERT_EQ(c.value, last[who] + 1) << "producer " << who << " reordered";
      last[who] = c.value;
      ++total;
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (uint64_t i = 1; i <= kEach; ++i) PushAtomicAdd(v, p, 0, i);
    });
  }
  for (auto& t : producers) t.join();
  consumer.join();
  EXPECT_EQ(total, kProducers * kEach);
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(last[p], kEach);
}

TEST(ProxyQueue, RetirementWaitsAreBoundedAndSeeRetire) {
  CommandQueue q(Small(8, 100));
  const QueueView v = q.HostView();
  const uint64_t i = PushWrite(v, 0, 0, 0, 4);
  EXPECT_THROW(WaitRetired(v, i + 1), mori::TimeoutError);
  Command c;
  ASSERT_TRUE(q.TryPop(&c));
  q.Retire(i + 1);
  WaitRetired(v, i + 1);
  EXPECT_EQ(q.retired(), i + 1);
}

TEST(ProxyQueue, AFailedProxyStopsEveryProducerWithItsReason) {
  CommandQueue q(Small(2, 5000));
  const QueueView v = q.HostView();
  PushAtomicAdd(v, 0, 0, 1);
  PushAtomicAdd(v, 0, 0, 2);
  std::thread blocked([&] {
    try {
      PushAtomicAdd(v, 0, 0, 3);
      ADD_FAILURE() << "push into a failed proxy's full queue returned";
    } catch (const mori::TransportError& e) {
      EXPECT_NE(std::string(e.what()).find("pe 7 (node 'n1') lost"), std::string::npos) << e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(50));
  q.Fail("pe 7 (node 'n1') lost while receiving");
  q.Fail("a later reason is not kept");
  blocked.join();
  EXPECT_THROW(Quiet(v), mori::TransportError);
  EXPECT_THROW(CheckHealth(v), mori::TransportError);
  EXPECT_STREQ(const_cast<const char*>(v.control->error), "pe 7 (node 'n1') lost while receiving");
}

TEST(ProxyQueue, AClosedQueueRefusesPushes) {
  CommandQueue q(Small(4));
  const QueueView v = q.HostView();
  q.MarkClosed();
  EXPECT_THROW(PushWrite(v, 0, 0, 0, 1), mori::InvalidStateError);
}

}  // namespace
