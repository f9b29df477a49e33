// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../src/shmem/allocator.hpp"
#include "mori/bootstrap/bootstrap.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/host_ops.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::shmem {
namespace {

using internal::Allocator;
using namespace std::chrono_literals;

TEST(Allocator, AlignsSplitsAndCoalesces) {
  Allocator a(1 << 20);
  size_t x = a.Allocate(100, 64);
  size_t y = a.Allocate(1000, 4096);
  size_t z = a.Allocate(1, 8);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y % 4096, 0u);
  EXPECT_EQ(z, 104u);  // first fit: the gap between x and y
  EXPECT_EQ(a.live_count(), 3u);
  a.Free(y);
  a.Free(x);
  a.Free(z);
  EXPECT_EQ(a.live_count(), 0u);
  EXPECT_EQ(a.free_block_count(), 1u);
  EXPECT_EQ(a.largest_free_block(), size_t{1} << 20);
}

TEST(Allocator, RandomWorkloadKeepsInvariantsAndIsDeterministic) {
  std::random_device rd;
  const unsigned seed = rd();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto run = [seed](std::vector<size_t>* offsets) {
    std::mt19937 gen(seed);
    Allocator a(64 << 20);
    std::vector<std::pair<size_t, size_t>> live;
    for (int step = 0; step < 20000; ++step) {
      if (!live.empty() && gen() % 3 == 0) {
        size_t i = gen() % live.size();
        EXPECT_EQ(a.Free(live[i].first), live[i].second);
        live.erase(live.begin() + i);
      } else {
        size_t n = 1 + gen() % 50000;
        size_t align = size_t{1} << (gen() % 13);
        try {
          size_t off = a.Allocate(n, align);
          EXPECT_EQ(off % align, 0u);
          for (auto& [o, s] : live) EXPECT_TRUE(off + n <= o || o + s <= off) << "overlap";
          live.emplace_back(off, n);
          offsets->push_back(off);
        } catch (const OutOfMemoryError&) {
          EXPECT_LT(a.largest_free_block(), n + align);
        }
      }
      size_t used = 0;
      for (auto& [o, s] : live) used += s;
      ASSERT_EQ(a.used_bytes(), used);
    }
    for (auto& [o, s] : live) a.Free(o);
    EXPECT_EQ(a.free_block_count(), 1u);  // everything coalesced back
  };
  std::vector<size_t> first, second;
  run(&first);
  run(&second);
  EXPECT_EQ(first, second);  // same calls, same offsets: the heap stays symmetric
}

TEST(Allocator, ErrorsNameTheValues) {
  Allocator a(4096);
  size_t x = a.Allocate(1024, 256);
  try {
    a.Free(x + 16);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("inside the allocation at offset 0"), std::string::npos);
  }
  a.Free(x);
  try {
    a.Free(x);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("not a live allocation"), std::string::npos);
  }
  try {
    a.Allocate(8192, 64);
    FAIL();
  } catch (const OutOfMemoryError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("requested 8192 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("total 4096"), std::string::npos) << what;
  }
  EXPECT_THROW(a.Allocate(0, 8), InvalidArgumentError);
  EXPECT_THROW(a.Allocate(8, 3), InvalidArgumentError);
}

// The host protocol (the device one's twin) with threads as pes over plain memory.
struct FakeHeap {
  explicit FakeHeap(int n, size_t size) : n_pes(n), storage(n, std::vector<char>(size, 0)) {
    for (auto& s : storage) bases.push_back(s.data());
  }
  DeviceContext Context(int pe) {
    return DeviceContext{bases.data(), bases[pe], storage[0].size(), pe, n_pes, nullptr, nullptr};
  }
  int n_pes;
  std::vector<std::vector<char>> storage;
  std::vector<char*> bases;
};

TEST(HostOps, DataThenFlagOrderingAndBarrier) {
  const int n = 4;
  const int rounds = 10000;
  FakeHeap heap(n, 1 << 16);
  // Layout (same offsets on every pe): [0,8) flag, [8,16) ack, [64,64+8n) barrier
  // counters, [256, 256+1024) payload.
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int pe = 0; pe < n; ++pe) {
    threads.emplace_back([&, pe] {
      DeviceContext ctx = heap.Context(pe);
      auto* flag = reinterpret_cast<uint64_t*>(ctx.my_base);
      auto* ack = flag + 1;
      auto* arrive = reinterpret_cast<uint64_t*>(ctx.my_base + 64);
      auto* payload = reinterpret_cast<uint64_t*>(ctx.my_base + 256);
      uint64_t epoch = 0;
      const int right = (pe + 1) % n, left = (pe + n - 1) % n;
      uint64_t out[128];
      for (int r = 1; r <= rounds; ++r) {
        for (int i = 0; i < 128; ++i) out[i] = uint64_t(r) * 1000003u + i + pe;
        host::PutNbi(ctx, payload, out, sizeof(out), right);
        host::SignalSet(ctx, flag, r, right);
        host::WaitUntil(flag, Cmp::kGe, r, 10s);
        for (int i = 0; i < 128; ++i) {
          if (payload[i] != uint64_t(r) * 1000003u + i + left) ++bad;
        }
        host::SignalSet(ctx, ack, r, left);
        host::WaitUntil(ack, Cmp::kGe, r, 10s);
        if (r % 1000 == 0) host::BarrierAll(ctx, arrive, &epoch, 10s);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(HostOps, WaitTimesOutNamingTheValues) {
  uint64_t word = 3;
  try {
    host::WaitUntil(&word, Cmp::kEq, 7, 50ms);
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("is 3, waiting for value == 7"), std::string::npos)
        << e.what();
  }
}

TEST(HostOps, SizesAndHandleNames) {
  EXPECT_EQ(ParseSize("512M"), size_t{512} << 20);
  EXPECT_EQ(ParseSize("2GiB"), size_t{2} << 30);
  EXPECT_EQ(ParseSize("4096"), 4096u);
  EXPECT_THROW(ParseSize("lots"), InvalidArgumentError);
  EXPECT_EQ(ParseHandleType("posix_fd"), HandleType::kPosixFd);
  EXPECT_THROW(ParseHandleType("ipc"), InvalidArgumentError);
  EXPECT_FALSE(Initialized());
  EXPECT_THROW(MyPe(), InvalidStateError);
}

// GetBootstrap is the heap's; AtFinalize hooks run once, in order, at the next Finalize,
// while the heap still exists (a mori::proxy::Proxy closes there), and not again.
TEST(Shmem, AtFinalizeHooksRunOnceBeforeTheHeapGoes) {
  bootstrap::TcpBootstrapOptions bo;
  bo.rank = 0;
  bo.world_size = 1;
  bo.timeout = std::chrono::seconds(10);
  auto boot = std::make_shared<bootstrap::TcpBootstrap>(bo);
  InitOptions so;
  so.heap_size = 1 << 20;
  Init(boot, so);
  EXPECT_EQ(GetBootstrap().get(), boot.get());
  std::vector<int> order;
  bool heap_alive = false;
  AtFinalize([&] { order.push_back(1); });
  AtFinalize([&] {
    order.push_back(2);
    heap_alive = Initialized() && GetDeviceContext().my_base != nullptr;
  });
  Finalize();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_TRUE(heap_alive);
  EXPECT_FALSE(Initialized());
  Init(boot, so);
  Finalize();  // the hooks ran with the last heap: not again
  EXPECT_EQ(order.size(), 2u);
}

}  // namespace
}  // namespace mori::shmem
