// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The proxy's own kernels (proxy_kernels.cu), for its DeviceLanes. CUDA builds only.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mori::proxy::internal {

// *word += value with a release atomic at system scope, one thread, on `stream`
// (after everything enqueued on it before). Throws CudaError when the launch fails.
void LaunchHeapAdd(uint64_t* word, uint64_t value, cudaStream_t stream);

}  // namespace mori::proxy::internal
