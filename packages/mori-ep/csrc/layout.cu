// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <cuda_runtime.h>

#include "layout.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"

namespace mori::ep {
namespace {

// One thread per token. A rank counts once per token: slot j counts only when no
// earlier slot of the token maps to the same rank (top_k is small, so the O(k^2)
// scan costs less than a per-token bitmap for arbitrary world sizes).
__global__ void DispatchLayoutKernel(LayoutArgs a, int32_t* error_record) {
  const int experts_per_rank = a.num_experts / a.world_size;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < a.num_tokens;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t* row = a.indices + t * a.top_k;
    for (int j = 0; j < a.top_k; ++j) {
      const int32_t e = row[j];
      if (e == -1) continue;
      if (e < 0 || e >= a.num_experts) {
        if (atomicCAS(&error_record[0], 0, 1) == 0) {
          error_record[1] = static_cast<int32_t>(t);
          error_record[2] = j;
          error_record[3] = e;
        }
        continue;
      }
      atomicAdd(&a.tokens_per_expert[e], 1);
      const int r = e / experts_per_rank;
      bool first = true;
      for (int i = 0; i < j; ++i) {
        const int32_t prev = row[i];
        if (prev >= 0 && prev < a.num_experts && prev / experts_per_rank == r) {
          first = false;
          break;
        }
      }
      if (first) {
        a.token_in_rank[t * a.world_size + r] = true;
        atomicAdd(&a.tokens_per_rank[r], 1);
      }
    }
  }
}

}  // namespace

void DispatchLayoutCuda(const LayoutArgs& a, int32_t* error_record, uintptr_t stream_int) {
  ValidateLayoutArgs(a);
  auto stream = reinterpret_cast<cudaStream_t>(stream_int);
  MORI_CUDA_CHECK(cudaMemsetAsync(a.tokens_per_rank, 0, sizeof(int32_t) * a.world_size, stream));
  MORI_CUDA_CHECK(cudaMemsetAsync(a.tokens_per_expert, 0, sizeof(int32_t) * a.num_experts, stream));
  MORI_CUDA_CHECK(
      cudaMemsetAsync(a.token_in_rank, 0, sizeof(bool) * a.num_tokens * a.world_size, stream));
  MORI_CUDA_CHECK(cudaMemsetAsync(error_record, 0, sizeof(int32_t) * 4, stream));
  if (a.num_tokens == 0) return;
  constexpr int kThreads = 256;
  const int blocks =
      static_cast<int>(std::min<int64_t>((a.num_tokens + kThreads - 1) / kThreads, 1024));
  DispatchLayoutKernel<<<blocks, kThreads, 0, stream>>>(a, error_record);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep
