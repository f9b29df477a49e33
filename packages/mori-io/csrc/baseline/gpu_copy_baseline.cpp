// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "baseline/gpu_copy_baseline.hpp"

#include "mori/core/error.hpp"

#if MORI_IO_WITH_CUDA
#include <chrono>
#include <utility>

#include "mori/core/cuda_runtime.hpp"
#endif

namespace mori::io {

#if !MORI_IO_WITH_CUDA

double CudaCopySeconds(int, int, uint64_t, int, int, bool, bool) {
  MORI_THROW(NotSupportedError, "GPU copy baseline: mori-io was built without CUDA");
}

#else

namespace {

// `device` current for the scope, with its primary context made current as well.
class BoundDevice {
 public:
  explicit BoundDevice(int device) : scope_(device) { MORI_CUDA_CHECK(cudaSetDevice(device)); }

 private:
  cuda::ScopedDevice scope_;
};

}  // namespace

double CudaCopySeconds(int src_dev, int dst_dev, uint64_t size, int batch, int iters,
                       bool sync_each, bool per_transfer) {
  MORI_CHECK_ARG(size > 0 && batch > 0 && iters > 0, "GPU copy baseline: size ", size, ", batch ",
                 batch, ", iters ", iters, " must be positive");
  const bool same_device = src_dev == dst_dev;
  BoundDevice scope(src_dev);
  if (!same_device) {
    for (auto [from, to] : {std::pair{src_dev, dst_dev}, std::pair{dst_dev, src_dev}}) {
      BoundDevice b(from);
      cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        MORI_CUDA_CHECK(e);
      }
    }
  }
  const size_t bytes = size * static_cast<size_t>(batch);
  char* src = nullptr;
  char* dst = nullptr;
  MORI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&src), bytes));
  {
    BoundDevice d(dst_dev);
    MORI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dst), bytes));
  }
  cudaStream_t s;
  MORI_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto copy = [&](size_t offset, size_t n) {
    if (same_device) {
      MORI_CUDA_CHECK(cudaMemcpyAsync(dst + offset, src + offset, n, cudaMemcpyDeviceToDevice, s));
    } else {
      MORI_CUDA_CHECK(cudaMemcpyPeerAsync(dst + offset, dst_dev, src + offset, src_dev, n, s));
    }
  };
  auto round = [&] {
    if (!per_transfer) return copy(0, bytes);
    for (int j = 0; j < batch; ++j) copy(static_cast<size_t>(j) * size, size);
  };
  for (int i = 0; i < 4; ++i) round();
  MORI_CUDA_CHECK(cudaStreamSynchronize(s));
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    round();
    if (sync_each) MORI_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  MORI_CUDA_CHECK(cudaStreamSynchronize(s));
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (void)cudaStreamDestroy(s);
  (void)cudaFree(src);
  {
    BoundDevice d(dst_dev);
    (void)cudaFree(dst);
  }
  return sec;
}

#endif  // MORI_IO_WITH_CUDA

}  // namespace mori::io
