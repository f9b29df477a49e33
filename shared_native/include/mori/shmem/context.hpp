// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MORI_HOST_DEVICE __host__ __device__
#else
#define MORI_HOST_DEVICE
#endif

namespace mori::shmem {

enum class SignalOp : int { kSet = 0, kAdd = 1 };
enum class Cmp : int { kEq = 0, kNe, kGt, kGe, kLt, kLe };

MORI_HOST_DEVICE inline bool Compare(uint64_t lhs, Cmp cmp, uint64_t rhs) {
  switch (cmp) {
    case Cmp::kEq:
      return lhs == rhs;
    case Cmp::kNe:
      return lhs != rhs;
    case Cmp::kGt:
      return lhs > rhs;
    case Cmp::kGe:
      return lhs >= rhs;
    case Cmp::kLt:
      return lhs < rhs;
    case Cmp::kLe:
      return lhs <= rhs;
  }
  return false;
}

MORI_HOST_DEVICE inline const char* CmpName(Cmp cmp) {
  switch (cmp) {
    case Cmp::kEq:
      return "==";
    case Cmp::kNe:
      return "!=";
    case Cmp::kGt:
      return ">";
    case Cmp::kGe:
      return ">=";
    case Cmp::kLt:
      return "<";
    case Cmp::kLe:
      return "<=";
  }
  return "?";
}

// Everything a kernel (or a host thread, for host heaps) needs to address the
// symmetric heap. Trivially copyable: pass it to kernels by value, so launches
// stay capturable in CUDA graphs. Obtained from mori::shmem::GetDeviceContext().
//
// Symmetric addresses: an allocation has the same offset in every pe's heap, so
// pe p's copy of local symmetric pointer s is peer_bases[p] + (s - my_base).
struct DeviceContext {
  // n_pes entries, readable where the context is used (device memory for CUDA
  // heaps, host memory for host heaps); nullptr where pe is not load/store
  // reachable from this process (another node).
  char* const* peer_bases;
  char* my_base;
  uint64_t heap_size;
  int my_pe;
  int n_pes;
  // Internal symmetric block of n_pes counters: entry j counts the barriers pe j
  // has entered (used by the device/host barrier_all protocol).
  uint64_t* barrier_arrive;
  // Local (not symmetric) counter of barriers this pe entered; it lives in the
  // heap's memory so that graph replays advance it.
  uint64_t* barrier_epoch;
};

template <typename T>
MORI_HOST_DEVICE inline T* PeerPtr(const DeviceContext& ctx, T* sym, int pe) {
  char* base = ctx.peer_bases[pe];
  if (base == nullptr) return nullptr;
  return reinterpret_cast<T*>(
      base +
      (reinterpret_cast<char*>(const_cast<void*>(static_cast<const void*>(sym))) - ctx.my_base));
}

}  // namespace mori::shmem
