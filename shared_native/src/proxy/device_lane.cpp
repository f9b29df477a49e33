// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "device_lane.hpp"

#include <utility>

#include "mori/core/error.hpp"
#include "mori/core/version.hpp"

#if MORI_CORE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "mori/core/cuda_runtime.hpp"
#include "proxy_kernels.hpp"
#endif

namespace mori::proxy::internal {

#if MORI_CORE_WITH_CUDA

namespace {

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// Rethrows a CUDA failure with the lane's name in front.
template <typename F>
void Checked(const std::string& who, F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const CudaError& e) {
    MORI_THROW(CudaError, who, ": ", e.what());
  }
}

}  // namespace

DeviceLane::DeviceLane(int device, size_t staging_bytes, std::string who)
    : device_(device), who_(std::move(who)) {
  cuda::ScopedDevice guard(device_);
  try {
    // THE RULE: while a kernel that pushes into this proxy may be running, the proxy's
    // threads never touch the legacy default stream, a blocking stream or anything
    // device-wide (cudaMemcpy, cudaMemset, cudaDeviceSynchronize, cudaMalloc/cudaFree,
    // cudaHostAlloc/cudaFreeHost, a first kernel launch): each of those may wait for
    // the producer kernel, which waits for the proxy, and both stall until the
    // kernel's timeout traps. The proxy's threads only use this non-blocking stream
    // (cudaMemcpyAsync, the proxy's add kernel, cudaStreamSynchronize of it).
    cudaStream_t stream = nullptr;
    MORI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    stream_ = stream;
    if (staging_bytes > 0) {
      MORI_CUDA_CHECK(
          cudaHostAlloc(reinterpret_cast<void**>(&staging_), staging_bytes, cudaHostAllocPortable));
      staging_bytes_ = staging_bytes;
    }
    MORI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(uint64_t)));
    // Under lazy module loading (CUDA 12's default) a kernel's first launch loads it,
    // and loading may synchronize the context: done here, before any producer runs.
    LaunchHeapAdd(scratch_, 0, stream);
    MORI_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (const CudaError& e) {
    Release();
    MORI_THROW(CudaError, who_, ": setting up its CUDA stream: ", e.what());
  }
}

DeviceLane::~DeviceLane() { Release(); }

void DeviceLane::Release() noexcept {
  // The proxy is closed or failed: no producer of it runs any more. The caller's
  // current device is restored after (torch keeps its own notion of it).
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(AsStream(stream_));
    (void)cudaStreamDestroy(AsStream(stream_));
    stream_ = nullptr;
  }
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
  staging_ = nullptr;
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  scratch_ = nullptr;
  if (previous != device_) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

void DeviceLane::Copy(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  Checked(who_, [&] {
    cuda::ScopedDevice guard(device_);
    MORI_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, AsStream(stream_)));
  });
  pending_ = true;
  copied_ = true;
}

void DeviceLane::Add(uint64_t* word, uint64_t value) {
  Checked(who_, [&] {
    cuda::ScopedDevice guard(device_);
    LaunchHeapAdd(word, value, AsStream(stream_));
  });
  pending_ = true;
}

void DeviceLane::Sync() {
  if (!pending_) return;
  Checked(who_, [&] {
    cuda::ScopedDevice guard(device_);
    MORI_CUDA_CHECK(cudaStreamSynchronize(AsStream(stream_)));
  });
  pending_ = false;
  copied_ = false;
  waits_.fetch_add(1, std::memory_order_relaxed);
}

#else  // !MORI_CORE_WITH_CUDA

DeviceLane::DeviceLane(int device, size_t, std::string who)
    : device_(device), who_(std::move(who)) {
  MORI_THROW(NotSupportedError, who_,
             ": a CUDA heap needs libmori_core built with CUDA (MORI_CUDA=off or no nvcc)");
}
DeviceLane::~DeviceLane() = default;
void DeviceLane::Release() noexcept {}
void DeviceLane::Copy(void*, const void*, size_t) {}
void DeviceLane::Add(uint64_t*, uint64_t) {}
void DeviceLane::Sync() {}

#endif  // MORI_CORE_WITH_CUDA

}  // namespace mori::proxy::internal
