// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "heap_backend.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"

namespace mori::shmem::internal {
namespace {

// One memfd per node holds every local pe's heap back to back: the lowest local
// pe creates it and passes the descriptor to the others (SCM_RIGHTS), and each
// process maps the whole region once. Pages are allocated on first touch.
class HostBackend final : public HeapBackend {
 public:
  HostBackend(bootstrap::Bootstrap& b, const LocalGroup& g, const BackendOptions& o)
      : heap_size_(o.heap_size), peer_bases_(b.WorldSize(), nullptr) {
    const size_t local_n = g.local_pes.size();
    // Every local pe computes the same verdict here, before any collective step,
    // so an oversized heap fails on all of them instead of desynchronising them.
    if (__builtin_mul_overflow(heap_size_, local_n, &region_size_) ||
        region_size_ > static_cast<size_t>(std::numeric_limits<off_t>::max())) {
      MORI_THROW(InvalidArgumentError, "heap size ", heap_size_, " bytes x ", local_n,
                 " pes on this node overflows the node's shared heap (at most ",
                 std::numeric_limits<off_t>::max(), " bytes in all)");
    }
    int my_fd = -1;
    if (g.my_local_index == 0) {
      my_fd = ::memfd_create("mori-shmem-heap", MFD_CLOEXEC);
      if (my_fd < 0) {
        MORI_THROW(NotSupportedError, "memfd_create failed: ", std::strerror(errno),
                   "; the host symmetric heap needs memfd (Linux >= 3.17)");
      }
      if (::ftruncate(my_fd, static_cast<off_t>(region_size_)) != 0) {
        int err = errno;
        ::close(my_fd);
        MORI_THROW(OutOfMemoryError, "cannot size the node's shared heap to ", region_size_,
                   " bytes (", local_n, " pes x ", heap_size_, "): ", std::strerror(err));
      }
    }
    std::vector<int> fds;
    try {
      fds = ExchangeFds(b, g, my_fd, o.timeout);
    } catch (...) {
      if (my_fd >= 0) ::close(my_fd);
      throw;
    }
    if (my_fd >= 0) ::close(my_fd);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i] >= 0) ::close(fds[i]);
    }
    if (fds[0] < 0) MORI_THROW(InternalError, "shmem: no heap descriptor from the node leader");
    void* p = ::mmap(nullptr, region_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    int err = errno;
    ::close(fds[0]);
    if (p == MAP_FAILED) {
      MORI_THROW(OutOfMemoryError, "mmap of the node's shared heap (", region_size_,
                 " bytes) failed: ", std::strerror(err));
    }
    region_ = static_cast<char*>(p);
    for (int pe = 0; pe < b.WorldSize(); ++pe) {
      const int idx = g.local_index_of[pe];
      if (idx >= 0) peer_bases_[pe] = region_ + static_cast<size_t>(idx) * heap_size_;
    }
    MORI_LOG_INFO(kShmem, "pe ", b.Rank(), ": host heap of ", heap_size_, " bytes per pe, ",
                  local_n, " pes on this node share one memfd mapping");
  }

  ~HostBackend() override { Release(); }

  MemoryKind kind() const override { return MemoryKind::kHost; }
  char* base(int pe) const override { return peer_bases_[pe]; }
  size_t size() const override { return heap_size_; }

  void Copy(void* dst, const void* src, size_t nbytes) override { std::memmove(dst, src, nbytes); }

  void SignalWord(uint64_t* addr, uint64_t value, SignalOp op) override {
    if (op == SignalOp::kSet) {
      __atomic_store_n(addr, value, __ATOMIC_RELEASE);
    } else {
      __atomic_fetch_add(addr, value, __ATOMIC_RELEASE);
    }
  }

  uint64_t LoadWord(const uint64_t* addr) override {
    return __atomic_load_n(addr, __ATOMIC_ACQUIRE);
  }

  char* const* peer_bases_for_kernels() const override { return peer_bases_.data(); }

  void Release() override {
    if (region_ != nullptr) {
      ::munmap(region_, region_size_);
      region_ = nullptr;
    }
  }

 private:
  size_t heap_size_;
  size_t region_size_ = 0;
  char* region_ = nullptr;
  std::vector<char*> peer_bases_;
};

}  // namespace

std::unique_ptr<HeapBackend> CreateHostBackend(bootstrap::Bootstrap& b, const LocalGroup& g,
                                               const BackendOptions& o) {
  return std::make_unique<HostBackend>(b, g, o);
}

}  // namespace mori::shmem::internal
