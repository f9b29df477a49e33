// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The balanced mode's data paths on a CUDA heap: BalancedCpu's operations (cpu.hpp) as
// kernels on a stream (balanced/kernels/data.cu, the planner in kernels/planner.cu),
// with BalancedCpu's signatures plus the stream. No host synchronisation: a bad input
// found on the host is refused on this rank (InvalidArgumentError) and makes every
// other rank's kernel trap naming it; a bad expert id or count found by the planner
// traps on this rank; a lost rank traps, named, on the others (common/peer_wait.cuh).

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "balanced/cpu.hpp"
#include "balanced/kernels/params.hpp"
#include "balanced/planner.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep::balanced {

class BalancedCuda {
 public:
  // Collective: checks the block, clears this rank's words, runs a heap barrier.
  BalancedCuda(const PlanShape& shape, int64_t hidden, int rank, void* block, int device,
               std::chrono::milliseconds timeout);
  ~BalancedCuda();
  BalancedCuda(const BalancedCuda&) = delete;
  BalancedCuda& operator=(const BalancedCuda&) = delete;

  void Plan(const int32_t* tpe, const int32_t* topk, const std::string& reason,
            const PlanTables& tables, int32_t* dst, uintptr_t stream);
  void Dispatch(const RankPlan& plan, const uint16_t* hidden, int64_t row_stride,
                const float* weights, bool fresh, const std::string& reason, uintptr_t stream);
  void Combine(const RankPlan& plan, const uint16_t* hidden_nvsh, const float* weights_nvs,
               uint16_t* out, float* out_weights, const std::string& reason, uintptr_t stream);
  // copy_engine: the pushes as peer copies on copy engines (one stream synchronisation
  // to read the slots' experts) instead of a kernel's stores.
  void Prefetch(const int32_t* experts_to_copy, const std::vector<const char*>& locals,
                const std::vector<char*>& pools, const std::vector<int64_t>& expert_bytes,
                const std::string& reason, bool copy_engine, uintptr_t stream);
  void ReduceGrad(const int32_t* experts_to_copy, const std::vector<float*>& locals,
                  const std::vector<float*>& pools, const std::vector<int64_t>& expert_elems,
                  const std::string& reason, uintptr_t stream);
  [[noreturn]] void Refuse(const char* op, const std::string& reason, uintptr_t stream);

  uint64_t calls() const { return calls_; }

 private:
  void Enter(int op, uint32_t kind, const char* name, const std::string& reason, const int32_t* tpe,
             uintptr_t stream);
  PoolArgs Pools(const char* op, const std::vector<const char*>& locals,
                 const std::vector<char*>& pools, const std::vector<int64_t>& sizes, int64_t unit,
                 std::string& why) const;

  PlanShape shape_;
  int64_t hidden_;
  int rank_;
  int device_;
  BlockLayout layout_;
  char* block_;
  shmem::DeviceContext ctx_;
  uint64_t timeout_ns_;
  Common common_;
  int32_t* error_ = nullptr;         // [4] the planner's error record
  int32_t* scratch_ = nullptr;       // [2, NvS] the duplicate groups' scratch
  int32_t* plan_scratch_ = nullptr;  // [PlannerScratchWords] the planner's chunk counts
  uint64_t calls_ = 0;
  uint64_t phases_ = 0;
};

}  // namespace mori::ep::balanced
