// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "shm/cma_copy.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "mori/core/error.hpp"

namespace mori::io {

namespace {
#if MORI_IO_TESTING
std::atomic<CmaFaultHook> fault_hook{nullptr};
#endif

// The errno a test build's fault switch fails this call with; 0 otherwise.
int InjectedFault([[maybe_unused]] int pid, [[maybe_unused]] bool spans) {
#if MORI_IO_TESTING
  if (CmaFaultHook hook = fault_hook.load(std::memory_order_acquire)) return hook(pid, spans);
#endif
  return 0;
}
}  // namespace

#if MORI_IO_TESTING
void SetCmaFaultHookForTesting(CmaFaultHook hook) {
  fault_hook.store(hook, std::memory_order_release);
}
#endif

int CmaCopy(int pid, bool to_remote, char* local, uint64_t remote_addr, uint64_t len) {
  if (int err = InjectedFault(pid, false)) return err;
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

int CmaCopySpans(int pid, bool to_remote, char* local_base, uint64_t remote_base,
                 const CmaSpan* spans, size_t n) {
  if (int err = InjectedFault(pid, true)) return err;
  constexpr size_t kIov = 1024;  // UIO_MAXIOV
  iovec l[kIov];
  iovec r[kIov];
  size_t i = 0;
  while (i < n) {
    size_t k = 0;
    uint64_t want = 0;
    for (; i < n && k < kIov; ++i) {
      if (spans[i].size == 0) continue;
      l[k] = {local_base + spans[i].local_offset, spans[i].size};
      r[k] = {reinterpret_cast<void*>(remote_base + spans[i].remote_offset), spans[i].size};
      want += spans[i].size;
      ++k;
    }
    if (k == 0) break;
    ssize_t got;
    do {
      got = to_remote ? ::process_vm_writev(pid, l, k, r, k, 0)
                      : ::process_vm_readv(pid, l, k, r, k, 0);
    } while (got < 0 && errno == EINTR);
    if (got < 0) return errno;
    if (static_cast<uint64_t>(got) == want) continue;
    // Short: the kernel stopped at a page it could not reach or at its per-call limit.
    // Finish span by span from where it stopped (a bad page then fails with its errno).
    uint64_t done = static_cast<uint64_t>(got);
    for (size_t j = 0; j < k; ++j) {
      uint64_t len = l[j].iov_len;
      uint64_t skip = std::min(done, len);
      done -= skip;
      if (skip == len) continue;
      int err = CmaCopy(pid, to_remote, static_cast<char*>(l[j].iov_base) + skip,
                        reinterpret_cast<uint64_t>(r[j].iov_base) + skip, len - skip);
      if (err != 0) return err;
    }
  }
  return 0;
}

std::string PackCmaGrant(const CmaGrant& g) {
  static_assert(sizeof(CmaGrant) == 40, "grant layout");
  return std::string(reinterpret_cast<const char*>(&g), sizeof(g));
}

CmaGrant UnpackCmaGrant(const std::string& bytes) {
  CmaGrant g;
  if (bytes.size() != sizeof(g)) {
    MORI_THROW(InvalidArgumentError, "SHM CMA grant of ", bytes.size(), " bytes (expected ",
               sizeof(g), ")");
  }
  std::memcpy(&g, bytes.data(), sizeof(g));
  if (g.pid <= 0 || g.addr + g.size < g.addr) {
    MORI_THROW(InvalidArgumentError, "SHM CMA grant: range [", g.addr, ", +", g.size, ") of pid ",
               g.pid);
  }
  CheckLivenessGrant(g.live);
  return g;
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
