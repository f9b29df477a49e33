// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The balanced mode's data paths on a host symmetric heap (the CPU implementation; the
// README's "Balanced mode" and docs/balanced.md state the semantics). Every call is
// collective and starts by exchanging each rank's verdict on its own inputs: a rank
// that found its inputs bad makes every rank throw InvalidArgumentError with its
// reason, before any byte moves. Every wait is bounded by the timeout and names the
// rank and stage that did not arrive; after a timeout the object refuses calls.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "balanced/planner.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep::balanced {

// The op's symmetric block: offsets in bytes, each 256-aligned.
struct BlockLayout {
  size_t hidden;   // [NvS, H] bf16: this rank's received rows (the shard)
  size_t weights;  // [NvS] fp32: the route weight of each received pair
  size_t dup_src;  // [NvS] int32: a duplicate slot's primary slot, written by senders
  size_t counts;   // [R, E] int32: every rank's tokens_per_expert (row r from rank r)
  size_t reasons;  // [2, R, kReasonBytes]: a refusing rank's reason, by call parity
  size_t entry;    // [2, R] uint64: each rank's verdict word, by call parity
  size_t phase;    // [R] uint64: each rank's barrier count
  size_t total_bytes;
};

inline constexpr size_t kReasonBytes = 512;

// What a call is, in its verdict word (call << 4 | kind << 1 | refused): ranks that
// call different things in the same call fail it (a refusal, kind kAny, wins).
enum CallKind : uint32_t {
  kAny = 0,
  kPlanned = 1,   // dispatch that plans
  kReplayed = 2,  // dispatch with a saved plan
  kCombineCall = 3,
  kPrefetchCall = 4,
  kReduceGradCall = 5,
};

MORI_HOST_DEVICE inline uint64_t VerdictWord(uint64_t call, uint32_t kind, bool refused) {
  return (call << 4) | (static_cast<uint64_t>(kind) << 1) | (refused ? 1u : 0u);
}

MORI_HOST_DEVICE inline const char* CallKindName(uint32_t kind) {
  switch (kind) {
    case kPlanned:
      return "dispatch (planning)";
    case kReplayed:
      return "dispatch (with a saved plan)";
    case kCombineCall:
      return "combine";
    case kPrefetchCall:
      return "prefetch_weight";
    case kReduceGradCall:
      return "reduce_grad";
    default:
      return "a refused call";
  }
}

BlockLayout MakeBlockLayout(const PlanShape& shape, int64_t hidden);

// One rank's plan as the data paths use it (caller-owned arrays; mori.ep.balanced.Plan).
struct RankPlan {
  int32_t* dst;              // [S*K]
  int32_t* experts_to_copy;  // [R, epn]
  int32_t* zero_fill;        // [2*epn, 2]
  int32_t* dup_groups;       // [NvS, 3]
  int32_t* dup_loffs;        // [NvS]
  int32_t* dup_counts;       // [2]
};

class BalancedCpu {
 public:
  // Collective: checks the block (symmetric, every pe reachable), clears this rank's
  // words and runs a heap barrier.
  BalancedCpu(const PlanShape& shape, int64_t hidden, int rank, void* block,
              std::chrono::milliseconds timeout);

  // Fresh planning: checks tpe [E] and topk [S, K] (reason appended to `reason` when
  // bad), exchanges counts and verdicts, then fills every rank's tables (`tables`,
  // each [R, ...]) and this rank's dst. Refused on every rank when any rank's inputs
  // are bad.
  void Plan(const int32_t* tpe, const int32_t* topk, std::string reason, const PlanTables& tables,
            int32_t* dst);
  // Writes this rank's rows (hidden [S, H] bf16 rows of `row_stride` elements, weights
  // [S, K] fp32 or null) to their slots, then builds (fresh: the dup tables from what
  // the senders wrote) and expands this rank's duplicates and zeroes its pad rows.
  // `fresh` follows Plan in the same call; otherwise the call starts with a verdict
  // exchange (`reason`).
  void Dispatch(const RankPlan& plan, const uint16_t* hidden, int64_t row_stride,
                const float* weights, bool fresh, const std::string& reason);
  // Copies hidden_nvsh / weights_nvs into the shard unless they are it, adds each
  // duplicate group into its primary (fp32, rounded once to bf16 in place), then
  // gathers: out[t] = bf16(fp32 sum of the token's primary rows in k order),
  // out_weights[t, k] = the weight at the pair's slot.
  void Combine(const RankPlan& plan, const uint16_t* hidden_nvsh, const float* weights_nvs,
               uint16_t* out, float* out_weights, const std::string& reason);
  // Each owner writes its experts' weights into every slot that plans them (pool
  // [R, epn, per-expert bytes] symmetric, rank d's slots at [d] of rank d's copy).
  void Prefetch(const int32_t* experts_to_copy, const std::vector<const char*>& locals,
                const std::vector<char*>& pools, const std::vector<int64_t>& expert_bytes,
                const std::string& reason);
  // Each owner adds its experts' slot gradients (fp32) into local grads in ascending
  // (rank, slot) order, then every rank zeroes its own consumed slots.
  void ReduceGrad(const int32_t* experts_to_copy, const std::vector<float*>& locals,
                  const std::vector<float*>& pools, const std::vector<int64_t>& expert_elems,
                  const std::string& reason);

  // A call that only refuses: exchanges `reason` (non-empty) and throws.
  [[noreturn]] void Refuse(const char* op, const std::string& reason);

  const BlockLayout& layout() const { return layout_; }
  uint64_t calls() const { return calls_; }

 private:
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(block_ + offset);
  }
  // Posts this rank's verdict on call `calls_ + 1` and waits for every rank's; throws
  // InvalidArgumentError on every rank when one refused or the ranks' kinds differ.
  void Enter(const char* op, uint32_t kind, const std::string& reason);
  // A barrier over every rank at `stage` of `op`.
  void Barrier(const char* op, const char* stage);
  void CheckUsable(const char* op) const;
  void ExpandAndZero(const RankPlan& plan);

  PlanShape shape_;
  int64_t hidden_;
  int rank_;
  BlockLayout layout_;
  char* block_;
  shmem::DeviceContext ctx_;
  std::chrono::milliseconds timeout_;
  uint64_t calls_ = 0;
  uint64_t phases_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace mori::ep::balanced
