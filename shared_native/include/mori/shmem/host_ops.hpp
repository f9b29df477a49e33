// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// CPU counterpart of mori/shmem/device.cuh for host heaps: the same operations,
// with the same ordering guarantees, run by host threads on a DeviceContext from
// a host heap (peer_bases in host memory). mori-ep and mori-ccl implement their
// CPU protocols with these, so the protocols are tested without a GPU.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "mori/core/error.hpp"
#include "mori/shmem/context.hpp"

namespace mori::shmem::host {

template <typename T>
inline T* Ptr(const DeviceContext& ctx, T* sym, int pe) {
  return PeerPtr(ctx, sym, pe);
}

template <typename T>
inline T* CheckedPtr(const DeviceContext& ctx, T* sym, int pe) {
  MORI_CHECK_ARG(pe >= 0 && pe < ctx.n_pes, "pe ", pe, " out of range [0, ", ctx.n_pes, ")");
  T* p = PeerPtr(ctx, sym, pe);
  if (p == nullptr) {
    MORI_THROW(NotSupportedError, "pe ", pe, " is not load/store reachable from pe ", ctx.my_pe,
               " (another node)");
  }
  return p;
}

// Copies; no ordering with later signals beyond program order (use Fence or a
// signal, whose release orders them).
inline void PutNbi(const DeviceContext& ctx, void* dst_sym, const void* src, size_t nbytes,
                   int pe) {
  std::memcpy(CheckedPtr(ctx, static_cast<char*>(dst_sym), pe), src, nbytes);
}
inline void GetNbi(const DeviceContext& ctx, void* dst, const void* src_sym, size_t nbytes,
                   int pe) {
  std::memcpy(dst, CheckedPtr(ctx, static_cast<const char*>(src_sym), pe), nbytes);
}

inline void Fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void Quiet() { Fence(); }

inline void Put(const DeviceContext& ctx, void* dst_sym, const void* src, size_t nbytes, int pe) {
  PutNbi(ctx, dst_sym, src, nbytes, pe);
  Fence();
}
inline void Get(const DeviceContext& ctx, void* dst, const void* src_sym, size_t nbytes, int pe) {
  GetNbi(ctx, dst, src_sym, nbytes, pe);
  Fence();
}

// Release: every store this thread made before the signal is visible to a thread
// that observes the new value with WaitUntil (acquire).
inline void SignalSet(const DeviceContext& ctx, uint64_t* sig_sym, uint64_t value, int pe) {
  __atomic_store_n(CheckedPtr(ctx, sig_sym, pe), value, __ATOMIC_RELEASE);
}
inline void SignalAdd(const DeviceContext& ctx, uint64_t* sig_sym, uint64_t value, int pe) {
  __atomic_fetch_add(CheckedPtr(ctx, sig_sym, pe), value, __ATOMIC_RELEASE);
}

// Spins (pause, then yield, then short sleeps) until `Compare(*sig, cmp, value)`
// holds for this pe's copy; acquire. Returns the value seen. Throws TimeoutError
// naming the address, comparison and last value once `timeout` has passed.
inline uint64_t WaitUntil(const uint64_t* sig, Cmp cmp, uint64_t value,
                          std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (uint64_t spins = 0;; ++spins) {
    uint64_t v = __atomic_load_n(sig, __ATOMIC_ACQUIRE);
    if (Compare(v, cmp, value)) return v;
    if (spins < 2048) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      MORI_THROW(TimeoutError, "wait_until timed out after ", timeout.count() / 1000000,
                 " ms: signal at ", static_cast<const void*>(sig), " is ", v,
                 ", waiting for value ", CmpName(cmp), " ", value);
    }
    if (spins < 4096) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

// Barrier over every pe, the protocol BarrierAllBlock runs on the GPU: entering
// barrier k, pe i adds 1 to slot i of every pe's arrive array (release), then
// waits until each slot of its own array reaches k (acquire). `arrive` is a
// symmetric array of n_pes counters and `epoch` this pe's private count; both
// start at 0. All pes must be load/store reachable.
inline void BarrierAll(const DeviceContext& ctx, uint64_t* arrive, uint64_t* epoch,
                       std::chrono::nanoseconds timeout) {
  const uint64_t k = ++*epoch;
  for (int pe = 0; pe < ctx.n_pes; ++pe) SignalAdd(ctx, &arrive[ctx.my_pe], 1, pe);
  for (int pe = 0; pe < ctx.n_pes; ++pe) WaitUntil(&arrive[pe], Cmp::kGe, k, timeout);
}

}  // namespace mori::shmem::host
