// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The balanced mode's kernel parameters (filled by BalancedCuda, balanced/cuda.cu; the
// kernels are in balanced/kernels/data.cu). Plain C++: no CUDA types.

#include <cstdint>

#include "balanced/planner.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep::balanced {

// Up to three weights and three scales per prefetch_weight / reduce_grad call.
inline constexpr int kMaxPools = 6;

// Which op and stage a trap names.
enum : int { kOpDispatch = 0, kOpCombine = 1, kOpPrefetch = 2, kOpReduceGrad = 3 };
enum : int {
  kStageRowsWritten = 0,
  kStageDuplicatesSummed = 1,
  kStageWeightsWritten = 2,
  kStageSlotsRead = 3
};

// What every kernel of one Buffer shares: the heap, this rank, the block's regions
// (this rank's symmetric addresses) and the wait bound.
struct Common {
  shmem::DeviceContext ctx;
  PlanShape shape;
  int rank;
  int64_t hidden;
  uint16_t* shard;      // [NvS, H] bf16
  float* weights;       // [NvS]
  int32_t* dup_src;     // [NvS]
  int32_t* counts;      // [R, E]
  uint64_t* entry;      // [2, R]
  uint64_t* phase;      // [R]
  uint64_t timeout_ns;  // 0: wait forever
};

// One rank's plan as device pointers (RankPlan's fields).
struct DevicePlan {
  const int32_t* dst;
  const int32_t* experts_to_copy;
  const int32_t* zero_fill;
  int32_t* dup_groups;
  int32_t* dup_loffs;
  int32_t* dup_counts;
};

struct PoolArgs {
  int n;
  const char* locals[kMaxPools];
  char* pools[kMaxPools];
  int64_t bytes[kMaxPools];  // per expert (prefetch) or fp32 elements per expert (reduce)
};

}  // namespace mori::ep::balanced
