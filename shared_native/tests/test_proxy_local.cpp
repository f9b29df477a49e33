// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// A proxy over a one-pe host heap (the self path): write, add, quiet, barrier and
// close, and a bad command failing the proxy with the value named. The multi-process
// paths (tcp, cma, mapped between processes) are tested from Python with real
// processes (packages/mori-core/tests/test_proxy.py).

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "mori/core/error.hpp"
#include "mori/proxy/proxy.hpp"
#include "mori/shmem/shmem.hpp"

namespace {

using namespace mori;
using namespace mori::proxy;

class ProxyLocal : public ::testing::Test {
 protected:
  void SetUp() override {
    bootstrap::TcpBootstrapOptions bo;
    bo.rank = 0;
    bo.world_size = 1;
    bo.timeout = std::chrono::seconds(10);
    boot_ = std::make_shared<bootstrap::TcpBootstrap>(bo);
    shmem::InitOptions so;
    so.heap_size = 8 << 20;
    shmem::Init(boot_, so);
    base_ = shmem::GetDeviceContext().my_base;
  }
  void TearDown() override { shmem::Finalize(true); }
  uint64_t Offset(const void* p) const { return static_cast<const char*>(p) - base_; }

  std::shared_ptr<bootstrap::TcpBootstrap> boot_;
  char* base_ = nullptr;
};

TEST_F(ProxyLocal, WriteAddQuietBarrierClose) {
  ProxyOptions po;
  po.num_queues = 2;
  po.queue_capacity = 4;  // several laps below
  po.timeout = std::chrono::seconds(10);
  Proxy proxy(boot_, po);
  EXPECT_EQ(proxy.PathTo(0), Path::kMapped);
  const size_t n = 100000;
  auto* src = static_cast<unsigned char*>(shmem::Malloc(n));
  auto* dst = static_cast<unsigned char*>(shmem::Malloc(n));
  auto* sig = static_cast<uint64_t*>(shmem::Malloc(8, 8));
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(rng());
  const QueueView q = proxy.HostQueue(1);
  // 10 chunks, each followed by an add; then a fused write+add of nothing.
  for (int k = 0; k < 10; ++k) {
    PushWrite(q, 0, Offset(dst) + k * (n / 10), Offset(src) + k * (n / 10), n / 10);
    PushAtomicAdd(q, 0, Offset(sig), 1);
  }
  PushWriteAdd(q, 0, Offset(dst), Offset(src), 0, Offset(sig), 100);
  Quiet(q);
  EXPECT_EQ(std::memcmp(src, dst, n), 0);
  EXPECT_EQ(*sig, 110u);
  Barrier(q);
  Barrier(proxy.HostQueue(0));
  const ProxyStats st = proxy.Stats();
  EXPECT_EQ(st.commands, 24u);
  EXPECT_EQ(st.bytes_to_pe[0], n);
  EXPECT_EQ(st.bytes_by_path[static_cast<int>(Path::kMapped)], n);
  proxy.Close();
  EXPECT_THROW(PushWrite(q, 0, 0, 0, 1), InvalidStateError);
}

TEST_F(ProxyLocal, ABadCommandFailsTheProxyNamingTheValue) {
  ProxyOptions po;
  po.timeout = std::chrono::seconds(10);
  Proxy proxy(boot_, po);
  const QueueView q = proxy.HostQueue(0);
  PushWrite(q, 0, (8 << 20) - 4, 0, 8);
  try {
    Quiet(q);
    FAIL() << "quiet after a bad command returned";
  } catch (const TransportError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("queue 0 command 0 (write to pe 0)"), std::string::npos) << what;
    EXPECT_NE(what.find("to offset 8388604"), std::string::npos) << what;
  }
  EXPECT_THROW(proxy.CheckHealth(), TransportError);
  EXPECT_THROW(PushAtomicAdd(q, 3, 0, 1), TransportError);
}

TEST_F(ProxyLocal, OptionsAreChecked) {
  ProxyOptions po;
  po.num_queues = 0;
  EXPECT_THROW(Proxy(boot_, po), InvalidArgumentError);
}

}  // namespace
