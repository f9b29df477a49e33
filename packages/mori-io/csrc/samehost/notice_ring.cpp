// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "samehost/notice_ring.hpp"

#include <cstring>
#include <new>

#include "mori/core/error.hpp"
#include "mori/core/str.hpp"

namespace mori::io {
namespace {

struct alignas(64) Header {
  uint64_t magic;
  uint32_t capacity;
  uint32_t slot_bytes;
  alignas(64) std::atomic<uint64_t> tail;  // next position a producer claims
};

struct Slot {
  std::atomic<uint64_t> seq;
  uint64_t uid;
  uint64_t mem_id;
  uint64_t bytes;
};
static_assert(sizeof(Slot) == 32, "slot layout");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "atomics shared between processes");

Header* Head(void* base) { return static_cast<Header*>(base); }
Slot* Slots(void* base) {
  return reinterpret_cast<Slot*>(static_cast<char*>(base) + sizeof(Header));
}

bool PowerOfTwo(uint64_t v) { return v >= 2 && v <= (1u << 20) && (v & (v - 1)) == 0; }

}  // namespace

uint64_t NoticeRing::BytesFor(uint32_t capacity) {
  MORI_CHECK_ARG(PowerOfTwo(capacity), "notice ring capacity ", capacity,
                 " must be a power of two in [2, 2^20]");
  return sizeof(Header) + uint64_t{capacity} * sizeof(Slot);
}

void NoticeRing::Init(void* base, uint64_t size, uint32_t capacity) {
  MORI_CHECK_ARG(size >= BytesFor(capacity), "notice ring of ", capacity, " slots needs ",
                 BytesFor(capacity), " bytes, got ", size);
  Header* h = new (base) Header;
  h->magic = kMagic;
  h->capacity = capacity;
  h->slot_bytes = sizeof(Slot);
  h->tail.store(0, std::memory_order_relaxed);
  Slot* s = Slots(base);
  for (uint32_t i = 0; i < capacity; ++i) {
    Slot* slot = new (&s[i]) Slot;
    slot->seq.store(i, std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);
}

bool NoticeRing::Check(const void* base, uint64_t size, std::string* why) {
  if (size < sizeof(Header)) {
    *why = StrCat("notice ring mapping of ", size, " bytes");
    return false;
  }
  const Header* h = static_cast<const Header*>(base);
  if (h->magic != kMagic || h->slot_bytes != sizeof(Slot) || !PowerOfTwo(h->capacity) ||
      size < BytesFor(h->capacity)) {
    *why = StrCat("not a notice ring (magic ", h->magic, ", capacity ", h->capacity,
                  ", slot bytes ", h->slot_bytes, ", mapping of ", size, " bytes)");
    return false;
  }
  return true;
}

bool NoticeRing::Push(void* base, const NoticeRecord& r) {
  Header* h = Head(base);
  const uint64_t mask = h->capacity - 1;
  Slot* slots = Slots(base);
  uint64_t pos = h->tail.load(std::memory_order_relaxed);
  for (;;) {
    Slot& s = slots[pos & mask];
    const uint64_t seq = s.seq.load(std::memory_order_acquire);
    const auto dif = static_cast<int64_t>(seq - pos);
    if (dif == 0) {
      if (h->tail.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
        s.uid = r.uid;
        s.mem_id = r.mem_id;
        s.bytes = r.bytes;
        s.seq.store(pos + 1, std::memory_order_release);  // after the bytes it announces
        return true;
      }
    } else if (dif < 0) {
      return false;  // full: the consumer has not taken position pos - capacity yet
    } else {
      pos = h->tail.load(std::memory_order_relaxed);
    }
  }
}

size_t NoticeRing::Drain(void* base, uint32_t capacity, uint64_t* head, size_t max,
                         std::vector<NoticeRecord>* out) {
  const uint64_t mask = capacity - 1;
  Slot* slots = Slots(base);
  size_t n = 0;
  while (n < max) {
    Slot& s = slots[*head & mask];
    if (s.seq.load(std::memory_order_acquire) != *head + 1) break;
    out->push_back({s.uid, s.mem_id, s.bytes});
    s.seq.store(*head + capacity, std::memory_order_release);  // free for the next lap
    ++*head;
    ++n;
  }
  return n;
}

}  // namespace mori::io
