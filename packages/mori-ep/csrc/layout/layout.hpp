// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>

namespace mori::ep {

// Routing summary of one rank's tokens (the layout step before a dispatch).
//   indices           int32 [num_tokens, top_k], global expert ids, -1 = unused slot
//   tokens_per_rank   int32 [world_size]: tokens with at least one expert on the rank
//   tokens_per_expert int32 [num_experts]: (token, slot) pairs routed to the expert
//   token_in_rank     bool  [num_tokens, world_size]
// Experts are laid out rank-major: expert e lives on rank e / (num_experts / world_size).
struct LayoutArgs {
  const int32_t* indices;
  int64_t num_tokens;
  int top_k;
  int num_experts;
  int world_size;
  int32_t* tokens_per_rank;
  int32_t* tokens_per_expert;
  bool* token_in_rank;
};

// Host implementation. Throws InvalidArgumentError naming the first out-of-range
// expert id with its token and slot; outputs are then unspecified.
void DispatchLayoutCpu(const LayoutArgs& args);

// Checks shapes/sizes shared by both implementations (host-side, before any work).
void ValidateLayoutArgs(const LayoutArgs& args);

// MORI's local expert count over the rows a dispatch received: of the first
// *total_recv rows of `indices` (int32 [rows][top_k], global expert ids), how many
// (row, slot) pairs name each expert of `rank` (experts [rank * num_experts_per_rank,
// + num_experts_per_rank)); other ids, -1 among them, are not counted. `counts`
// (int32 [num_experts_per_rank]) is zeroed first; a *total_recv <= 0 counts nothing.
// *total_recv is read where the count runs (on the device for the kernel), so rows
// past it are never read.
struct LocalExpertCountArgs {
  const int32_t* indices;
  const int32_t* total_recv;  // [1]
  int rank;
  int num_experts_per_rank;
  int top_k;
  int32_t* counts;
};

// Checks the scalars and the pointers (non-null), naming the values.
void ValidateLocalExpertCountArgs(const LocalExpertCountArgs& args);

// Host implementation on the calling thread.
void LocalExpertCountCpu(const LocalExpertCountArgs& args);

// The launch shape LaunchLocalExpertCount takes (MORI's "positive block and warp
// settings", and at most 32 warps of 32 threads).
void CheckLocalExpertCountLaunch(int blocks, int warps_per_block);

// ROCm/mori's LaunchLocalExpertCount on raw addresses: `blocks` x `warps_per_block`
// warps of the kernel on `stream` (a cudaStream_t as an integer; no host
// synchronisation) when the three addresses are device-accessible memory; when one is
// pageable host memory (every one must then be host-accessible) the count runs on the
// calling thread after `stream`'s earlier work. A build without CUDA counts host
// memory on the calling thread and ignores `stream`. Throws InvalidArgumentError for
// a launch shape outside [1, 2^31) blocks x [1, 32] warps, or addresses of mixed kinds.
void LaunchLocalExpertCount(const LocalExpertCountArgs& args, int blocks, int warps_per_block,
                            uintptr_t stream);

#if MORI_EP_WITH_CUDA
// The kernel on `stream`: counts zeroed with cudaMemsetAsync, then `blocks` x
// `threads` threads; no host synchronisation.
void LocalExpertCountCuda(const LocalExpertCountArgs& args, int blocks, int threads,
                          uintptr_t stream);

// CUDA implementation on `stream` (a cudaStream_t as an integer). An out-of-range id
// is not an error the host can see without a sync: the kernel records the first one
// in error_record (int32[4] on the device: flag, token, slot, value), which the
// caller reads when it wants the check.
void DispatchLayoutCuda(const LayoutArgs& args, int32_t* error_record, uintptr_t stream);
#endif

}  // namespace mori::ep
