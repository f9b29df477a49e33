// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The kernels' wait for a peer's signal word (common/peer_wait.hpp): on a timeout the
// first thread of the module to see one prints which rank did not arrive at which
// stage (the CPU implementations' words, prefixed "mori.ep "), and every waiting
// thread traps. Internal linkage: each kernel file gets its own copy (no -rdc).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "common/peer_wait.hpp"
#include "mori/shmem/device.cuh"

namespace mori::ep {

namespace {

// Set by the first thread of this module that reports a lost rank (a trap ends the
// context, so it is never reset).
__device__ unsigned g_lost_rank_reported = 0;

// Not inlined, scalars only, so that the waits keep their registers.
__device__ __noinline__ void TrapLostRank(const char* op, uint64_t call, int me, int peer,
                                          const char* stage, uint64_t timeout_ns,
                                          uint64_t last_call) {
  if (atomicExch(&g_lost_rank_reported, 1u) == 0u) {
    printf("mori.ep " MORI_EP_LOST_RANK_FORMAT " [block %d thread %d]\n", op,
           static_cast<unsigned long long>(call), me, peer, stage,
           static_cast<unsigned long long>(timeout_ns / 1000000),
           static_cast<unsigned long long>(last_call), blockIdx.x, threadIdx.x);
    mori::shmem::device::TrapReported();
  }
  mori::shmem::device::TrapAfterReport();
}

// Spins with acquire loads until pe `peer`'s word `*word` (this pe's copy) >= floor and
// returns it; with timeout_ns > 0, traps after it naming the rank and the stage.
__device__ __forceinline__ uint64_t WaitPeerWord(const uint64_t* word, uint64_t floor,
                                                 uint64_t timeout_ns, int me, int peer,
                                                 const char* op, uint64_t call, const char* stage,
                                                 int call_shift) {
  namespace dev = mori::shmem::device;
  uint64_t seen = dev::LoadAcquire(word);
  if (seen >= floor) return seen;
  const uint64_t start = timeout_ns ? dev::GlobalTimerNs() : 0;
  for (;;) {
    seen = dev::LoadAcquire(word);
    if (seen >= floor) return seen;
    if (timeout_ns && dev::GlobalTimerNs() - start > timeout_ns) {
      TrapLostRank(op, call, me, peer, stage, timeout_ns, seen >> call_shift);
    }
  }
}

}  // namespace

}  // namespace mori::ep
