// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The grid every mode's CUDA calls take from the caller (MORI's block_num and
// warp_per_block). Plain C++.

namespace mori::ep {

// The kernels' grid: block_num blocks of warp_per_block warps. Blocks wait on
// signals that other blocks of the same grid produce, so the grid is clamped to
// what the device keeps resident at once.
struct LaunchShape {
  int block_num;
  int warp_per_block;
};

// The most pes the CUDA kernels of every mode take (their per-pe arrays are sized by it).
inline constexpr int kMaxCudaWorldSize = 8;

}  // namespace mori::ep
