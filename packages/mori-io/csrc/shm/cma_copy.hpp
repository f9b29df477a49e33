// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "samehost/shared_host.hpp"

namespace mori::io {

// Cross-memory attach: copies `len` bytes between `local` (this process) and
// `remote_addr` in process `pid`, in one kernel copy. `to_remote`: write into the
// peer (process_vm_writev), else read from it. Returns 0, or the errno that stopped it
// (EPERM: ptrace rules forbid it; ESRCH: no such process; EFAULT: bad address).
int CmaCopy(int pid, bool to_remote, char* local, uint64_t remote_addr, uint64_t len);

// One span of a transfer (the layout of the engine's TransferSpan).
struct CmaSpan {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t size;
};
// Every span of a transfer between `local_base` and `remote_base` of process `pid`,
// with as few process_vm_writev/readv calls as the kernel's iovec limit allows. The
// caller checked the spans against both regions. 0 or the errno that stopped it (as
// CmaCopy).
int CmaCopySpans(int pid, bool to_remote, char* local_base, uint64_t remote_base,
                 const CmaSpan* spans, size_t n);

#if MORI_IO_TESTING
// Test builds only (MORI_IO_TESTING=ON): a fault switch CmaCopy and CmaCopySpans ask
// before copying; it returns the errno to fail the call with, or 0. `spans`: the call
// is CmaCopySpans (a transfer's copy), else CmaCopy (the CMA probes, and the
// finishing of a short CmaCopySpans). csrc/testing/ installs one.
using CmaFaultHook = int (*)(int pid, bool spans);
void SetCmaFaultHookForTesting(CmaFaultHook hook);
#endif

// What a target sends for a registered host region an initiator may copy into and out
// of with CMA (kShmCmaGrant, fixed 40 bytes): the absolute range, checked against the
// target's registry when granted.
struct CmaGrant {
  int32_t pid = 0;
  int32_t reserved = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  LivenessGrant live;  // the target engine's liveness page (liveness.hpp)
};
std::string PackCmaGrant(const CmaGrant& g);
CmaGrant UnpackCmaGrant(const std::string& bytes);  // InvalidArgumentError if malformed

// A target region this initiator holds a CMA grant for; when the last reference goes
// (copies in progress hold one) `released` runs (a revoke's acknowledgement).
struct CmaRemote {
  int pid = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  std::shared_ptr<const TargetLiveness> owner;
  std::function<void()> released;
  ~CmaRemote() {
    if (released) released();
  }
};

// The SHM backend's limit: `count` memcpy calls of `size` bytes between two buffers of
// this process (pages touched before timing).
struct MemcpyResult {
  double seconds = 0;
  uint64_t bytes = 0;
};
MemcpyResult MemcpyStream(uint64_t size, uint64_t count);

}  // namespace mori::io
