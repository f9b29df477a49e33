// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "allocator.hpp"

#include <algorithm>
#include <iterator>

#include "mori/core/error.hpp"

namespace mori::shmem::internal {

Allocator::Allocator(size_t capacity) : capacity_(capacity) {
  if (capacity > 0) free_.emplace(0, capacity);
}

size_t Allocator::largest_free_block() const {
  size_t best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

size_t Allocator::Allocate(size_t nbytes, size_t align) {
  MORI_CHECK_ARG(nbytes > 0, "symmetric malloc of 0 bytes");
  MORI_CHECK_ARG(align > 0 && (align & (align - 1)) == 0, "alignment ", align,
                 " is not a power of two");
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const size_t off = it->first;
    const size_t size = it->second;
    const size_t aligned = (off + align - 1) & ~(align - 1);
    if (aligned < off || aligned - off > size || size - (aligned - off) < nbytes) continue;
    const size_t end = off + size;
    free_.erase(it);
    if (aligned > off) free_.emplace(off, aligned - off);
    if (aligned + nbytes < end) free_.emplace(aligned + nbytes, end - (aligned + nbytes));
    live_.emplace(aligned, nbytes);
    used_ += nbytes;
    return aligned;
  }
  MORI_THROW(OutOfMemoryError, "symmetric heap exhausted: requested ", nbytes, " bytes (align ",
             align, "), free ", free_bytes(), " bytes in ", free_.size(), " blocks (largest ",
             largest_free_block(), "), total ", capacity_, " bytes");
}

size_t Allocator::Free(size_t offset) {
  auto it = live_.find(offset);
  if (it == live_.end()) {
    auto after = live_.upper_bound(offset);
    if (after != live_.begin()) {
      auto owner = std::prev(after);
      if (offset < owner->first + owner->second) {
        MORI_THROW(InvalidArgumentError, "free of heap offset ", offset,
                   ", which is inside the allocation at offset ", owner->first, " (", owner->second,
                   " bytes), not its start");
      }
    }
    MORI_THROW(InvalidArgumentError, "free of heap offset ", offset,
               ", which is not a live allocation (already freed, or never returned by malloc)");
  }
  const size_t size = it->second;
  live_.erase(it);
  used_ -= size;
  size_t start = offset;
  size_t end = offset + size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  free_.emplace(start, end - start);
  return size;
}

}  // namespace mori::shmem::internal
