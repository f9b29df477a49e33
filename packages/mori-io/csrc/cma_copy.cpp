// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "cma_copy.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace mori::io {

int CmaCopy(int pid, bool to_remote, char* local, uint64_t remote_addr, uint64_t len) {
  // 1: refuse every copy (the engine's own probe fails); "peer": refuse copies to other
  // processes only (the per-peer probe at connect fails).
  const char* refuse = std::getenv("MORI_IO_TEST_CMA_REFUSE");
  if (refuse != nullptr &&
      (std::strcmp(refuse, "1") == 0 || (std::strcmp(refuse, "peer") == 0 && pid != ::getpid()))) {
    return EPERM;
  }
  while (len > 0) {
    iovec l{local, len};
    iovec r{reinterpret_cast<void*>(remote_addr), len};
    ssize_t n = to_remote ? ::process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    // A partial count means the copy stopped at a page it could not reach, or was cut
    // by the kernel's per-call limit: go on from there (a bad page fails next time).
    local += n;
    remote_addr += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  return 0;
}

MemcpyResult MemcpyStream(uint64_t size, uint64_t count) {
  std::vector<char> src(size, 1), dst(size, 0);
  std::memcpy(dst.data(), src.data(), size);  // warm: pages faulted in
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    src[0] = static_cast<char>(i);  // the copy cannot be hoisted out of the loop
    std::memcpy(dst.data(), src.data(), size);
  }
  auto t1 = std::chrono::steady_clock::now();
  volatile char sink = dst[0];
  (void)sink;
  return {std::chrono::duration<double>(t1 - t0).count(), size * count};
}

}  // namespace mori::io
