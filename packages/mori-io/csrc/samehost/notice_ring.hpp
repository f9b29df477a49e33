// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Write announcements between two engines of one host without a message: the target
// allocates a ring in shared host memory per initiator engine and grants it like a
// shared-memory region; the initiator maps it and, after a P2P or mapped-SHM write's
// bytes are in place, appends (uid, memory, bytes) with release ordering. The target
// drains the ring when its application asks for inbound statuses. No syscall and no
// thread wake-up on either side (a TCP announcement costs each side a reactor pass).
//
// Bounded multi-producer (the initiator's submitting threads and its P2P completion
// thread), single-consumer (the target, under its inbound lock). Each slot carries a
// sequence number: free for position p when seq == p, holding position p's record
// when seq == p + 1. A full ring refuses the record; the caller announces over TCP.
// The consumer's position and the capacity it trusts live in its own memory, so a
// misbehaving initiator can stall or garble only its own announcements.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mori::io {

struct NoticeRecord {
  uint64_t uid = 0;
  uint64_t mem_id = 0;
  uint64_t bytes = 0;
};

class NoticeRing {
 public:
  static constexpr uint64_t kMagic = 0x31474e52'4f4e4d4dull;  // "MMNORNG1"
  // Bytes of a ring of `capacity` slots (a power of two, 2..2^20).
  static uint64_t BytesFor(uint32_t capacity);
  // Formats `size` bytes at `base` (zeroed memory) as an empty ring.
  static void Init(void* base, uint64_t size, uint32_t capacity);
  // A ring mapped from a peer: checks its header against the mapping's size.
  static bool Check(const void* base, uint64_t size, std::string* why);

  // Producer side, over a checked mapping.
  static bool Push(void* base, const NoticeRecord& r);

  // Consumer side: appends up to `max` records to `out` from position `*head`
  // (advanced). `capacity` is the consumer's own copy.
  static size_t Drain(void* base, uint32_t capacity, uint64_t* head, size_t max,
                      std::vector<NoticeRecord>* out);
};

}  // namespace mori::io
