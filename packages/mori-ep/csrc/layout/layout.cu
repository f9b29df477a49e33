// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <cuda_runtime.h>

#include "layout/layout.hpp"
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

// Grid-stride over the (row, slot) pairs of the first *total_recv rows. With a
// shared histogram (few local experts) each block counts in shared memory and adds
// its counts once per expert, so the global atomics do not serialise on a hot expert.
__global__ void LocalExpertCountKernel(LocalExpertCountArgs a, bool shared_hist) {
  extern __shared__ int32_t hist[];
  const int E = a.num_experts_per_rank;
  if (shared_hist) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
  }
  const int64_t base = static_cast<int64_t>(a.rank) * E;
  const int32_t rows = *a.total_recv;
  const int64_t n = rows > 0 ? static_cast<int64_t>(rows) * a.top_k : 0;
  int32_t* counts = shared_hist ? hist : a.counts;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t local = a.indices[i] - base;
    if (local >= 0 && local < E) atomicAdd(&counts[local], 1);
  }
  if (shared_hist) {
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      if (hist[e] != 0) atomicAdd(&a.counts[e], hist[e]);
    }
  }
}

constexpr int kSharedHistExperts = 4096;

const char* MemoryKindName(cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeManaged:
      return "managed memory";
    case cudaMemoryTypeHost:
      return "pinned host memory";
    default:
      return "pageable host memory";
  }
}

}  // namespace

void LocalExpertCountCuda(const LocalExpertCountArgs& a, int blocks, int threads,
                          uintptr_t stream_int) {
  ValidateLocalExpertCountArgs(a);
  auto stream = reinterpret_cast<cudaStream_t>(stream_int);
  MORI_CUDA_CHECK(cudaMemsetAsync(a.counts, 0, sizeof(int32_t) * a.num_experts_per_rank, stream));
  const bool shared_hist = a.num_experts_per_rank <= kSharedHistExperts;
  const size_t smem = shared_hist ? sizeof(int32_t) * a.num_experts_per_rank : 0;
  LocalExpertCountKernel<<<blocks, threads, smem, stream>>>(a, shared_hist);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchLocalExpertCount(const LocalExpertCountArgs& a, int blocks, int warps_per_block,
                            uintptr_t stream) {
  ValidateLocalExpertCountArgs(a);
  CheckLocalExpertCountLaunch(blocks, warps_per_block);
  static const char* const kNames[3] = {"indices_ptr", "total_recv_token_num_ptr",
                                        "local_expert_count_ptr"};
  const void* ptrs[3] = {a.indices, a.total_recv, a.counts};
  cudaMemoryType kinds[3];
  bool no_device = false;
  for (int i = 0; i < 3; ++i) {
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, ptrs[i]);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
      (void)cudaGetLastError();  // not sticky: nothing here can be device memory
      no_device = true;
      break;
    }
    MORI_CUDA_CHECK(err);
    kinds[i] = attr.type;
  }
  if (no_device) return LocalExpertCountCpu(a);
  int pageable = -1, device_only = -1;
  for (int i = 0; i < 3; ++i) {
    if (kinds[i] == cudaMemoryTypeUnregistered && pageable < 0) pageable = i;
    if (kinds[i] == cudaMemoryTypeDevice && device_only < 0) device_only = i;
  }
  if (pageable < 0) return LocalExpertCountCuda(a, blocks, warps_per_block * 32, stream);
  MORI_CHECK_ARG(device_only < 0, "launch_local_expert_count: ", kNames[device_only], " is ",
                 MemoryKindName(kinds[device_only]), " but ", kNames[pageable], " is ",
                 MemoryKindName(kinds[pageable]), "; pass addresses the same side can read");
  // Host memory: count on this thread once the stream's earlier work (which may
  // write it, pinned or managed) has finished.
  MORI_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
  LocalExpertCountCpu(a);
}

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
