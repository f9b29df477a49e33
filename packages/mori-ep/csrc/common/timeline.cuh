// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The kernels' side of common/timeline.hpp.
#include <cstdint>

#include "common/timeline.hpp"
#include "mori/shmem/device.cuh"

namespace mori::ep {

// The calling thread (by default thread 0 of the block) records when it reaches stamp
// k of a part (`stamps`: KernelTimeline::Begin's, null when off: one uniform branch).
static __device__ __forceinline__ void Stamp(uint64_t* stamps, int k, bool who = threadIdx.x == 0) {
  if (stamps != nullptr && who && blockIdx.x < kTimelineBlocks) {
    stamps[blockIdx.x * kTimelineStamps + k] = mori::shmem::device::GlobalTimerNs();
  }
}

}  // namespace mori::ep
