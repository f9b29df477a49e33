// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The memory behind a symmetric heap. shmem.cpp owns the allocator, the
// collective checks and the protocols; a backend only creates, shares, maps and
// moves bytes. Host backend: host_backend.cpp. CUDA backend: cuda_backend.cpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mori/bootstrap/bootstrap.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::shmem::internal {

// The pes that share this node, i.e. can map each other's memory.
struct LocalGroup {
  std::vector<int> local_pes;       // ascending
  std::vector<int> local_index_of;  // per pe: its index in local_pes, or -1
  int my_local_index = 0;
  std::string group_id;  // unique per Init, same on every pe of the job
};

struct BackendOptions {
  size_t heap_size;  // already rounded by the caller to a multiple of 2 MiB
  int device;
  HandleType handle_type;
  std::chrono::milliseconds timeout;
};

class HeapBackend {
 public:
  virtual ~HeapBackend() = default;
  virtual MemoryKind kind() const = 0;
  // Base of pe's heap in this process, nullptr when not mapped (other node).
  virtual char* base(int pe) const = 0;
  virtual size_t size() const = 0;
  virtual HandleType handle_type() const { return HandleType::kNone; }
  virtual std::string handle_notes() const { return ""; }

  // Host-side byte moves between any mapped memory and host memory (either
  // side may be symmetric); CUDA backends complete the copy before returning.
  virtual void Copy(void* dst, const void* src, size_t nbytes) = 0;
  // Atomic update of a (possibly remote) 64-bit word with release semantics.
  virtual void SignalWord(uint64_t* addr, uint64_t value, SignalOp op) = 0;
  // Acquire load of a 64-bit word in this process's mapping.
  virtual uint64_t LoadWord(const uint64_t* addr) = 0;
  // The peer-base table in memory the kernels of this heap can read (device
  // memory for CUDA backends); n_pes entries.
  virtual char* const* peer_bases_for_kernels() const = 0;
  // Device barrier on a stream (CUDA backends only).
  virtual void BarrierOnStream(const DeviceContext& ctx, uintptr_t stream);
  // Called once before teardown, collectively, after a barrier.
  virtual void Release() = 0;
};

std::unique_ptr<HeapBackend> CreateHostBackend(bootstrap::Bootstrap& bootstrap,
                                               const LocalGroup& group,
                                               const BackendOptions& options);

// Defined in cuda_backend.cpp when built with CUDA; otherwise throws
// NotSupportedError.
std::unique_ptr<HeapBackend> CreateCudaBackend(bootstrap::Bootstrap& bootstrap,
                                               const LocalGroup& group,
                                               const BackendOptions& options);

// Gives every local pe a file descriptor of every other local pe: each passes
// its own fd (or -1 if it has none to share) and receives, per local index, a
// descriptor it owns (a dup of its own; -1 where that pe passed -1). Descriptors
// travel with SCM_RIGHTS over abstract Unix sockets named after group.group_id.
std::vector<int> ExchangeFds(bootstrap::Bootstrap& bootstrap, const LocalGroup& group, int my_fd,
                             std::chrono::milliseconds timeout);

}  // namespace mori::shmem::internal
