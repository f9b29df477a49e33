// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>

namespace mori::io {

// Cross-memory attach: copies `len` bytes between `local` (this process) and
// `remote_addr` in process `pid`, in one kernel copy. `to_remote`: write into the
// peer (process_vm_writev), else read from it. Returns 0, or the errno that stopped it
// (EPERM: ptrace rules forbid it; ESRCH: no such process; EFAULT: bad address).
// MORI_IO_TEST_CMA_REFUSE=1 makes every call fail with EPERM, =peer every call to
// another process (tests of the fallback; read per call, copies are >= one page).
int CmaCopy(int pid, bool to_remote, char* local, uint64_t remote_addr, uint64_t len);

// The SHM backend's limit: `count` memcpy calls of `size` bytes between two buffers of
// this process (pages touched before timing).
struct MemcpyResult {
  double seconds = 0;
  uint64_t bytes = 0;
};
MemcpyResult MemcpyStream(uint64_t size, uint64_t count);

}  // namespace mori::io
