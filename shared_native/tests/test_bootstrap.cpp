// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mori/bootstrap/bootstrap.hpp"
#include "mori/core/error.hpp"

namespace mori::bootstrap {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank, bootstrap) on `world` threads over real loopback sockets and
// rethrows the first failure.
void RunRanks(int world, const std::function<void(int, TcpBootstrap&)>& fn,
              std::chrono::milliseconds timeout = 20s) {
  TcpBootstrapOptions root_opts;
  root_opts.rank = 0;
  root_opts.world_size = world;
  root_opts.timeout = timeout;
  auto root = std::make_unique<TcpBootstrap>(root_opts);
  const int port = root->Port();
  if (world > 1) {
    ASSERT_GT(port, 0);
  }
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (r == 0) {
          fn(0, *root);
        } else {
          TcpBootstrapOptions o = root_opts;
          o.rank = r;
          o.port = port;
          TcpBootstrap b(o);
          fn(r, b);
        }
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(TcpBootstrap, AllGatherBroadcastBarrier) {
  for (int world : {1, 2, 5}) {
    RunRanks(world, [world](int rank, TcpBootstrap& b) {
      EXPECT_EQ(b.Rank(), rank);
      EXPECT_EQ(b.WorldSize(), world);
      for (int round = 0; round < 20; ++round) {
        uint64_t mine = rank * 1000 + round;
        std::vector<uint64_t> all(world);
        b.AllGather(&mine, sizeof(mine), all.data());
        for (int r = 0; r < world; ++r) EXPECT_EQ(all[r], uint64_t(r * 1000 + round));
        for (int root = 0; root < world; ++root) {
          uint32_t v = rank == root ? 0xabc00000u + root * 7 + round : 0;
          b.Broadcast(&v, sizeof(v), root);
          EXPECT_EQ(v, 0xabc00000u + root * 7 + round);
        }
        b.Barrier();
      }
    });
  }
}

TEST(TcpBootstrap, VariableSizeBlobsThroughTheInterface) {
  const int world = 4;
  std::random_device rd;
  const unsigned seed = rd();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RunRanks(world, [seed](int rank, TcpBootstrap& b) {
    auto blob_of = [seed](int r) {
      std::mt19937 gen(seed + r);
      std::vector<uint8_t> v(r == 2 ? 0 : (gen() % 300000));
      for (auto& x : v) x = static_cast<uint8_t>(gen());
      return v;
    };
    Bootstrap& iface = b;
    auto all = AllGatherBytes(iface, blob_of(rank));
    ASSERT_EQ(all.size(), 4u);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(all[r], blob_of(r)) << "blob of rank " << r;
    auto got = BroadcastBytes(iface, rank == 3 ? blob_of(3) : std::vector<uint8_t>{}, 3);
    EXPECT_EQ(got, blob_of(3));
  });
}

TEST(TcpBootstrap, MismatchedCollectivesAreReported) {
  try {
    RunRanks(
        2,
        [](int rank, TcpBootstrap& b) {
          uint32_t x = 1;
          if (rank == 0) {
            std::vector<uint32_t> all(2);
            b.AllGather(&x, sizeof(x), all.data());
          } else {
            b.Broadcast(&x, sizeof(x), 1);
          }
        },
        3s);
    FAIL() << "no error";
  } catch (const InvalidStateError& e) {
    EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
  } catch (const Error& e) {
    // The non-root rank may see rank 0 hang up first.
    EXPECT_TRUE(e.code() == ErrorCode::kTransport || e.code() == ErrorCode::kTimeout) << e.what();
  }
}

TEST(TcpBootstrap, MissingRankTimesOutNamingTheWait) {
  TcpBootstrapOptions o;
  o.world_size = 3;
  o.timeout = 300ms;
  TcpBootstrap root(o);
  o.rank = 1;
  o.port = root.Port();
  std::thread t([o] { TcpBootstrap one(o); });
  auto start = std::chrono::steady_clock::now();
  try {
    root.Barrier();
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2 ranks"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  t.join();
}

TEST(TcpBootstrap, DeadPeerRaisesTransportErrorNotHang) {
  TcpBootstrapOptions o;
  o.world_size = 2;
  o.timeout = 10s;
  TcpBootstrap root(o);
  o.rank = 1;
  o.port = root.Port();
  std::thread t([o] {
    TcpBootstrap peer(o);  // connects, then exits without taking part
  });
  t.join();
  auto start = std::chrono::steady_clock::now();
  uint32_t x = 0;
  std::vector<uint32_t> all(2);
  EXPECT_THROW(root.AllGather(&x, sizeof(x), all.data()), TransportError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  try {
    root.Barrier();
    FAIL();
  } catch (const InvalidStateError& e) {
    EXPECT_NE(std::string(e.what()).find("earlier failure"), std::string::npos) << e.what();
  }
}

TEST(TcpBootstrap, ConnectTimesOutWhenNoRootListens) {
  // Bind and drop a socket to get a port that nobody listens on.
  TcpBootstrapOptions o;
  o.world_size = 2;
  int port;
  {
    port = TcpBootstrap(o).Port();
  }
  o.rank = 1;
  o.port = port;
  o.timeout = 300ms;
  EXPECT_THROW(TcpBootstrap b(o), TimeoutError);
}

TEST(TcpBootstrap, RejectsBadOptionsWithTheValue) {
  TcpBootstrapOptions o;
  o.world_size = 2;
  o.rank = 2;
  try {
    TcpBootstrap b(o);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 out of range [0, 2)"), std::string::npos);
  }
  o.rank = 1;
  o.port = 0;
  EXPECT_THROW(TcpBootstrap b(o), InvalidArgumentError);
}

}  // namespace
}  // namespace mori::bootstrap
