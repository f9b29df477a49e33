// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/core/cuda.hpp"

#include <mutex>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/version.hpp"

#if MORI_CORE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mori::cuda {
namespace {

struct Probe {
  int device_count = 0;
  std::string reason;
};

// cudart is linked statically and finds libcuda with dlopen, so on a machine
// without a driver the first call returns an error instead of failing to load.
const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
#if MORI_CORE_WITH_CUDA
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      p.reason = StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(err), " (",
                        cudaGetErrorString(err), ")");
      (void)cudaGetLastError();
    } else if (n == 0) {
      p.reason = "the CUDA driver reports no devices";
    } else {
      p.device_count = n;
    }
#else
    p.reason = "libmori_core was built without CUDA (MORI_CUDA=off or no nvcc)";
#endif
    if (p.device_count == 0) MORI_LOG_DEBUG(kCore, "no CUDA devices: ", p.reason);
    return p;
  }();
  return probe;
}

}  // namespace

bool CompiledWithCuda() noexcept { return MORI_CORE_WITH_CUDA != 0; }

int DeviceCount() noexcept {
  try {
    return GetProbe().device_count;
  } catch (...) {
    return 0;
  }
}

std::string UnavailableReason() { return GetProbe().reason; }

void* DriverEntryPoint(const char* symbol, int cuda_version) {
#if MORI_CORE_WITH_CUDA
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(
      symbol, &fn, static_cast<unsigned>(cuda_version), cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    const char* why = status == cudaDriverEntryPointSymbolNotFound ? "symbol not found"
                      : status == cudaDriverEntryPointVersionNotSufficent
                          ? "driver older than the requested API version"
                          : "no usable driver";
    (void)cudaGetLastError();
    MORI_THROW(NotSupportedError, "CUDA driver entry point ", symbol, " (API version ",
               cuda_version, ") unavailable: ", why, "; cudaGetDriverEntryPointByVersion returned ",
               cudaGetErrorName(err));
  }
  return fn;
#else
  MORI_THROW(NotSupportedError, "CUDA driver entry point ", symbol,
             " requested, but libmori_core was built without CUDA");
#endif
}

}  // namespace mori::cuda
