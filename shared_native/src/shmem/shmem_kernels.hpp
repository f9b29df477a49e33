// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Host launchers of the kernels the CUDA backend itself needs (shmem_kernels.cu).
// Only included where CUDA is compiled in.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mori/core/error.hpp"
#include "mori/shmem/context.hpp"

namespace mori::shmem::internal {

// Throws CudaError naming the runtime call, the error's name and description.
inline void CheckCuda(cudaError_t err, const char* call) {
  if (MORI_UNLIKELY(err != cudaSuccess)) {
    MORI_THROW(CudaError, call, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
               ")");
  }
}
#define MORI_CUDA_CHECK(call) ::mori::shmem::internal::CheckCuda((call), #call)

// Makes `device` current for the scope and restores the previous device after
// (torch keeps its own notion of the current device).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    MORI_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) MORI_CUDA_CHECK(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~ScopedDevice() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// One block running BarrierAllBlock on `stream`; no allocation, no host
// synchronization, so it can be captured in a CUDA graph. Throws CudaError when
// the launch fails.
// A trap after `timeout_ns` (0: none) names the pe that did not arrive.
void LaunchBarrierOnStream(const DeviceContext& ctx, cudaStream_t stream, uint64_t timeout_ns);

// One thread: *addr += value, atomic, after a system fence and with release
// semantics, on `stream` (the caller synchronizes).
void LaunchSignalAdd(uint64_t* addr, uint64_t value, cudaStream_t stream);

}  // namespace mori::shmem::internal
