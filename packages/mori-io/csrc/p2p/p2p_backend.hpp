// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The P2P backend: GPU memory of two processes (or two engines of one process) on one
// host, moved by the initiator's GPU through CUDA IPC mappings of the target's
// registered regions. The target exports a region once (a legacy IPC handle for
// cudaMalloc memory, POSIX fds of each physical piece for cuMem / expandable-segment
// memory); the initiator maps it and copies with cudaMemcpyAsync (few large spans) or
// one gather/scatter kernel launch (batches of small blocks), on a pool of streams,
// and a completion thread polls the copies' events. This header needs no CUDA headers:
// without CUDA the backend reports itself unavailable.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ledger/transfer_state.hpp"

namespace mori::io {

struct P2pBackendConfig {
  int num_streams = 4;  // copy streams per GPU, used round robin by transfers
  int max_blocks = 64;  // SMs (blocks of 512 threads) a gather/scatter kernel may use
  // A transfer of at least this many spans whose mean span is at most kernel_max_mean_span
  // bytes goes through one kernel launch; otherwise one cudaMemcpyAsync per span (copy
  // engines, no SMs).
  int kernel_min_spans = 2;
  uint64_t kernel_max_mean_span = 4ull << 20;
};

// What a target sends so that a process on its host can map one registered region.
struct P2pExport {
  enum Kind : uint8_t { kLegacyIpc = 1, kPosixFd = 2 };
  struct Piece {
    int32_t fd;       // in the target's fd table (fetched with pidfd_getfd)
    uint64_t offset;  // from the start of the mapping
    uint64_t size;
  };
  Kind kind = kLegacyIpc;
  int32_t pid = 0;              // the target process
  uint8_t gpu_uuid[16] = {};    // the GPU holding the memory
  uint64_t region_addr = 0;     // the region's address in the target (same process: used as is)
  uint64_t region_size = 0;     // the registered size: the only bytes the initiator may touch
  uint64_t region_offset = 0;   // region_addr - start of the mapping
  uint64_t map_size = 0;        // bytes of the mapping (whole allocation / pieces)
  uint8_t ipc_handle[64] = {};  // kLegacyIpc: cudaIpcMemHandle_t of the allocation
  std::vector<Piece> pieces;    // kPosixFd
};

// Little-endian, versioned; Unpack throws InvalidArgumentError on anything malformed.
std::string PackP2pExport(const P2pExport& e);
P2pExport UnpackP2pExport(const char* data, size_t size);

// One imported region, unmapped when the last reference goes (in-flight copies hold one).
struct P2pMapping {
  char* region = nullptr;  // the region's first byte in this process
  uint64_t size = 0;       // region_size of the export
  int owner_device = -1;   // the local ordinal of the GPU holding it (-1: not visible here)
  int kind = 0;            // P2pExport::Kind it was imported from; 0: same process, direct
  std::function<void()> unmap;
  std::function<void()> released;  // after unmapping (a revoke's acknowledgement)
  ~P2pMapping() {
    if (unmap) unmap();
    if (released) released();
  }
};

struct P2pSpan {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t size;
};

using P2pDone = std::function<void(StatusDetail, std::string)>;

class P2pBackend {
 public:
  // "" when this build has CUDA and a device is visible, else why not.
  static std::string Unavailable();
  // Throws NotSupportedError (with Unavailable()'s reason) or InvalidArgumentError.
  explicit P2pBackend(const P2pBackendConfig& config);
  ~P2pBackend();
  P2pBackend(const P2pBackend&) = delete;
  P2pBackend& operator=(const P2pBackend&) = delete;

  const P2pBackendConfig& config() const { return config_; }

  // MORI's MemoryDesc.ipc_handle of GPU memory at `addr` on `device`: the 64-byte
  // cudaIpcMemHandle_t of the allocation holding it where that allocation is legacy-IPC
  // capable (cudaMalloc, torch's default allocator); "" for cuMem memory (expandable
  // segments, mori's heaps), for host memory and in a build without CUDA.
  static std::string LegacyIpcHandle(uintptr_t addr, int device);

  // Target side: the packed export of a registered GPU region (computed once per region
  // id and cached; exported fds stay open until Forget). Throws on CUDA failures.
  std::string Export(uint64_t region_id, uintptr_t addr, uint64_t size, int device);
  void Forget(uint64_t region_id);

  // Initiator side: maps an export for copies run by `local_device`.
  std::shared_ptr<P2pMapping> Import(const P2pExport& e, int local_device);

  // Copies spans between local memory (on `device`) and a mapping, asynchronously;
  // `done` runs on the completion thread once the bytes are in place (or failed).
  // Spans must have been bounds-checked by the caller.
  void Submit(bool write, int device, char* local_base, std::shared_ptr<P2pMapping> remote,
              const P2pSpan* spans, size_t n, P2pDone done);

  struct Impl;

 private:
  P2pBackendConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mori::io
