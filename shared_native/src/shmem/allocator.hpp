// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstddef>
#include <map>
#include <string>

namespace mori::shmem::internal {

// Offset allocator over [0, capacity): first fit in address order, blocks split
// on allocation and coalesced with both neighbours on free. Deterministic: the
// same sequence of calls yields the same offsets on every pe, which is what
// makes the heap symmetric. Not thread-safe (the caller holds the heap lock).
class Allocator {
 public:
  explicit Allocator(size_t capacity);

  // Offset of a block of `nbytes` aligned to `align` (a power of two). Throws
  // OutOfMemoryError naming the request, free bytes, largest free block and
  // capacity; InvalidArgumentError for nbytes == 0 or a bad alignment.
  size_t Allocate(size_t nbytes, size_t align);
  // Returns the size of the freed block. Throws InvalidArgumentError when
  // `offset` is not the start of a live block (double free, interior pointer,
  // never allocated), naming the offset and what it is instead.
  size_t Free(size_t offset);

  bool IsLive(size_t offset) const { return live_.count(offset) != 0; }
  size_t capacity() const { return capacity_; }
  size_t used_bytes() const { return used_; }
  size_t free_bytes() const { return capacity_ - used_; }
  size_t largest_free_block() const;
  size_t live_count() const { return live_.size(); }
  size_t free_block_count() const { return free_.size(); }

 private:
  size_t capacity_;
  size_t used_ = 0;
  std::map<size_t, size_t> free_;  // offset -> size, non-adjacent (always coalesced)
  std::map<size_t, size_t> live_;  // offset -> size
};

}  // namespace mori::shmem::internal
