// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// GPU memory over TCP: payloads leave through and arrive into pinned host buffers, and
// a synchronous copy moves them between the buffer and the GPU. Without CUDA (or a
// device) Unavailable() says why and nothing here is called.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mori::io::staging {

// "" when GPU memory can be staged here, else why not (computed once).
const std::string& Unavailable();

// A host buffer of at least n bytes, pinned (reused through a pool) up to
// kPinnedMax, pageable above; returned to the pool when the last reference goes.
inline constexpr size_t kPinnedMax = 16 << 20;
std::shared_ptr<char> Buffer(size_t n);

// Initiators stage parts of at most kGpuChunk; a target refuses to stage a single part
// larger than kMaxStagedPart.
inline constexpr uint64_t kGpuChunk = 4 << 20;
inline constexpr uint64_t kMaxStagedPart = 256 << 20;

// Synchronous copies between GPU memory of `device` and host memory, on a non-blocking
// stream of the calling thread (they neither wait for nor delay the application's work
// on the default stream); throw CudaError.
void ToHost(char* dst, const char* src_gpu, size_t n, int device);
void ToDevice(char* dst_gpu, const char* src, size_t n, int device);

}  // namespace mori::io::staging
