// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/core/version.hpp"

#include "mori/core/error.hpp"

#if MORI_CORE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef MORI_CUDA_ARCHS_STRING
#define MORI_CUDA_ARCHS_STRING ""
#endif

namespace mori::core {

BuildInfo GetBuildInfo() noexcept {
  BuildInfo info{};
  info.version = MORI_CORE_VERSION_STRING;
  info.version_major = MORI_CORE_VERSION_MAJOR;
  info.version_minor = MORI_CORE_VERSION_MINOR;
#if MORI_CORE_WITH_CUDA
  info.with_cuda = true;
  info.cuda_archs = MORI_CUDA_ARCHS_STRING;
  info.cuda_runtime_version = CUDART_VERSION;
#else
  info.with_cuda = false;
  info.cuda_archs = "";
  info.cuda_runtime_version = 0;
#endif
  return info;
}

void CheckCompatible(int compiled_major, int compiled_minor, const char* who) {
  if (compiled_major != MORI_CORE_VERSION_MAJOR || compiled_minor != MORI_CORE_VERSION_MINOR) {
    MORI_THROW(InvalidStateError, who, " was built against mori-core ", compiled_major, ".",
               compiled_minor, " but the loaded libmori_core is ", MORI_CORE_VERSION_STRING,
               "; install matching versions (same major.minor)");
  }
}

}  // namespace mori::core
