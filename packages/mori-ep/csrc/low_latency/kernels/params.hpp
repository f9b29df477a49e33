// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// What the host class (low_latency/cuda.cu) and the low-latency kernels
// (dispatch.cu, combine.cu) share: the kernels' parameter struct, the phases a launch
// runs and the limits their builds fix. Plain C++: the host fills LlParams and calls
// the launchers of common/launch_api.hpp.

#include <cstdint>

#include "low_latency/args.hpp"
#include "low_latency/protocol.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep::low_latency {

// Most warps per block of a launch (LowLatencyCuda clamps to it); the kernel is
// compiled for blocks of that size (__launch_bounds__), so that ptxas keeps its
// registers within what such a block may hold (at most 128 per thread).
inline constexpr int kLlMaxWarps = 16;
// Most local experts per rank (the expert-major combine scans their row counts in
// shared memory).
inline constexpr int kLlMaxScanExperts = 1024;

// Phases one launch runs, in this order.
inline constexpr int kLlDispatchSend = 1, kLlDispatchRecv = 2, kLlCombineSend = 4,
                     kLlCombineRecv = 8, kLlRejectDispatch = 16, kLlRejectCombine = 32;

// MORI_EP_TIMELINE parts (KernelTimeline, common/timeline.hpp): one per phase, so that
// a fused launch (send + receive) and split ones are attributed alike.
inline constexpr int kLlPartDispatchSend = 0, kLlPartDispatchRecv = 1, kLlPartCombineSend = 2,
                     kLlPartCombineRecv = 3, kLlParts = 4;

struct LlParams {
  shmem::DeviceContext ctx;
  char* block;
  // Copy-engine dispatch (LowLatencyCuda): rows for other pes go to `stage` (laid out
  // as half 0 of the dispatch arrays, offsets from layout.disp_tokens; slot [d][j]) and
  // their flags to stage_flags[d]; the host copies both after the send kernel.
  bool copy_engine;
  char* stage;
  uint64_t* stage_flags;
  // The same for a combine's token-major rows: half 0 of the combine arrays, offsets
  // from layout.comb_tokens; slot [s][t].
  char* stage_comb;
  uint64_t* stage_comb_flags;
  LlBufferLayout layout;
  int world, me, top_k, experts_per_rank;
  int64_t max_tokens, hidden_dim, hidden_bytes, combine_row_bytes, scale_bytes;
  int64_t recv_slots;  // receive slots per source pe (LlRecvSlots)
  uint64_t timeout_ns;
  int phases;
  LlDispatchArgs d;
  LlRecvArgs r;
  LlLayout recv_layout;
  bool recv_fp8;           // the dispatch being received was cast to e4m3
  int64_t recv_row_bytes;  // its token row bytes (before a cast)
  LlCombineArgs c;
  const int32_t* total_recv;   // token-major combine: the dispatch's total_recv (device)
  int64_t combine_tokens;      // token-major combine: this pe's tokens of the dispatch
  uint64_t* stamps[kLlParts];  // MORI_EP_TIMELINE: each phase's stamps, else null
};

}  // namespace mori::ep::low_latency
