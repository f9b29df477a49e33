// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device side of a proxy command queue: kernels push commands (format and ordering
// in mori/proxy/command.hpp) through a QueueView from Proxy::DeviceQueue, passed to
// the kernel by value. Header-only; compiles with nvcc.
//
// Each call is made by one thread; any number of threads (of any blocks) may push
// into one queue concurrently, and the order of their commands is the order of the
// indices they claim. A signal covers the writes of other threads only if those were
// pushed before it (e.g. __syncthreads() between their pushes and the signal's).
//
// Waits (a full queue, Quiet, Barrier) are bounded by the view's timeout_ns and watch
// the proxy's health word: on a timeout or a failed proxy the thread prints why
// (prefixed "mori.proxy", with the proxy's error naming the lost pe and node) and the
// launch traps (mori::shmem::device::Trap's contract).

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "mori/proxy/command.hpp"
#include "mori/shmem/device.cuh"

namespace mori::proxy::device {

namespace detail {

__device__ __forceinline__ uint64_t LoadVolatile(const volatile uint64_t* p) { return *p; }
__device__ __forceinline__ uint32_t LoadVolatile32(const volatile uint32_t* p) { return *p; }

// Not inlined, scalars only, so that the waits keep their registers.
static __device__ __noinline__ void TrapQueue(const QueueView& q, const char* what, uint64_t index,
                                              uint64_t seen) {
  const uint32_t health = LoadVolatile32(&q.control->health);
  printf(
      "mori.proxy queue %d of pe %d: %s (command %llu, counter at %llu, timeout %llu ms); "
      "proxy %s, posting to pe %d: %s [block %d thread %d]\n",
      q.queue_id, q.my_pe, what, static_cast<unsigned long long>(index),
      static_cast<unsigned long long>(seen),
      static_cast<unsigned long long>(q.timeout_ns / 1000000),
      health == kFailed ? "failed" : (health == kClosed ? "closed" : "alive"),
      static_cast<int>(q.control->posting_pe),
      health == kFailed ? const_cast<const char*>(q.control->error) : "-",
      static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
  mori::shmem::device::TrapReported();
  mori::shmem::device::TrapAfterReport();
}

// Waits until *counter >= floor; traps on timeout or an unhealthy proxy.
__device__ __forceinline__ void WaitCounter(const QueueView& q, const volatile uint64_t* counter,
                                            uint64_t floor, const char* what, uint64_t index) {
  uint64_t seen = LoadVolatile(counter);
  if (seen >= floor) return;
  const uint64_t start = mori::shmem::device::GlobalTimerNs();
  for (;;) {
    seen = LoadVolatile(counter);
    if (seen >= floor) break;
    if (LoadVolatile32(&q.control->health) != kHealthy) TrapQueue(q, what, index, seen);
    if (mori::shmem::device::GlobalTimerNs() - start > q.timeout_ns) {
      TrapQueue(q, what, index, seen);
    }
    __nanosleep(64);
  }
  // The proxy's writes before it advanced the counter are visible after this.
  __threadfence_system();
}

}  // namespace detail

// Claims the next index, waits (bounded) for its slot to be free, writes the command
// and publishes it. Returns the index.
__device__ __forceinline__ uint64_t Push(const QueueView& q, uint32_t op, int pe,
                                         uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes,
                                         uint64_t signal_offset, uint64_t value) {
  const uint64_t index = atomicAdd(reinterpret_cast<unsigned long long*>(q.head), 1ull);
  if (index >= q.capacity) {
    detail::WaitCounter(q, &q.control->tail, index - q.capacity + 1, "queue full", index);
  }
  volatile Command* slot = q.slots + (index & (q.capacity - 1));
  slot->op = op;
  slot->pe = pe;
  slot->dst_offset = dst_offset;
  slot->src_offset = src_offset;
  slot->nbytes = nbytes;
  slot->signal_offset = signal_offset;
  slot->value = value;
  slot->reserved = 0;
  // The fields (and the data the command points at, written by this thread or made
  // visible to it before) reach system scope before the ready mark.
  __threadfence_system();
  mori::shmem::device::StoreRelease(const_cast<uint64_t*>(&slot->seq), index + 1);
  return index;
}

__device__ __forceinline__ uint64_t PushWrite(const QueueView& q, int pe, uint64_t dst_offset,
                                              uint64_t src_offset, uint64_t nbytes) {
  return Push(q, static_cast<uint32_t>(Op::kWrite), pe, dst_offset, src_offset, nbytes, 0, 0);
}

__device__ __forceinline__ uint64_t PushAtomicAdd(const QueueView& q, int pe,
                                                  uint64_t signal_offset, uint64_t value) {
  return Push(q, static_cast<uint32_t>(Op::kAtomicAdd), pe, 0, 0, 0, signal_offset, value);
}

__device__ __forceinline__ uint64_t PushWriteAdd(const QueueView& q, int pe, uint64_t dst_offset,
                                                 uint64_t src_offset, uint64_t nbytes,
                                                 uint64_t signal_offset, uint64_t value) {
  return Push(q, static_cast<uint32_t>(Op::kWriteAdd), pe, dst_offset, src_offset, nbytes,
              signal_offset, value);
}

// Waits until commands with index < upto have retired.
__device__ __forceinline__ void WaitRetired(const QueueView& q, uint64_t upto) {
  detail::WaitCounter(q, &q.control->retired, upto, "waiting for retirement", upto - 1);
}

// Every earlier command of the queue has completed at its target when it returns.
__device__ __forceinline__ void Quiet(const QueueView& q) {
  const uint64_t index = Push(q, static_cast<uint32_t>(Op::kQuiet), 0, 0, 0, 0, 0, 0);
  detail::WaitCounter(q, &q.control->retired, index + 1, "quiet", index);
}

// Collective over every pe's proxy (see Op::kBarrier).
__device__ __forceinline__ void Barrier(const QueueView& q) {
  const uint64_t index = Push(q, static_cast<uint32_t>(Op::kBarrier), 0, 0, 0, 0, 0, 0);
  detail::WaitCounter(q, &q.control->retired, index + 1, "barrier", index);
}

}  // namespace mori::proxy::device
