// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mori::io {

// One contiguous copy of a gather/scatter batch (absolute addresses in this process).
struct P2pCopyDesc {
  uint64_t src;
  uint64_t dst;
  uint64_t size;
};

inline constexpr int kP2pCopyThreads = 512;
// Spans longer than this are split into pieces of it, so a few large spans still
// spread over every warp of the grid.
inline constexpr uint64_t kP2pCopyPiece = 64 << 10;

// One launch copying every descriptor; `descs` is device-readable (pinned, mapped host
// memory). Each warp takes whole descriptors, grid-strided.
cudaError_t LaunchP2pCopy(const P2pCopyDesc* descs, uint32_t n, int blocks, cudaStream_t stream);

}  // namespace mori::io
