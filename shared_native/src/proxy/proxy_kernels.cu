// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Kernels that push into a proxy queue (mori/proxy/queue_device.cuh): the GPU side of
// the proxy microbenchmark and of its GPU tests (mori/proxy/bench.hpp).
#include <cuda_runtime.h>

#include "mori/core/cuda_runtime.hpp"
#include "mori/proxy/bench.hpp"
#include "mori/proxy/queue_device.cuh"

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

}  // namespace

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
