// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Kernels that push into a proxy queue (mori/proxy/queue_device.cuh): the GPU side of
// the proxy microbenchmark and of its GPU tests (mori/proxy/bench.hpp).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "mori/core/cuda_runtime.hpp"
#include "mori/proxy/bench.hpp"
#include "mori/proxy/queue_device.cuh"
#include "proxy_kernels.hpp"

namespace mori::proxy {
namespace {

// Thread 0 of each block pushes `per_block` copies of the command; with `quiet`, it
// then waits for all of them to complete.
__global__ void PushKernel(QueueView q, Command c, uint64_t per_block, bool quiet) {
  if (threadIdx.x != 0) return;
  for (uint64_t i = 0; i < per_block; ++i) {
    device::Push(q, c.op, c.pe, c.dst_offset, c.src_offset, c.nbytes, c.signal_offset, c.value);
  }
  if (quiet) device::Quiet(q);
}

// One thread: `count` times push one command and wait until it retired; out_ns[i] is
// the globaltimer time of round trip i.
__global__ void PushLatencyKernel(QueueView q, Command c, uint64_t count, uint64_t* out_ns) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t t0 = mori::shmem::device::GlobalTimerNs();
    const uint64_t index =
        device::Push(q, c.op, c.pe, c.dst_offset, c.src_offset, c.nbytes, c.signal_offset, c.value);
    device::WaitRetired(q, index + 1);
    out_ns[i] = mori::shmem::device::GlobalTimerNs() - t0;
  }
}

// The add of a kAtomicAdd/kWriteAdd applied to a CUDA heap: stream order puts it
// after the copies enqueued before it; the release makes them visible with it.
__global__ void HeapAddKernel(uint64_t* word, uint64_t value) {
  __threadfence_system();
  mori::shmem::device::AtomicAddRelease(word, value);
}

// words[0]: the kernel's ping, words[1]: the host's echo (both pinned, mapped).
__global__ void PingPongKernel(volatile uint64_t* words, uint64_t count, uint64_t timeout_ns,
                               uint64_t* out_ns) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (uint64_t i = 1; i <= count; ++i) {
    const uint64_t t0 = mori::shmem::device::GlobalTimerNs();
    __threadfence_system();
    words[0] = i;
    while (words[1] != i) {
      if (mori::shmem::device::GlobalTimerNs() - t0 > timeout_ns) {
        printf("mori.proxy ping-pong: no echo of %llu within %llu ms\n",
               static_cast<unsigned long long>(i),
               static_cast<unsigned long long>(timeout_ns / 1000000));
        mori::shmem::device::TrapReported();
        mori::shmem::device::TrapAfterReport();
      }
    }
    out_ns[i - 1] = mori::shmem::device::GlobalTimerNs() - t0;
  }
}

}  // namespace

namespace internal {

void LaunchHeapAdd(uint64_t* word, uint64_t value, cudaStream_t stream) {
  HeapAddKernel<<<1, 1, 0, stream>>>(word, value);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace internal

std::vector<uint64_t> MeasureMappedPingPong(int device, uint64_t count, uint64_t timeout_ns) {
  cuda::ScopedDevice guard(device);
  uint64_t* words = nullptr;
  uint64_t* out = nullptr;
  MORI_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&words), 2 * sizeof(uint64_t), cudaHostAllocMapped));
  std::vector<uint64_t> ns(count);
  cudaStream_t stream = nullptr;
  try {
    words[0] = words[1] = 0;
    MORI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), count * sizeof(uint64_t) + 8));
    MORI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void* dwords = nullptr;
    MORI_CUDA_CHECK(cudaHostGetDevicePointer(&dwords, words, 0));
    PingPongKernel<<<1, 32, 0, stream>>>(static_cast<volatile uint64_t*>(dwords), count, timeout_ns,
                                         out);
    MORI_CUDA_CHECK(cudaGetLastError());
    volatile uint64_t* w = words;
    for (uint64_t i = 1; i <= count; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      while (w[0] != i) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(timeout_ns)) {
          MORI_THROW(TimeoutError, "mapped ping-pong: no ping ", i, " from the kernel within ",
                     timeout_ns / 1000000, " ms");
        }
      }
      w[1] = i;
    }
    MORI_CUDA_CHECK(cudaStreamSynchronize(stream));
    MORI_CUDA_CHECK(cudaMemcpy(ns.data(), out, count * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  } catch (...) {
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    if (out != nullptr) (void)cudaFree(out);
    (void)cudaFreeHost(words);
    throw;
  }
  (void)cudaStreamDestroy(stream);
  (void)cudaFree(out);
  (void)cudaFreeHost(words);
  return ns;
}

void LaunchDevicePush(const QueueView& device_view, const Command& command, uint64_t per_block,
                      int blocks, bool quiet, uintptr_t stream) {
  MORI_CHECK_ARG(blocks >= 1, "blocks ", blocks, " must be >= 1");
  PushKernel<<<blocks, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(device_view, command,
                                                                        per_block, quiet);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchDevicePushLatency(const QueueView& device_view, const Command& command, uint64_t count,
                             uint64_t* out_ns, uintptr_t stream) {
  PushLatencyKernel<<<1, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(device_view, command,
                                                                          count, out_ns);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::proxy
