// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>

namespace mori::io {

// The P2P benchmark's limit: `iters` rounds, each moving `batch` x `size` bytes from
// GPU src_dev to GPU dst_dev on one stream, synchronising after every round
// (sync_each) or once at the end; returns the seconds. src_dev == dst_dev is a
// same-device copy (cudaMemcpyAsync device to device): no peer link is involved, so
// a peer copy would not be the limit. Otherwise cudaMemcpyPeerAsync with peer access
// enabled both ways (without it the runtime stages the copy through host memory).
// A round is one copy of the whole contiguous batch, the bytes the benchmark's
// transfers cover; with `per_transfer` it is `batch` copies of `size` bytes, which
// times the runtime's per-call cost (a few microseconds) rather than the GPU's
// bandwidth once copies are small. Throws NotSupportedError in a build without CUDA.
double CudaCopySeconds(int src_dev, int dst_dev, uint64_t size, int batch, int iters,
                       bool sync_each, bool per_transfer);

}  // namespace mori::io
