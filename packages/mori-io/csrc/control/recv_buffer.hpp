// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstddef>

namespace mori::io {

// A connection's receive buffer. It starts as kSmallBytes inside the connection: room
// for headers and, in pieces, a hello; it is all a connection holds until its hello
// passed, so a peer that only connects costs no more. Traffic that fills it grows it
// to kLargeBytes, an anonymous mapping whose pages cost memory only once bytes land in
// them; the reactor gives the mapping back after the connection read nothing for a
// while (Reactor::CloseStuck), so an idle connection holds kSmallBytes again.
class RecvBuffer {
 public:
  static constexpr size_t kSmallBytes = 512;
  static constexpr size_t kLargeBytes = 256 << 10;

  RecvBuffer() {}  // the inline bytes are not cleared: nothing reads past what was received
  ~RecvBuffer();
  RecvBuffer(const RecvBuffer&) = delete;
  RecvBuffer& operator=(const RecvBuffer&) = delete;

  char* data() { return large_ != nullptr ? large_ : small_; }
  size_t size() const { return large_ != nullptr ? kLargeBytes : kSmallBytes; }
  bool large() const { return large_ != nullptr; }
  // Moves to the large buffer, the bytes [from, to) first in it; false (still small,
  // unchanged) when the mapping failed.
  bool Grow(size_t from, size_t to);
  // Back to the small buffer, the bytes [from, to) (at most kSmallBytes) first in it.
  void Shrink(size_t from, size_t to);

 private:
  char small_[kSmallBytes];
  char* large_ = nullptr;
};

}  // namespace mori::io
