// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// What the inter-node kernels (internode/kernels/) take, by value, and their launch
// entry points for internode/cuda.cu. Plain C++: no CUDA types.

#include <cstdint>

#include "internode/protocol.hpp"
#include "mori/proxy/command.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep::internode {

// The byte counts a kernel keeps (InterNodeBytes' fields), per call, at the layout's
// `counters` region: [0][*] the last dispatch, [1][*] the last combine.
enum Counter : int {
  kAlgoToken = 0,
  kPhysicalToken,
  kPhysicalRows,
  kForwardedRows,
  kLinkToken,
  kLinkMeta,
  kLinkSignal,
  kLinkWrites,
  kLinkSignals,
  kCounters
};
inline constexpr int kCounterStride = 16;  // u64 per call kind in the region

// The widest world the kernels take (destination sets are 32-bit masks).
inline constexpr int kMaxInterNodeWorld = 32;

// The calls' numbers, in the layout's `state` region (zeroed with the block): every
// kernel reads its call's number here and advances it (BeginCall in
// kernels/common.cuh), so the numbers need nothing from the host and a CUDA graph's
// replays take new ones. The host keeps its own count for its checks only
// (internode/cuda.hpp).
struct DeviceState {
  uint64_t dispatch_calls;  // dispatches run (rejections included): the dispatch epoch
  uint64_t combine_calls;   // combines run (rejections included)
  uint64_t last_dispatch;   // 1: the last call was a dispatch (V1LL: finish_previous)
};
static_assert(sizeof(DeviceState) <= 64, "the layout's state region holds 8 words");

struct Params {
  // This pe's block and its byte offset in the heap (the proxy's commands take heap
  // offsets: block_offset + a region's offset).
  char* block;
  uint64_t block_offset;
  InterNodeLayout l;
  NodeMap nodes;
  shmem::DeviceContext ctx;
  proxy::QueueView queue;
  int kind;  // InterNodeKind
  int world_size, rank;
  int64_t max_tokens, hidden_bytes, scale_bytes, combine_row_bytes, recv_capacity;
  int top_k, num_experts_per_rank;
  uint64_t timeout_ns;
  bool reject;  // only post this pe's rejection (RejectDispatch / RejectCombine)
  // Set by the kernel at entry from DeviceState (BeginCall), never by the host: the
  // dispatch's epoch or the combine's call number; V1LL: whether a dispatch follows a
  // dispatch and so first exchanges the previous call's done words
  // (InterNodeCpu::FinishDispatchEpoch).
  uint64_t call;
  bool finish_previous;

  // dispatch
  const char* tokens;
  int64_t token_row_bytes;
  const float* weights;
  const char* scales;
  const int32_t* indices;
  int64_t num_tokens;
  const uint32_t* rank_masks;
  uint32_t row_tag;

  // combine (the routing: the last dispatch's regions or a routing handle's copies)
  const char* input;
  int64_t input_row_stride;
  int64_t input_rows;
  int dtype;  // CombineDtype
  bool fp8_cast;
  const float* combine_weights;  // null: weights are not combined
  char* out;
  float* out_weights;
  const int32_t* src_pos;
  const uint8_t* token_ranks;
  const int32_t* total_recv;
  int64_t hidden_dim;
  int64_t row_bytes;  // hidden_dim * the combine dtype's size
  uint32_t combine_tag;
};

// Load a kind's kernels (cudaFuncGetAttributes), so that no launch loads them lazily.
void LoadFlatKernels();
void LoadHierKernels();
// Enqueue a kind's kernels (one block of `threads`) on `stream`: flat (InterNode,
// kernels/flat.cu), hierarchical (InterNodeV1, kernels/hier.cu; InterNodeV1LL: its own
// dispatch, V1's combine).
void LaunchFlatDispatch(const Params& p, int threads, uintptr_t stream);
void LaunchFlatCombine(const Params& p, int threads, uintptr_t stream);
void LaunchHierDispatch(const Params& p, int threads, uintptr_t stream);
void LaunchHierLowLatencyDispatch(const Params& p, int threads, uintptr_t stream);
void LaunchHierCombine(const Params& p, int threads, uintptr_t stream);

}  // namespace mori::ep::internode
