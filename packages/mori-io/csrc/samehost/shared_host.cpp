// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "samehost/shared_host.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "mori/core/error.hpp"
#include "mori/core/str.hpp"

namespace mori::io {

int NumaNodeOf(uintptr_t addr) noexcept {
#ifdef SYS_get_mempolicy
  // MPOL_F_NODE | MPOL_F_ADDR: the node of the page at addr (numaif.h, without libnuma).
  constexpr unsigned long kNodeOfAddr = (1 << 0) | (1 << 1);
  int node = -1;
  long rc =
      ::syscall(SYS_get_mempolicy, &node, nullptr, 0UL, reinterpret_cast<void*>(addr), kNodeOfAddr);
  return rc == 0 ? node : -1;
#else
  (void)addr;
  return -1;
#endif
}

int PidfdOpen(int pid, std::string* error) {
#if defined(SYS_pidfd_open)
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) *error = StrCat("pidfd_open(", pid, "): ", std::strerror(errno));
  return pidfd;
#else
  (void)pid;
  *error = "pidfd_open is not available in this build";
  return -1;
#endif
}

bool PidfdExited(int pidfd) {
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

namespace {
// fd `fd` of the process behind `pidfd` (pid `pid`, for the message), or -1 with *error.
int GetFdFrom(int pidfd, int pid, int fd, std::string* error) {
#if defined(SYS_pidfd_getfd)
  int local = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  int err = errno;
  if (local < 0) {
    *error =
        StrCat("pidfd_getfd(pid ", pid, ", fd ", fd, "): ", std::strerror(err),
               err == EPERM ? " (ptrace rules: kernel.yama.ptrace_scope, or another user)" : "");
  }
  return local;
#else
  (void)pidfd;
  (void)pid;
  (void)fd;
  *error = "pidfd_getfd is not available in this build";
  return -1;
#endif
}
}  // namespace

int PidfdGetFd(int pid, int fd, std::string* error) {
  int pidfd = PidfdOpen(pid, error);
  if (pidfd < 0) return -1;
  int local = GetFdFrom(pidfd, pid, fd, error);
  ::close(pidfd);
  return local;
}

namespace {
std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<uintptr_t, SharedHostBlock>& Registry() {
  static auto* blocks = new std::map<uintptr_t, SharedHostBlock>();  // outlives statics
  return *blocks;
}
}  // namespace

SharedHostBlock AllocateSharedHost(uint64_t size) {
  MORI_CHECK_ARG(size > 0, "allocate_shared_host_memory: size 0");
  int fd = static_cast<int>(::syscall(SYS_memfd_create, "mori-io-host", MFD_CLOEXEC));
  if (fd < 0) MORI_THROW(InternalError, "memfd_create: ", std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    ::close(fd);
    MORI_THROW(OutOfMemoryError, "shared host memory of ", size,
               " bytes: ftruncate: ", std::strerror(err));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    MORI_THROW(OutOfMemoryError, "shared host memory of ", size,
               " bytes: mmap: ", std::strerror(err));
  }
  const SharedHostBlock b{reinterpret_cast<uintptr_t>(p), size, fd};
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[b.addr] = b;
  return b;
}

void FreeSharedHost(uintptr_t addr) {
  SharedHostBlock b;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(addr);
    if (it == Registry().end()) return;
    b = it->second;
    Registry().erase(it);
  }
  ::munmap(reinterpret_cast<void*>(b.addr), b.size);
  ::close(b.fd);  // peers that mapped it keep their pages until they unmap
}

bool FindSharedHost(uintptr_t addr, uint64_t size, SharedHostBlock* out) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto& reg = Registry();
  auto it = reg.upper_bound(addr);
  if (it == reg.begin()) return false;
  --it;
  const SharedHostBlock& b = it->second;
  if (addr < b.addr || size > b.size || addr - b.addr > b.size - size) return false;
  *out = b;
  return true;
}

std::string PackShmMapGrant(const ShmMapGrant& g) {
  static_assert(sizeof(ShmMapGrant) == 48, "grant layout");
  return std::string(reinterpret_cast<const char*>(&g), sizeof(g));
}

ShmMapGrant UnpackShmMapGrant(const std::string& bytes) {
  ShmMapGrant g;
  if (bytes.size() != sizeof(g)) {
    MORI_THROW(InvalidArgumentError, "SHM map grant of ", bytes.size(), " bytes (expected ",
               sizeof(g), ")");
  }
  std::memcpy(&g, bytes.data(), sizeof(g));
  if (g.fd < 0 || g.pid <= 0 || g.region_size > g.block_size ||
      g.region_offset > g.block_size - g.region_size) {
    MORI_THROW(InvalidArgumentError, "SHM map grant: region [", g.region_offset, ", +",
               g.region_size, ") of a block of ", g.block_size, " bytes (pid ", g.pid, ", fd ",
               g.fd, ")");
  }
  CheckLivenessGrant(g.live);
  return g;
}

void CheckLivenessGrant(const LivenessGrant& g) {
  if (g.tid == 0) return;
  if (g.fd < 0 || g.tid < 0 || g.page_size < 4 || g.page_size > (1u << 20) ||
      g.word_offset % 4 != 0 || g.word_offset > g.page_size - 4) {
    MORI_THROW(InvalidArgumentError, "liveness grant: word at ", g.word_offset, " of a ",
               g.page_size, "-byte page (fd ", g.fd, ", tid ", g.tid, ")");
  }
}

ShmMapping::~ShmMapping() {
  if (base != nullptr) ::munmap(base, map_len);
  owner.reset();
  if (released) released();
}

std::shared_ptr<ShmMapping> MapPeerRegion(const ShmMapGrant& g, std::string* error) {
  int pidfd = PidfdOpen(g.pid, error);
  if (pidfd < 0) return nullptr;
  int fd = GetFdFrom(pidfd, g.pid, g.fd, error);
  if (fd < 0) {
    ::close(pidfd);
    return nullptr;
  }
  ::close(pidfd);
  void* p = ::mmap(nullptr, g.block_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    *error = StrCat("mmap of the peer's block (", g.block_size, " bytes): ", std::strerror(err));
    return nullptr;
  }
  auto m = std::make_shared<ShmMapping>();
  m->base = p;
  m->map_len = g.block_size;
  m->region = static_cast<char*>(p) + g.region_offset;
  m->size = g.region_size;
  return m;
}

}  // namespace mori::io
