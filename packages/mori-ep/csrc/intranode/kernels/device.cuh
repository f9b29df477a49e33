// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device helpers shared by the intra-node dispatch and combine kernels
// (intranode_dispatch.cu, intranode_combine.cu): addressing the op's block and the
// peers' copies, the timeline stamps, torch's bf16 rounding (fp8's is in
// numeric.hpp), the rejection trap and the grid-completion counter.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "common/numeric.hpp"
#include "intranode/kernels/launch.hpp"
#include "mori/shmem/device.cuh"

namespace mori::ep::kernels {

namespace dev = mori::shmem::device;
using mori::shmem::Cmp;

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int64_t kGroupTokens = kCombineGroupTokens;
// How long a pe waits before trapping on a peer's rejection (TrapRejectedBy); at
// most half the op's timeout.
__device__ constexpr uint64_t kPeerTrapPauseNs = 1000000000;

template <typename T>
__device__ __forceinline__ T* At(const Common& c, size_t offset) {
  return reinterpret_cast<T*>(c.block + offset);
}

// pe's copy of this pe's region at `offset` (every pe is load/store reachable:
// the constructor checked).
template <typename T>
__device__ __forceinline__ T* PeerAt(const Common& c, size_t offset, int pe) {
  return reinterpret_cast<T*>(c.ctx.peer_bases[pe] + (c.block - c.ctx.my_base) + offset);
}

__device__ __forceinline__ EpDeviceState* State(const Common& c) {
  return At<EpDeviceState>(c, c.layout.state);
}

// MORI_EP_TIMELINE: the calling thread (by default thread 0 of the block) records when
// it reaches phase k (globaltimer, ns) in the launch's stamp buffer; off, one uniform
// branch.
__device__ __forceinline__ void Stamp(uint64_t* stamps, int k, bool who = threadIdx.x == 0) {
  if (stamps != nullptr && who && blockIdx.x < kTimelineBlocks) {
    stamps[blockIdx.x * kTimelineStamps + k] = dev::GlobalTimerNs();
  }
}

// torch's float -> bf16 conversion (round to nearest even, NaN to 0x7FC0), as in
// intranode_cpu.cpp, so both implementations produce the same bits.
__device__ __forceinline__ uint16_t FloatToBFloat16(float f) {
  if (f != f) return 0x7FC0;
  uint32_t bits = __float_as_uint(f);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

__device__ __forceinline__ float BFloat16ToFloat(uint32_t v16) {
  return __uint_as_float(v16 << 16);
}

// Ends this pe's launch because pe `from` rejected the op (its inputs failed
// validation). The rejecting pe's own blocks trap at once, silently (it printed the
// reason); another pe says who rejected and traps only after a pause, so that the
// two processes' launches do not fail at the same instant: on one H200 shared by two
// processes, kernels that trapped together left the rejecting one's launch never
// ending in 10 of 20 runs; with the pause, 0 of 12 (the peer fails 1.3-1.4 s after
// its launch, the rejecting pe 0.5-0.8 s).
__device__ inline void PauseBeforePeerTrap(uint64_t timeout_ns) {
  const uint64_t pause = std::min<uint64_t>(timeout_ns / 2, kPeerTrapPauseNs);
  const uint64_t t0 = dev::GlobalTimerNs();
  while (dev::GlobalTimerNs() - t0 < pause) __nanosleep(100000);
}

__device__ inline void PauseBeforePeerTrap(const Common& c) { PauseBeforePeerTrap(c.timeout_ns); }

// Set by the first thread of this module that prints a trap's message. A trap ends
// the context, so it is never reset.
static __device__ unsigned g_trap_reported = 0;

// True in the first thread that asks (every other detecting thread stays silent). That
// thread calls dev::TrapReported after printing; the others trap through
// dev::TrapAfterReport, which waits for the message.
__device__ inline bool FirstTrapReport() { return atomicExch(&g_trap_reported, 1u) == 0u; }

// Prints nothing on the rejecting pe (its reporting thread printed the reason, or the
// host did).
__device__ inline void TrapRejectedBy(const Common& c, int from, const char* op) {
  if (from != c.me) {
    printf(
        "mori.ep %s on rank %d: %s rejected by rank %d (its inputs failed validation; see its "
        "error)\n",
        op, c.me, op, from);
    dev::TrapReported();
    PauseBeforePeerTrap(c);
  }
  dev::TrapAfterReport();
}

// Release every put of the block, then count the block as finished; true in the
// one block that finishes last (it then sees every block's puts as released).
__device__ inline bool FinishBlock(uint32_t* blocks_done) {
  __shared__ bool last;
  dev::Quiet();
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

}  // namespace mori::ep::kernels
