// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The balanced mode's planner (MoonEP's constructive planner; docs/balanced.md walks
// through it). From the gathered counts tpe[r][e] (tokens of source rank r routed to
// expert e; every row sums to S*K) it decides, deterministically and with every tie
// going to the lowest index, which destination rank receives which tokens of each
// expert, so that every rank receives exactly S*K (token, expert) pairs:
//
//  1. balance[h] = (tokens of home group h's epn experts) - S*K. While some balance is
//     positive, the most overloaded group h fills the roomiest rank u completely
//     (quota z[h][u] = -balance[u]); so a rank receives from at most one remote home
//     group, hence at most epn remote experts.
//  2. Each overloaded group h pays its quotas: repeatedly the largest quota left takes
//     min(quota, remaining) tokens from the group's expert with the most tokens left.
//  3. Per destination rank: the remote experts it holds (ascending ids: its prefetch
//     slots), and its slot layout over 2*epn groups (local experts, then the prefetch
//     slots), each non-empty group padded up to token_padding rows.
//  4. Per (token, k) of one source rank: dst = rank * NvS + slot, the tokens of expert
//     e ordered by (source rank, token, k) and cut across destinations in ascending
//     rank order; a later k of a token going to a rank an earlier k already goes to is
//     stored as -dst - 1 (its row crosses once and is expanded there).
//
// The CPU functions here and the CUDA kernel (balanced/kernels/planner.cu) compute the
// same tables; the kernel runs on every rank from the gathered counts (no multicast).

#include <cstdint>

#include "mori/shmem/context.hpp"  // MORI_HOST_DEVICE

namespace mori::ep::balanced {

// The planner's problem size. NvS = align_up(S*K + (token_padding - 1) * 2 * epn,
// token_padding): a rank's slot count, enough for any plan.
struct PlanShape {
  int ranks;          // R
  int experts;        // E, a multiple of R
  int64_t tokens;     // S, tokens per rank
  int top_k;          // K
  int token_padding;  // each non-empty group's rows are padded to a multiple of this

  MORI_HOST_DEVICE int epn() const { return experts / ranks; }
  MORI_HOST_DEVICE int64_t capacity() const { return tokens * top_k; }
  MORI_HOST_DEVICE int64_t nvs() const {
    const int64_t need = capacity() + static_cast<int64_t>(token_padding - 1) * 2 * epn();
    return (need + token_padding - 1) / token_padding * token_padding;
  }
};

// Refuses a shape the tables cannot encode (InvalidArgumentError naming the value):
// R >= 1, E a positive multiple of R, S >= 1, K >= 1, token_padding >= 1, R * NvS
// below 2^31 (dst is int32).
void CheckPlanShape(const PlanShape& shape);

// Every table of one plan, for all ranks (caller-owned int32 arrays).
struct PlanTables {
  int32_t* alloc;            // [R, E]: tokens of expert e placed on rank d (d-major)
  int32_t* expert_offsets;   // [R, E]: first slot of expert e on rank d (0 if none)
  int32_t* cu_seqlens;       // [R, 2*epn]: padded end slot of each group
  int32_t* zero_fill;        // [R, 2*epn, 2]: (first pad slot, pad rows) per group
  int32_t* experts_to_copy;  // [R, epn]: rank d's prefetch slot b holds expert ..., -1 none
  int32_t* remote_stats;     // [R, 2]: (remote experts held, own experts held remotely)
};

// Steps 1-3 from tpe [R, E]. Refuses (InvalidArgumentError) a negative count or a row
// that does not sum to S*K, naming the rank, expert and value.
void PlanTablesCpu(const PlanShape& shape, const int32_t* tpe, const PlanTables& out);

// Step 4 for source rank `rank`: topk [S, K] (its expert ids, whose counts must be
// tpe[rank]) into dst [S*K]. Refuses an expert id out of range or counts that differ
// from tpe[rank], naming the token, k, expert and counts.
void PlanDestinationsCpu(const PlanShape& shape, const int32_t* tpe, const PlanTables& tables,
                         int rank, const int32_t* topk, int32_t* dst);

// Rank d's duplicate table from every source rank's dst [R, S*K]: dup_src[slot] is the
// slot whose row a duplicate slot copies (the token's first k to d), -1 for others.
// Slots past every source's writes keep -1. dup_src has NvS entries.
void DuplicateSourcesCpu(const PlanShape& shape, const int32_t* dst_all, int dest,
                         int32_t* dup_src);

// The duplicate groups of dup_src [NvS] in MoonEP's form: groups [NvS, 3] (primary
// slot, first index in loffs, duplicates) in ascending primary slot, loffs [NvS] the
// duplicate slots of each group in ascending slot, counts [2] (groups, duplicates).
void DuplicateGroupsCpu(int64_t nvs, const int32_t* dup_src, int32_t* groups, int32_t* loffs,
                        int32_t* counts);

// The CUDA planner's arguments (balanced/kernels/planner.cu, one launch after the counts
// are gathered; every rank runs it on the same counts, so no table is broadcast). All
// pointers are device memory: tpe [R, E] (every rank's counts), topk [S, K] (this
// rank's), the tables (every rank's), dst [S*K] (this rank's), error [4]: zero, or a
// code and its values (kPlannerError*) when the inputs broke a rule the CPU planner
// refuses; the tables are then undefined. scratch [PlannerScratchWords(shape)]: the
// launch's per-chunk expert counts (LaunchPlanner clears its header on the stream).
struct PlannerParams {
  PlanShape shape;
  int rank;
  const int32_t* tpe;
  const int32_t* topk;
  PlanTables tables;
  int32_t* dst;
  int32_t* error;
  int32_t* scratch;
};

// The int32 words of PlannerParams::scratch for `shape` (CUDA builds only).
int64_t PlannerScratchWords(const PlanShape& shape);

inline constexpr int32_t kPlannerErrorRowSum = 1;     // (rank, its sum)
inline constexpr int32_t kPlannerErrorExpertId = 2;   // (pair index, expert id)
inline constexpr int32_t kPlannerErrorCounts = 3;     // (expert, pairs routed to it)
inline constexpr int32_t kPlannerErrorInvariant = 4;  // (rank, slots or remote experts)
inline constexpr int32_t kPlannerErrorStalled = 5;    // (chunk, the earlier chunk it waited for)

}  // namespace mori::ep::balanced
