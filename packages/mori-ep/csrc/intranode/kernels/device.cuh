// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device helpers shared by the intra-node dispatch and combine kernels (dispatch.cu,
// combine.cu): the device state, torch's bf16 rounding (fp8's is
// in common/numeric.hpp) and the rejection trap. Addressing the op's block and the
// peers' copies, the peer-trap pause and the grid-completion counter are mori-core's
// (mori/shmem/block_device.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "common/launch_api.hpp"
#include "common/numeric.hpp"
#include "common/peer_wait.cuh"
#include "common/timeline.cuh"
#include "intranode/kernels/params.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/block_device.cuh"
#include "mori/shmem/device.cuh"

namespace mori::ep::intranode {

namespace dev = mori::shmem::device;
using dev::At;
using dev::FinishBlock;
using dev::PeerAt;
using mori::shmem::Cmp;

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int64_t kGroupTokens = kCombineGroupTokens;

__device__ __forceinline__ EpDeviceState* State(const Common& c) {
  return At<EpDeviceState>(c, c.layout.state);
}

// torch's float -> bf16 conversion (round to nearest even, NaN to 0x7FC0), as in
// intranode/cpu.cpp, so both implementations produce the same bits.
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
// reason); another pe says who rejected and traps only after a pause
// (dev::PeerTrapPauseNs), so that the two processes' launches do not fail at the same
// instant (the peer fails 1.3-1.4 s after its launch, the rejecting pe 0.5-0.8 s).
__device__ inline void PauseBeforePeerTrap(uint64_t timeout_ns) {
  dev::PauseNs(dev::PeerTrapPauseNs(timeout_ns));
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

}  // namespace mori::ep::intranode
