// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Host launchers of the kernels the CUDA backend itself needs (shmem_kernels.cu).
// Only included where CUDA is compiled in.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/context.hpp"

namespace mori::shmem::internal {

using cuda::ScopedDevice;

// One block running BarrierAllBlock on `stream`; no allocation, no host
// synchronization, so it can be captured in a CUDA graph. Throws CudaError when
// the launch fails.
// A trap after `timeout_ns` (0: none) names the pe that did not arrive.
void LaunchBarrierOnStream(const DeviceContext& ctx, cudaStream_t stream, uint64_t timeout_ns);

// One thread: *addr += value, atomic, after a system fence and with release
// semantics, on `stream` (the caller synchronizes).
void LaunchSignalAdd(uint64_t* addr, uint64_t value, cudaStream_t stream);

}  // namespace mori::shmem::internal
