// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "samehost/liveness.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "mori/core/error.hpp"
#include "mori/core/str.hpp"

namespace mori::io {

namespace {
constexpr uint64_t kPageBytes = 4096;

uint32_t FutexWordOffset() {
#if defined(__GLIBC__)
  // glibc's robust mutexes keep their futex word (the owner's tid) in __data.__lock;
  // Hold() checks it at run time before offering it.
  return static_cast<uint32_t>(offsetof(pthread_mutex_t, __data.__lock));
#else
  return 0;
#endif
}

int32_t ThisTid() { return static_cast<int32_t>(::syscall(SYS_gettid)); }
}  // namespace

LivenessPage::LivenessPage() {
  block_ = AllocateSharedHost(kPageBytes);
  mu_ = reinterpret_cast<pthread_mutex_t*>(block_.addr);
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  int rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = pthread_mutex_init(mu_, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) {
    FreeSharedHost(block_.addr);
    MORI_THROW(InternalError, "liveness page: robust process-shared mutex: ", std::strerror(rc));
  }
  word_offset_ = FutexWordOffset();
}

LivenessPage::~LivenessPage() {
  // The holder released it (its thread is joined before the engine frees the page).
  FreeSharedHost(block_.addr);  // peers that mapped it keep their pages (reading 0)
}

void LivenessPage::Hold() {
  if (held_) return;
  if (pthread_mutex_lock(mu_) != 0) return;
  held_ = true;
  const int32_t tid = ThisTid();
  uint32_t word = 0;
  std::memcpy(&word, reinterpret_cast<const char*>(mu_) + word_offset_, sizeof(word));
  // Exactly the tid (no FUTEX_WAITERS: nobody else ever locks it), as initiators compare.
  if (word == static_cast<uint32_t>(tid)) tid_.store(tid, std::memory_order_release);
}

void LivenessPage::Release() {
  if (!held_) return;
  tid_.store(0, std::memory_order_release);
  pthread_mutex_unlock(mu_);
  held_ = false;
}

LivenessGrant LivenessPage::Grant() const {
  LivenessGrant g;
  g.tid = tid_.load(std::memory_order_acquire);
  if (g.tid == 0) return g;
  g.fd = block_.fd;
  g.word_offset = word_offset_;
  g.page_size = static_cast<uint32_t>(block_.size);
  return g;
}

std::shared_ptr<TargetLiveness> TargetLiveness::Open(int pid, const LivenessGrant& g, bool use_word,
                                                     std::string* error) {
  std::shared_ptr<TargetLiveness> t(new TargetLiveness());
  t->pid_ = pid;
  t->pidfd_ = PidfdOpen(pid, error);
  if (t->pidfd_ < 0) return nullptr;
  if (!use_word || g.tid == 0) return t;
  int fd = PidfdGetFd(pid, g.fd, error);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, g.page_size, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    *error = StrCat("mmap of the target's liveness page: ", std::strerror(err));
    return nullptr;
  }
  t->page_ = p;
  t->page_len_ = g.page_size;
  t->word_ = reinterpret_cast<const uint32_t*>(static_cast<const char*>(p) + g.word_offset);
  t->expected_ = static_cast<uint32_t>(g.tid);
  return t;
}

TargetLiveness::~TargetLiveness() {
  if (page_ != nullptr) ::munmap(page_, page_len_);
  if (pidfd_ >= 0) ::close(pidfd_);
}

}  // namespace mori::io
