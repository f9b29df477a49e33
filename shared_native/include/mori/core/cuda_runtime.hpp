// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Helpers for translation units compiled with CUDA (they include the CUDA
// runtime's header): checked runtime calls and a scoped current device. Shared by
// libmori_core's CUDA code and the packages' kernels.

#include <cuda_runtime_api.h>

#include "mori/core/error.hpp"

namespace mori::cuda {

// Throws CudaError naming the runtime call, the error's name and description.
inline void CheckCuda(cudaError_t err, const char* call) {
  if (MORI_UNLIKELY(err != cudaSuccess)) {
    MORI_THROW(CudaError, call, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
               ")");
  }
}

// Makes `device` current for the scope and restores the previous device after
// (torch keeps its own notion of the current device).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    CheckCuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) CheckCuda(cudaSetDevice(device), "cudaSetDevice");
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

}  // namespace mori::cuda

#define MORI_CUDA_CHECK(call) ::mori::cuda::CheckCuda((call), #call)
