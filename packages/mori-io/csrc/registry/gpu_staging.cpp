// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "registry/gpu_staging.hpp"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "mori/core/cuda.hpp"
#include "mori/core/error.hpp"

#if MORI_IO_WITH_CUDA
#include "mori/core/cuda_runtime.hpp"
#endif

namespace mori::io::staging {

const std::string& Unavailable() {
  static const std::string why = []() -> std::string {
#if MORI_IO_WITH_CUDA
    if (cuda::DeviceCount() > 0) return {};
    std::string r = cuda::UnavailableReason();
    return r.empty() ? "no CUDA device is visible" : r;
#else
    return "mori-io was built without CUDA";
#endif
  }();
  return why;
}

#if MORI_IO_WITH_CUDA

namespace {

// Pinned buffers by power-of-two size; at most kKeepBytes kept idle.
class Pool {
 public:
  static constexpr size_t kKeepBytes = 256 << 20;
  char* Get(size_t cap) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& fl = free_[cap];
      if (!fl.empty()) {
        char* p = fl.back();
        fl.pop_back();
        idle_ -= cap;
        return p;
      }
    }
    void* p = nullptr;
    MORI_CUDA_CHECK(cudaHostAlloc(&p, cap, cudaHostAllocPortable));
    return static_cast<char*>(p);
  }
  void Put(char* p, size_t cap) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (idle_ + cap <= kKeepBytes) {
        free_[cap].push_back(p);
        idle_ += cap;
        return;
      }
    }
    (void)cudaFreeHost(p);
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<char*>> free_;
  size_t idle_ = 0;
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: buffers may outlive static teardown
  return *pool;
}

}  // namespace

std::shared_ptr<char> Buffer(size_t n) {
  if (n > kPinnedMax) {
    char* p = static_cast<char*>(std::malloc(n == 0 ? 1 : n));
    if (p == nullptr) MORI_THROW(OutOfMemoryError, "staging buffer of ", n, " bytes");
    return std::shared_ptr<char>(p, [](char* q) { std::free(q); });
  }
  size_t cap = 4096;
  while (cap < n) cap <<= 1;
  char* p = ThePool().Get(cap);
  return std::shared_ptr<char>(p, [cap](char* q) { ThePool().Put(q, cap); });
}

namespace {

// The calling thread's non-blocking stream on `device` (the current device), created on
// first use and destroyed when the thread exits. A copy on the legacy default stream
// (plain cudaMemcpy) would wait for every kernel the application queued on a blocking
// stream of this context and hold up everything it queues after: a transfer landing in
// GPU memory then waits for unrelated compute, and deadlocks against a kernel that waits
// for the transfer's sender.
cudaStream_t CopyStream(int device) {
  struct Streams {
    std::unordered_map<int, cudaStream_t> by_device;
    ~Streams() {
      for (auto& entry : by_device) (void)cudaStreamDestroy(entry.second);
    }
  };
  thread_local Streams streams;
  auto it = streams.by_device.find(device);
  if (it != streams.by_device.end()) return it->second;
  cudaStream_t stream = nullptr;
  MORI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  streams.by_device.emplace(device, stream);
  return stream;
}

void Copy(char* dst, const char* src, size_t n, int device, cudaMemcpyKind kind) {
  cuda::ScopedDevice scope(device);
  cudaStream_t stream = CopyStream(device);
  MORI_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, stream));
  MORI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

void ToHost(char* dst, const char* src_gpu, size_t n, int device) {
  Copy(dst, src_gpu, n, device, cudaMemcpyDeviceToHost);
}

void ToDevice(char* dst_gpu, const char* src, size_t n, int device) {
  Copy(dst_gpu, src, n, device, cudaMemcpyHostToDevice);
}

#else

std::shared_ptr<char> Buffer(size_t) { MORI_THROW(NotSupportedError, "staging: ", Unavailable()); }
void ToHost(char*, const char*, size_t, int) {
  MORI_THROW(NotSupportedError, "staging: ", Unavailable());
}
void ToDevice(char*, const char*, size_t, int) {
  MORI_THROW(NotSupportedError, "staging: ", Unavailable());
}

#endif

}  // namespace mori::io::staging
