// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Host API of mori's symmetric heap (OpenSHMEM style). One heap per process,
// created collectively by Init over a bootstrap group. Host heaps (shared memory,
// one mapping per node) make every protocol runnable without a GPU; CUDA heaps
// (cuMem allocations exported as fabric or POSIX-fd handles and mapped into each
// peer) are what kernels use.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mori/bootstrap/bootstrap.hpp"
#include "mori/core/macros.hpp"
#include "mori/shmem/context.hpp"

namespace mori::shmem {

enum class MemoryKind : int { kHost = 0, kCuda = 1 };
// How a CUDA heap is shared: a fabric handle (NVLink/IMEX domains, spans nodes),
// a POSIX file descriptor (one node), or whichever works (fabric first).
enum class HandleType : int { kAuto = 0, kFabric = 1, kPosixFd = 2, kNone = 3 };

struct InitOptions {
  // Bytes per pe; 0 means MORI_SHMEM_HEAP_SIZE ("512M", "2G", bytes) or 1 GiB.
  size_t heap_size = 0;
  // CUDA device ordinal for a CUDA heap; -1 for a host heap.
  int device = -1;
  // kAuto means MORI_SHMEM_HANDLE (auto|fabric|posix_fd) or auto.
  HandleType handle_type = HandleType::kAuto;
  // Bounds every wait of the collective calls (init, malloc, barrier).
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

struct HeapInfo {
  MemoryKind kind;
  int device;
  HandleType handle_type;    // what a CUDA heap uses (kNone for host heaps)
  std::string handle_notes;  // which handle types were tried and why each failed
  size_t heap_size;          // usable bytes per pe
  size_t used_bytes;         // by live user allocations (alignment included)
  size_t free_bytes;
  size_t largest_free_block;
  size_t live_allocations;
  std::vector<int> local_pes;  // pes sharing this node (load/store reachable)
};

// Collective over `bootstrap`. Throws InvalidStateError if already initialized.
MORI_API void Init(std::shared_ptr<bootstrap::Bootstrap> bootstrap, const InitOptions& options);
// Collective. With live user allocations it throws InvalidStateError naming them,
// unless `force`.
MORI_API void Finalize(bool force = false);
MORI_API bool Initialized() noexcept;
// Incremented by every Init: owners of symmetric buffers (e.g. tensors) compare it
// to tell whether the heap their buffer came from still exists.
MORI_API uint64_t Generation() noexcept;

MORI_API int MyPe();
MORI_API int NPes();
MORI_API HeapInfo GetHeapInfo();
MORI_API DeviceContext GetDeviceContext();
// The bootstrap the heap was initialized over (its ranks are the pes), for components
// that build their own collective state over the same group (mori::proxy::Proxy).
MORI_API std::shared_ptr<bootstrap::Bootstrap> GetBootstrap();
// Runs `fn` at the start of the next Finalize, before anything is checked or released
// (in registration order; every pe registers alike, so a collective `fn` is matched):
// components whose collective state lives as long as the heap (a mori::proxy::Proxy)
// close there, in an orderly way, instead of dropping their peers at process exit.
MORI_API void AtFinalize(std::function<void()> fn);

// Collective: every pe passes the same nbytes and align, in the same order; the
// result is a symmetric pointer (same offset on every pe). Mismatches are detected
// and reported on every pe (InvalidArgumentError); exhaustion throws
// OutOfMemoryError naming the requested, free, largest-free and total sizes.
MORI_API void* Malloc(size_t nbytes, size_t align = 256);
// Local. Throws InvalidArgumentError for a pointer that is not a live allocation
// (double free, foreign or interior pointer).
MORI_API void Free(void* ptr);
// Whether `ptr` (with `nbytes`) lies in this pe's heap.
MORI_API bool IsSymmetric(const void* ptr, size_t nbytes = 1);

// pe's copy of symmetric address `sym`, or nullptr when pe is not load/store
// reachable from this process.
MORI_API void* Ptr(const void* sym, int pe);

// Host-initiated operations. For CUDA heaps they synchronize with the device
// (they are control-path calls, not kernels).
MORI_API void Put(void* dst_sym, const void* src, size_t nbytes, int pe);
MORI_API void Get(void* dst, const void* src_sym, size_t nbytes, int pe);
// Release semantics: data written before the signal is visible to a pe that
// observes the signal with WaitUntil.
MORI_API void Signal(uint64_t* sig_sym, uint64_t value, int pe, SignalOp op);
// Acquire semantics; waits on this pe's copy of sig_sym. Returns the value seen;
// throws TimeoutError naming the signal, comparison and last value.
MORI_API uint64_t WaitUntil(uint64_t* sig_sym, Cmp cmp, uint64_t value,
                            std::chrono::milliseconds timeout);
// One thread per pe at a time (each pe keeps one epoch counter).
MORI_API void BarrierAll();
// CUDA heaps: enqueue a device barrier on `stream` (a cudaStream_t as integer);
// capturable in CUDA graphs. Throws NotSupportedError for host heaps.
MORI_API void BarrierOnStream(uintptr_t stream);

MORI_API const char* HandleTypeName(HandleType type) noexcept;
MORI_API HandleType ParseHandleType(const std::string& name);
// Parses "1G", "512M", "64K", "4096" (binary units).
MORI_API size_t ParseSize(const std::string& text);

}  // namespace mori::shmem
