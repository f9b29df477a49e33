// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device helpers for kernels that work on one op's symmetric block (mori.ep's modes,
// mori.ccl's collectives): addressing the block and the peers' copies of it, the
// pause before a trap that a peer caused, and the grid-completion counter.
// Header-only, for .cu files (without -rdc every translation unit gets its own copy).
//
// A kernel's parameter struct P serves as the block's view when it has
//   DeviceContext ctx;  // mori::shmem::GetDeviceContext() of the heap
//   char* block;        // this pe's address of the op's symmetric block

#include <cstddef>
#include <cstdint>

#include "mori/shmem/device.cuh"

namespace mori::shmem::device {

// This pe's region at `offset` of the block.
template <typename T, typename P>
__device__ __forceinline__ T* At(const P& p, size_t offset) {
  return reinterpret_cast<T*>(p.block + offset);
}

// pe's copy of this pe's region at `offset` (the caller checked at construction that
// every pe is load/store reachable).
template <typename T, typename P>
__device__ __forceinline__ T* PeerAt(const P& p, size_t offset, int pe) {
  return reinterpret_cast<T*>(p.ctx.peer_bases[pe] + (p.block - p.ctx.my_base) + offset);
}

// The longest pause before a pe traps because of a peer (a rejection, a mismatch the
// peer reported first). Two processes sharing one GPU whose kernels trap at the same
// instant can leave one launch never ending: on one H200, kernels that trapped
// together left the rejecting one's launch hanging in 10 of 20 runs; with the pause, 0
// of 12.
inline constexpr uint64_t kPeerTrapPauseNs = 1000000000;

// The pause for an op whose waits time out after timeout_ns: at most half of it.
__device__ __forceinline__ uint64_t PeerTrapPauseNs(uint64_t timeout_ns) {
  return timeout_ns / 2 < kPeerTrapPauseNs ? timeout_ns / 2 : kPeerTrapPauseNs;
}

// Spins (sleeping 100 us at a time) until `ns` nanoseconds of the global timer passed.
__device__ inline void PauseNs(uint64_t ns) {
  const uint64_t t0 = GlobalTimerNs();
  while (GlobalTimerNs() - t0 < ns) __nanosleep(100000);
}

// Every thread of the block: releases every store and put of the block at system scope
// (Quiet, i.e. fence.sc.sys by every thread), then thread 0 counts the block in
// *blocks_done; true in every thread of the grid's last block, which has then seen
// every block's stores released (a second system fence) and reset the counter to 0 for
// the next launch.
__device__ inline bool FinishBlock(uint32_t* blocks_done) {
  __shared__ bool last;
  Quiet();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t prev = atomicAdd(blocks_done, 1u);
    last = prev == gridDim.x - 1;
    if (last) {
      __threadfence_system();
      *blocks_done = 0;  // every block has counted: the next launch starts at 0
    }
  }
  __syncthreads();
  return last;
}

}  // namespace mori::shmem::device
