// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// How a proxy thread touches a CUDA heap while kernels that push into the proxy may
// be running (and spinning until the proxy has served them): one DeviceLane per
// thread that applies or stages commands. Private to the proxy; no CUDA types here.
//
// The rule (see DeviceLane's constructor): on the proxy's threads, nothing may wait
// for a producer kernel. So a lane works only on its own cudaStreamNonBlocking stream
// (copies with cudaMemcpyAsync, atomic adds with the proxy's own kernel, waits with
// cudaStreamSynchronize of that stream); staging buffers are pinned; everything that
// may synchronize the device (allocations, the kernel's first launch, which loads it
// under CUDA's lazy module loading) happens in the constructor, on the thread that
// builds the proxy, before any producer kernel of this proxy exists. Never the
// legacy default stream, cudaMemcpy/cudaMemset, cudaDeviceSynchronize, allocations,
// or mori::shmem's host ops from a proxy thread.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mori::proxy::internal {

class DeviceLane {
 public:
  // `who` names the lane in errors ("proxy of pe 0 (node 'n0') tcp receiver").
  // Throws NotSupportedError in a libmori_core built without CUDA.
  DeviceLane(int device, size_t staging_bytes, std::string who);
  ~DeviceLane();
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

  // Pinned host memory of staging_bytes() (0 when none was asked for).
  char* staging() const { return staging_; }
  size_t staging_bytes() const { return staging_bytes_; }

  // Enqueues a copy (any direction, cudaMemcpyDefault) on the lane; returns at once.
  void Copy(void* dst, const void* src, size_t nbytes);
  // Enqueues *word += value (a release atomic at system scope) after everything
  // enqueued before on the lane; returns at once.
  void Add(uint64_t* word, uint64_t value);
  // Waits until everything enqueued on the lane has completed (this lane only).
  void Sync();
  // Whether anything was enqueued since the last Sync.
  bool pending() const { return pending_; }
  // Whether a copy was enqueued since the last Sync (adds alone need no wait to retire).
  bool copied() const { return copied_; }
  // Syncs that waited (something was pending); read from any thread.
  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }

 private:
  void Release() noexcept;

  int device_;
  std::string who_;
  void* stream_ = nullptr;  // cudaStream_t
  char* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  uint64_t* scratch_ = nullptr;  // device word the warm-up launch adds 0 to
  bool pending_ = false;
  bool copied_ = false;
  std::atomic<uint64_t> waits_{0};
};

}  // namespace mori::proxy::internal
