// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <string>

#include "mori/core/macros.hpp"

namespace mori::cuda {

// True when libmori_core was compiled with CUDA support.
MORI_API bool CompiledWithCuda() noexcept;

// Number of visible CUDA devices; 0 without CUDA support, without a driver or
// without devices (the reason is logged once at debug level on the core logger).
MORI_API int DeviceCount() noexcept;

// Why DeviceCount() is 0, or "" when devices were found.
MORI_API std::string UnavailableReason();

// Resolves a CUDA driver API entry point (for example "cuMemCreate") through
// cudaGetDriverEntryPointByVersion, so nothing links libcuda and libmori_core
// loads on machines without a GPU driver. `cuda_version` is the API version the
// caller's function-pointer type was written for (12000 for CUDA 12.0).
// Throws NotSupportedError naming the symbol and the driver's answer.
MORI_API void* DriverEntryPoint(const char* symbol, int cuda_version);

// Typed DriverEntryPoint: sets `fn` to the driver's `symbol` for the ABI of
// `cuda_version` (the version `Fn`'s signature was written for). Throws like it.
template <typename Fn>
void ResolveDriver(Fn*& fn, const char* symbol, int cuda_version = 12000) {
  fn = reinterpret_cast<Fn*>(DriverEntryPoint(symbol, cuda_version));
}

}  // namespace mori::cuda
