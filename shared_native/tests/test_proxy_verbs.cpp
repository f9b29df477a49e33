// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The proxy's verbs transport over the loopback double (src/transport/verbs/
// loopback_port.hpp): pes are threads of this process with their own host heaps, the
// queue-pair exchange runs over a real TCP bootstrap. What is checked: bytes land bit
// for bit (writes cut at the port's message size), an add lands after every earlier
// write to that pe, a write's source may be reused when PostWrite returns, fences and
// notifies, tiny queues (send-queue room, receives reposted while the sender waits),
// and the errors: a pe that could not open a port fails every pe, a lost peer, a
// remote access error and a bad add offset are named. No NIC is involved: the
// transport has NOT run against one.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mori/bootstrap/bootstrap.hpp"
#include "mori/core/error.hpp"
#include "proxy/verbs_transport.hpp"
#include "transport/verbs/loopback_port.hpp"

namespace {

using namespace std::chrono_literals;
using mori::bootstrap::TcpBootstrap;
using mori::bootstrap::TcpBootstrapOptions;
using mori::proxy::Completion;
using mori::proxy::internal::HeapAccess;
using mori::proxy::internal::PeerInfo;
using mori::proxy::internal::VerbsOptions;
using mori::proxy::internal::VerbsTransport;

// Runs fn(rank, bootstrap) on `world` threads and rethrows the first failure.
void RunRanks(int world, const std::function<void(int, TcpBootstrap&)>& fn) {
  TcpBootstrapOptions root_opts;
  root_opts.rank = 0;
  root_opts.world_size = world;
  root_opts.timeout = 20s;
  auto root = std::make_unique<TcpBootstrap>(root_opts);
  const int port = root->Port();
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

// One pe: its heap (8-byte aligned) and what the transport knows of the job.
struct Pe {
  Pe(int rank, int world, size_t bytes) : mem(bytes / 8 + 1, 0) {
    heap = HeapAccess(rank, world, reinterpret_cast<char*>(mem.data()), bytes, false, 0);
    for (int p = 0; p < world; ++p) {
      PeerInfo info;
      info.node = "n" + std::to_string(p);
      heap.peers().push_back(info);
    }
  }
  char* base() const { return heap.my_base(); }
  uint64_t Load(uint64_t offset) const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(base() + offset), __ATOMIC_ACQUIRE);
  }
  std::vector<uint64_t> mem;
  HeapAccess heap;
};

VerbsOptions SmallQueues() {
  VerbsOptions o;
  o.timeout_ms = 30000;
  o.send_depth = 16;  // room runs out often
  o.recv_depth = 3;   // SENDs wait for reposted receives
  o.signal_interval = 4;
  return o;
}

std::unique_ptr<VerbsTransport> Open(Pe& pe, TcpBootstrap& boot, const VerbsOptions& o,
                                     uint64_t max_message = 4096) {
  auto t = std::make_unique<VerbsTransport>(
      &pe.heap, mori::transport::verbs::testing::CreateLoopbackPort(max_message), "", o);
  t->Connect(boot, std::vector<uint8_t>(pe.heap.n_pes(), 1));
  return t;
}

// Polls until pred() holds (bounded), collecting completions into *seen.
void PollUntil(VerbsTransport& t, std::vector<Completion>* seen, const std::function<bool()>& pred,
               const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!pred()) {
    t.Poll(seen);
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error(std::string("timed out waiting for ") + what);
    }
    std::this_thread::yield();
  }
}

size_t Count(const std::vector<Completion>& seen, Completion::Kind kind, int pe, uint64_t value) {
  size_t n = 0;
  for (const Completion& c : seen) n += c.kind == kind && c.pe == pe && c.value == value;
  return n;
}

uint8_t Byte(unsigned seed, int from, int to, int round, size_t i) {
  uint64_t x = (uint64_t(seed) << 32) ^ (uint64_t(from) << 24) ^ (uint64_t(to) << 16) ^
               (uint64_t(round) << 40) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 32);
}

// Layout of every heap: counters[world] | source block | inbound[from][round] blocks.
constexpr int kRounds = 40;
constexpr size_t kMaxBlock = 9000;  // > 2 messages of 4096: writes are cut

TEST(ProxyVerbs, AllToAllWritesThenAddsLandInOrderBitForBit) {
  const int world = 3;
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  const size_t counters = 64;
  const size_t src_at = counters;
  const size_t in_at = src_at + kMaxBlock + 8;
  const size_t heap_bytes = in_at + size_t(world) * kRounds * kMaxBlock;
  std::atomic<int> finished{0};
  RunRanks(world, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, world, heap_bytes);
    auto t = Open(pe, boot, SmallQueues());
    EXPECT_STREQ(t->Name(), "verbs");
    std::mt19937 rng(seed + me);
    std::vector<Completion> seen;
    std::vector<int> checked(world, 0);
    // Checks every round whose add has been applied here: its bytes must be there.
    auto check = [&] {
      for (int from = 0; from < world; ++from) {
        if (from == me) continue;
        const int applied = static_cast<int>(pe.Load(from * 8));
        for (; checked[from] < applied; ++checked[from]) {
          const int r = checked[from];
          const size_t len = 1 + (uint64_t(seed) * 31 + from * 7 + me * 3 + r * 977) % kMaxBlock;
          const char* in = pe.base() + in_at + (size_t(from) * kRounds + r) * kMaxBlock;
          for (size_t i = 0; i < len; ++i) {
            ASSERT_EQ(static_cast<uint8_t>(in[i]), Byte(seed, from, me, r, i))
                << "pe " << me << " from " << from << " round " << r << " byte " << i;
          }
        }
      }
    };
    for (int r = 0; r < kRounds; ++r) {
      for (int step = 1; step < world; ++step) {
        const int to = (me + step) % world;
        const size_t len = 1 + (uint64_t(seed) * 31 + me * 7 + to * 3 + r * 977) % kMaxBlock;
        // The source is rewritten for every write: PostWrite must have finished with it.
        for (size_t i = 0; i < len; ++i) pe.base()[src_at + i] = Byte(seed, me, to, r, i);
        t->PostWrite(to, in_at + (size_t(me) * kRounds + r) * kMaxBlock, src_at, len);
        t->PostAtomicAdd(to, me * 8, 1);
      }
      if (rng() % 4 == 0) t->Poll(&seen);
      check();
    }
    // Fences: everything posted to `to` before them has been applied there.
    for (int step = 1; step < world; ++step) t->PostFence((me + step) % world, 100 + me);
    PollUntil(
        *t, &seen,
        [&] {
          check();
          size_t acks = 0;
          for (int step = 1; step < world; ++step) {
            acks += Count(seen, Completion::Kind::kFenceAck, (me + step) % world, 100 + me);
          }
          return acks == size_t(world - 1);
        },
        "fence acks");
    // A notify to everyone; each pe's arrives after its adds.
    for (int step = 1; step < world; ++step) t->PostNotify((me + step) % world, 7);
    PollUntil(
        *t, &seen,
        [&] {
          size_t n = 0;
          for (int from = 0; from < world; ++from)
            n += Count(seen, Completion::Kind::kNotify, from, 7);
          return n == size_t(world - 1);
        },
        "notifies");
    check();
    for (int from = 0; from < world; ++from) {
      if (from != me) {
        EXPECT_EQ(pe.Load(from * 8), uint64_t(kRounds)) << "pe " << me;
      }
    }
    // The loopback double moves a pe's WRs when that pe polls (as a NIC moves them
    // without being asked): keep polling until every pe has what it waits for.
    ++finished;
    PollUntil(*t, &seen, [&] { return finished.load() == world; }, "the other pes");
    boot.Barrier();
    t->Shutdown();
  });
}

TEST(ProxyVerbs, ManyAddsThroughThreeReceivesAreExact) {
  std::atomic<bool> done{false};
  RunRanks(2, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, 2, 4096);
    auto t = Open(pe, boot, SmallQueues());
    std::vector<Completion> seen;
    const int adds = 500;
    if (me == 0) {
      for (int i = 0; i < adds; ++i) t->PostAtomicAdd(1, 8, uint64_t(i) + 1);
      t->PostNotify(1, 1);
    } else {
      PollUntil(
          *t, &seen, [&] { return Count(seen, Completion::Kind::kNotify, 0, 1) == 1; },
          "the notify after 500 adds");
      EXPECT_EQ(pe.Load(8), uint64_t(adds) * (adds + 1) / 2);
      done = true;
    }
    // pe 0's SENDs move while it polls.
    if (me == 0) PollUntil(*t, &seen, [&] { return done.load(); }, "pe 1 to see the adds");
    boot.Barrier();
  });
}

TEST(ProxyVerbs, ShutdownDeliversWhatWasPostedBeforeTheQueuePairsGo) {
  RunRanks(2, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, 2, 4096);
    auto t = Open(pe, boot, SmallQueues());
    if (me == 0) {
      for (int i = 0; i < 5; ++i) t->PostAtomicAdd(1, 8, 1);  // unsignaled SENDs
      t->PostNotify(1, 9);
      t->Shutdown();
      t.reset();  // its QPs are gone
    } else {
      // Polls (reposting receives) while pe 0 shuts down, as a proxy thread does.
      std::vector<Completion> seen;
      PollUntil(
          *t, &seen, [&] { return Count(seen, Completion::Kind::kNotify, 0, 9) == 1; },
          "the notify posted before the peer shut down");
      EXPECT_EQ(pe.Load(8), 5u);
    }
    boot.Barrier();
  });
}

TEST(ProxyVerbs, APeWithoutAPortFailsEveryPeNamingIt) {
  std::atomic<int> failures{0};
  RunRanks(2, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, 2, 4096);
    std::unique_ptr<mori::transport::verbs::RdmaPort> port;
    if (me == 0) port = mori::transport::verbs::testing::CreateLoopbackPort();
    VerbsTransport t(&pe.heap, std::move(port), me == 1 ? "no RDMA device here" : "",
                     SmallQueues());
    try {
      t.Connect(boot, {1, 1});
    } catch (const mori::NotSupportedError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("pe 1 (node 'n1'): no RDMA device here"), std::string::npos) << what;
      EXPECT_NE(what.find("MORI_PROXY_TRANSPORT=verbs"), std::string::npos) << what;
      ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 2);
}

// A port whose queue pairs refuse to connect (a NIC's modify_qp failing), around the
// loopback double.
class RefusingPort final : public mori::transport::verbs::RdmaPort {
 public:
  RefusingPort() : inner_(mori::transport::verbs::testing::CreateLoopbackPort()) {}
  std::string Describe() const override { return "refusing port"; }
  uint64_t max_message_bytes() const override { return inner_->max_message_bytes(); }
  int cq_depth() const override { return inner_->cq_depth(); }
  mori::transport::verbs::MemoryKeys Register(void* addr, uint64_t length) override {
    return inner_->Register(addr, length);
  }
  std::unique_ptr<mori::transport::verbs::RdmaQueuePair> CreateQp(uint32_t s, uint32_t r) override {
    struct Qp final : mori::transport::verbs::RdmaQueuePair {
      std::unique_ptr<mori::transport::verbs::RdmaQueuePair> qp;
      mori::transport::verbs::EndpointInfo LocalEndpoint() const override {
        return qp->LocalEndpoint();
      }
      void Connect(const mori::transport::verbs::QpConfig&,
                   const mori::transport::verbs::EndpointInfo&) override {
        MORI_THROW(TransportError, "ibv_modify_qp INIT->RTR failed (test)");
      }
      int PostSend(const mori::transport::verbs::SendOp* o, size_t n) override {
        return qp->PostSend(o, n);
      }
      int PostRecv(const mori::transport::verbs::RecvOp* o, size_t n) override {
        return qp->PostRecv(o, n);
      }
      uint32_t send_depth() const override { return qp->send_depth(); }
      uint32_t recv_depth() const override { return qp->recv_depth(); }
    };
    auto q = std::make_unique<Qp>();
    q->qp = inner_->CreateQp(s, r);
    return q;
  }
  int Poll(mori::transport::verbs::WorkCompletion* out, int max) override {
    return inner_->Poll(out, max);
  }

 private:
  std::unique_ptr<mori::transport::verbs::RdmaPort> inner_;
};

TEST(ProxyVerbs, AQueuePairThatCannotConnectFailsEveryPeNamingIt) {
  std::atomic<int> failures{0};
  RunRanks(2, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, 2, 4096);
    std::unique_ptr<mori::transport::verbs::RdmaPort> port =
        me == 1 ? std::make_unique<RefusingPort>()
                : mori::transport::verbs::testing::CreateLoopbackPort();
    VerbsTransport t(&pe.heap, std::move(port), "", SmallQueues());
    try {
      t.Connect(boot, {1, 1});
    } catch (const mori::TransportError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("pe 1 (node 'n1'): ibv_modify_qp INIT->RTR failed (test)"),
                std::string::npos)
          << what;
      ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 2);
}

TEST(ProxyVerbs, ALostPeerIsNamed) {
  RunRanks(2, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, 2, 1 << 16);
    auto t = Open(pe, boot, SmallQueues());
    if (me == 1) {
      t.reset();  // its QPs and port are gone: the peer's WRs are not answered
      boot.Barrier();
      return;
    }
    boot.Barrier();
    try {
      t->PostWrite(1, 0, 64, 100);
      FAIL() << "a write to a lost pe completed";
    } catch (const mori::TransportError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("pe 1 (node 'n1') lost over RDMA"), std::string::npos) << what;
      EXPECT_NE(what.find("IBV_WC_RETRY_EXC_ERR"), std::string::npos) << what;
    }
  });
}

TEST(ProxyVerbs, RemoteAccessOutsideTheHeapIsNamed) {
  RunRanks(2, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, 2, 1 << 16);
    auto t = Open(pe, boot, SmallQueues());
    if (me == 0) {
      try {
        t->PostWrite(1, (1 << 16) - 8, 0, 64);  // runs past the end of pe 1's heap
        FAIL() << "a write outside the remote heap completed";
      } catch (const mori::TransportError& e) {
        EXPECT_NE(std::string(e.what()).find("IBV_WC_REM_ACCESS_ERR"), std::string::npos)
            << e.what();
      }
    }
    boot.Barrier();
  });
}

TEST(ProxyVerbs, ABadAddOffsetFailsTheReceiverNamingTheSender) {
  std::atomic<bool> done{false};
  RunRanks(2, [&](int me, TcpBootstrap& boot) {
    Pe pe(me, 2, 4096);
    auto t = Open(pe, boot, SmallQueues());
    if (me == 0) {
      t->PostAtomicAdd(1, 12, 1);  // not 8-byte aligned
      std::vector<Completion> seen;
      PollUntil(*t, &seen, [&] { return done.load(); }, "pe 1 to fail");
    } else {
      std::vector<Completion> seen;
      try {
        PollUntil(*t, &seen, [] { return false; }, "an error");
      } catch (const mori::TransportError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("pe 0 (node 'n0')"), std::string::npos) << what;
        EXPECT_NE(what.find("signal offset 12"), std::string::npos) << what;
      }
      done = true;
    }
    boot.Barrier();
  });
}

}  // namespace
