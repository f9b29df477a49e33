// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The P2P backend's gather/scatter copy: one launch moves a whole batch of blocks
// (KV-cache pages are 16-256 KiB) between local and peer GPU memory over NVLink.
#include "p2p/p2p_kernels.hpp"

namespace mori::io {
namespace {

constexpr int kUnroll = 8;  // 16-byte loads in flight per lane

__device__ __forceinline__ void CopyBytes(const char* src, char* dst, uint64_t n, int lane) {
  for (uint64_t i = lane; i < n; i += 32) dst[i] = src[i];
}

// src and dst 16-byte aligned, n a multiple of 16.
__device__ __forceinline__ void CopyVec(const uint4* src, uint4* dst, uint64_t nv, int lane) {
  uint64_t j = lane;
  for (; j + (kUnroll - 1) * 32 < nv; j += kUnroll * 32) {
    uint4 r[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) r[k] = src[j + k * 32];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) dst[j + k * 32] = r[k];
  }
  for (; j < nv; j += 32) dst[j] = src[j];
}

__global__ void __launch_bounds__(kP2pCopyThreads)
    P2pCopyKernel(const P2pCopyDesc* __restrict__ descs, uint32_t n) {
  const int lane = threadIdx.x & 31;
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const uint32_t nwarps = (gridDim.x * blockDim.x) >> 5;
  for (uint32_t i = warp; i < n; i += nwarps) {
    const P2pCopyDesc d = descs[i];
    const char* src = reinterpret_cast<const char*>(d.src);
    char* dst = reinterpret_cast<char*>(d.dst);
    uint64_t size = d.size;
    if (((d.src ^ d.dst) & 15) != 0) {
      // Misaligned relative to each other: no common 16-byte grid.
      CopyBytes(src, dst, size, lane);
      continue;
    }
    const uint64_t head = ((16 - (d.src & 15)) & 15) < size ? ((16 - (d.src & 15)) & 15) : size;
    CopyBytes(src, dst, head, lane);
    src += head;
    dst += head;
    size -= head;
    const uint64_t nv = size / 16;
    CopyVec(reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst), nv, lane);
    CopyBytes(src + nv * 16, dst + nv * 16, size - nv * 16, lane);
  }
}

}  // namespace

cudaError_t LaunchP2pCopy(const P2pCopyDesc* descs, uint32_t n, int blocks, cudaStream_t stream) {
  P2pCopyKernel<<<blocks, kP2pCopyThreads, 0, stream>>>(descs, n);
  return cudaGetLastError();
}

}  // namespace mori::io
