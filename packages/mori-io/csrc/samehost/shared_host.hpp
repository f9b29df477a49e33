// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Host memory that other processes of this host can map. An allocation is a memfd
// mapped MAP_SHARED here; a peer engine that is granted a region inside one fetches the
// fd (pidfd_getfd), maps it and moves bytes with a plain memcpy — one copy, no page
// pinning per transfer (what CMA costs). Regions elsewhere keep using CMA.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace mori::io {

class TargetLiveness;

// Duplicates fd `fd` of process `pid` into this process (pidfd_getfd, Linux >= 5.6,
// ptrace access as for CMA); -1 with *error set otherwise.
int PidfdGetFd(int pid, int fd, std::string* error);
// A pidfd of process `pid` (pidfd_open, Linux >= 5.3); -1 with *error set otherwise.
int PidfdOpen(int pid, std::string* error);
// Whether the process behind `pidfd` has exited (its pidfd is readable then); never
// blocks. False for pidfd < 0.
bool PidfdExited(int pidfd);

// Process-wide registry of shared host allocations; they outlive engines.
struct SharedHostBlock {
  uintptr_t addr = 0;
  uint64_t size = 0;
  int fd = -1;
};
SharedHostBlock AllocateSharedHost(uint64_t size);  // throws OutOfMemoryError / InternalError
void FreeSharedHost(uintptr_t addr);  // the address of a block AllocateSharedHost returned
// The allocation that contains [addr, addr + size), if any.
bool FindSharedHost(uintptr_t addr, uint64_t size, SharedHostBlock* out);

// The NUMA node holding the page at `addr` (faulting it in, as get_mempolicy does);
// -1 where the kernel cannot say (no NUMA support, an unmapped address).
int NumaNodeOf(uintptr_t addr) noexcept;

// What a grant says about the target's liveness page (16 bytes on the wire, inside
// ShmMapGrant and CmaGrant). tid 0: the target offers no word; poll its pidfd instead.
struct LivenessGrant {
  int32_t fd = -1;           // the page's memfd in the target's fd table
  uint32_t word_offset = 0;  // of the futex word within the page
  int32_t tid = 0;           // the holder's tid: the word's value while it lives
  uint32_t page_size = 0;
};
static_assert(sizeof(LivenessGrant) == 16, "liveness grant layout");
// Refuses (InvalidArgumentError) a grant whose word lies outside its page.
void CheckLivenessGrant(const LivenessGrant& g);

// What a target sends for a region inside a shared allocation (fixed 48 bytes).
struct ShmMapGrant {
  int32_t pid = 0;
  int32_t fd = 0;              // in the target's fd table
  uint64_t block_size = 0;     // bytes of the whole allocation
  uint64_t region_offset = 0;  // the region's first byte within it
  uint64_t region_size = 0;
  LivenessGrant live;  // the target engine's liveness page (liveness.hpp)
};
std::string PackShmMapGrant(const ShmMapGrant& g);
ShmMapGrant UnpackShmMapGrant(const std::string& bytes);  // InvalidArgumentError if malformed

// A peer's region mapped here; unmapped when the last reference goes (copies in
// progress hold one), then `released` runs (a revoke's acknowledgement).
struct ShmMapping {
  char* region = nullptr;
  uint64_t size = 0;
  void* base = nullptr;
  uint64_t map_len = 0;
  // The granting engine. Our mapping keeps its pages alive after it dies, so a copy
  // would still "succeed": a copy checks the owner's liveness before it reports success.
  std::shared_ptr<const TargetLiveness> owner;
  std::function<void()> released;
  ~ShmMapping();
};
std::shared_ptr<ShmMapping> MapPeerRegion(const ShmMapGrant& g, std::string* error);

}  // namespace mori::io
