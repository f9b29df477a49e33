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

#if MORI_EP_WITH_CUDA
// CUDA implementation on `stream` (a cudaStream_t as an integer). An out-of-range id
// is not an error the host can see without a sync: the kernel records the first one
// in error_record (int32[4] on the device: flag, token, slot, value), which the
// caller reads when it wants the check.
void DispatchLayoutCuda(const LayoutArgs& args, int32_t* error_record, uintptr_t stream);
#endif

}  // namespace mori::ep
