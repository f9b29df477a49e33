// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "control/recv_buffer.hpp"

#include <sys/mman.h>

#include <cstring>

namespace mori::io {

RecvBuffer::~RecvBuffer() {
  if (large_ != nullptr) ::munmap(large_, kLargeBytes);
}

bool RecvBuffer::Grow(size_t from, size_t to) {
  if (large_ != nullptr) return true;
  // mmap rather than malloc: munmap gives the pages back to the kernel when the
  // connection idles (a freed malloc block of this size stays in the process's heap).
  void* p =
      ::mmap(nullptr, kLargeBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  large_ = static_cast<char*>(p);
  std::memcpy(large_, small_ + from, to - from);
  return true;
}

void RecvBuffer::Shrink(size_t from, size_t to) {
  if (large_ == nullptr) {
    std::memmove(small_, small_ + from, to - from);
    return;
  }
  std::memcpy(small_, large_ + from, to - from);
  ::munmap(large_, kLargeBytes);
  large_ = nullptr;
}

}  // namespace mori::io
