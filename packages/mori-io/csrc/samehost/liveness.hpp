// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Whether a same-host target engine is still alive, answered by the initiator with one
// load and no syscall.
//
// The target keeps one page of shared host memory (a memfd) holding a robust,
// process-shared pthread mutex, which its reactor 0 locks when it starts and unlocks
// just before it exits. The mutex's futex word then holds that thread's tid. When the
// thread exits any other way — the process is killed (even with SIGKILL), calls exit,
// or the thread dies — the kernel walks the thread's robust list on its way out
// (do_exit -> exit_mm -> futex_exit_release) and sets the word to FUTEX_OWNER_DIED with
// no tid. An initiator that mapped the page (read-only) reads the word: alive while it
// equals the tid the target granted, gone once it does not.
//
// Ordering against the pidfd the initiator used to poll: the robust list of the holding
// thread is walked before that thread passes exit_notify, and a pidfd becomes readable
// only once every thread of the process did, so the word changes no later than the
// pidfd would have reported the exit. Nobody but the holder ever locks the mutex (the
// initiator only reads), so the word cannot return to the tid once it left it.

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "samehost/shared_host.hpp"

namespace mori::io {

// Target side: the page and the mutex a reactor thread holds.
class LivenessPage {
 public:
  LivenessPage();  // allocates and initialises; throws InternalError
  ~LivenessPage();
  LivenessPage(const LivenessPage&) = delete;
  LivenessPage& operator=(const LivenessPage&) = delete;
  // On the holding thread, once: locks the mutex. If its word does not then hold this
  // thread's tid (a C library whose mutex layout we do not know), the page offers no
  // word (tid 0 in the grant) and initiators poll the pidfd.
  void Hold();
  // On the holding thread before it exits (the kernel would otherwise mark the word
  // only after the page may have been unmapped): the word becomes 0, "gone".
  void Release();
  // What grants carry: the tid once Hold ran (0 before and after Release).
  LivenessGrant Grant() const;

 private:
  SharedHostBlock block_;
  pthread_mutex_t* mu_ = nullptr;
  uint32_t word_offset_ = 0;
  std::atomic<int32_t> tid_{0};
  bool held_ = false;
};

// Initiator side: a target's liveness page mapped here (or, where it offers none, its
// pidfd). Shared by every grant of that target engine.
class TargetLiveness {
 public:
  // Maps the page of process `pid` (pidfd_getfd, as for shared host memory) and keeps a
  // pidfd of it. `use_word` false (MORI_IO_SHM_LIVENESS_WORD=0, or a grant without a
  // word): Alive() polls the pidfd, one syscall per call. nullptr with *error.
  static std::shared_ptr<TargetLiveness> Open(int pid, const LivenessGrant& g, bool use_word,
                                              std::string* error);
  ~TargetLiveness();
  TargetLiveness(const TargetLiveness&) = delete;
  TargetLiveness& operator=(const TargetLiveness&) = delete;

  // True while the target's holder thread lives. Every memory access this thread made
  // before the call (the copy into or out of the target) is ordered before the load
  // that decides, so "true" means the target was alive after those bytes were in place
  // (written) or taken (read).
  bool Alive() const noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (word_ != nullptr) return __atomic_load_n(word_, __ATOMIC_ACQUIRE) == expected_;
    return !PidfdExited(pidfd_);
  }
  int pid() const { return pid_; }
  bool uses_word() const { return word_ != nullptr; }

 private:
  TargetLiveness() = default;
  const uint32_t* word_ = nullptr;
  uint32_t expected_ = 0;
  void* page_ = nullptr;
  uint64_t page_len_ = 0;
  int pidfd_ = -1;
  int pid_ = 0;
};

}  // namespace mori::io
