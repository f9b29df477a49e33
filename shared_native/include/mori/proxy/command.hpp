// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The proxy's command format and the view of one command queue that producers use
// (host producers: mori/proxy/queue.hpp; kernels: mori/proxy/queue_device.cuh). Plain
// data, the same bytes on host and device. The design is in docs/design.md ("Proxy").
//
// A queue is a ring of `capacity` 64-byte slots in host memory. Producers claim
// indices by incrementing `head` (their side: host memory for CPU producers, device
// memory for kernels), fill the slot and publish it by writing the slot's `seq`
// (index + 1) last, with release ordering. The proxy thread pops slots in index order
// (it waits for seq == index + 1), publishes `control->tail` (slots below it may be
// reused) and, once a command's effect is complete, `control->retired`. A producer
// whose claimed index is `capacity` or more ahead of the tail waits (bounded): a full
// queue back-pressures, nothing is dropped or overwritten.
//
// Ordering: the proxy applies the commands of one queue in index order, per
// destination pe. An atomic add (kAtomicAdd, or the add of kWriteAdd) becomes visible
// at pe only after every write to pe with a lower index on the same queue has landed in
// pe's heap. Commands of different queues, or to different pes, are not ordered with
// each other (use kQuiet or kBarrier).

#include <cstdint>

#if defined(__CUDACC__)
#define MORI_PROXY_HD __host__ __device__
#else
#define MORI_PROXY_HD
#endif

namespace mori::proxy {

enum class Op : uint32_t {
  kNone = 0,
  // Copies nbytes from the producer's own heap at src_offset to pe's heap at dst_offset.
  kWrite = 1,
  // Atomically adds value to the uint64 at signal_offset in pe's heap (8-byte aligned),
  // after every earlier write of this queue to pe has landed.
  kAtomicAdd = 2,
  // kWrite then kAtomicAdd to the same pe, as one command (a put with signal).
  kWriteAdd = 3,
  // Retires once every earlier command of this queue has completed at its target:
  // writes landed, adds applied, in the receivers' heaps.
  kQuiet = 4,
  // Collective over every pe's proxy: retires once every pe's proxy has reached a
  // barrier; by then every command pushed before its barrier on that pe's queue, to
  // this pe, has landed here. Every pe pushes the same number of barriers (any queue).
  kBarrier = 5,
};

MORI_PROXY_HD inline const char* OpName(uint32_t op) {
  switch (op) {
    case 1:
      return "write";
    case 2:
      return "atomic_add";
    case 3:
      return "write_add";
    case 4:
      return "quiet";
    case 5:
      return "barrier";
    default:
      return "unknown";
  }
}

// One queue slot. Fields a command does not use are ignored (write them as 0).
struct alignas(64) Command {
  uint64_t seq;            // index + 1, written last with release: the slot is ready
  uint32_t op;             // Op
  int32_t pe;              // destination pe (kWrite, kAtomicAdd, kWriteAdd)
  uint64_t dst_offset;     // kWrite, kWriteAdd: destination offset in pe's heap
  uint64_t src_offset;     // kWrite, kWriteAdd: source offset in the producer's heap
  uint64_t nbytes;         // kWrite, kWriteAdd: bytes to copy (0 allowed)
  uint64_t signal_offset;  // kAtomicAdd, kWriteAdd: the uint64 in pe's heap
  uint64_t value;          // kAtomicAdd, kWriteAdd: the addend
  uint64_t reserved;
};
static_assert(sizeof(Command) == 64, "a command is one 64-byte slot");

// A command with its fields (seq is the queue's to write).
MORI_PROXY_HD inline Command MakeCommand(Op op, int pe = 0, uint64_t dst_offset = 0,
                                         uint64_t src_offset = 0, uint64_t nbytes = 0,
                                         uint64_t signal_offset = 0, uint64_t value = 0) {
  Command c{};
  c.op = static_cast<uint32_t>(op);
  c.pe = pe;
  c.dst_offset = dst_offset;
  c.src_offset = src_offset;
  c.nbytes = nbytes;
  c.signal_offset = signal_offset;
  c.value = value;
  return c;
}

// health values
constexpr uint32_t kHealthy = 0;
constexpr uint32_t kFailed = 1;  // the proxy stopped; control->error says why
constexpr uint32_t kClosed = 2;  // the proxy was closed; pushing is an error
constexpr int kErrorTextBytes = 512;

// Written by the proxy thread only; host memory (pinned and device-mapped when the
// producer is a kernel). Each counter on its own cache line.
struct alignas(64) QueueControl {
  volatile uint64_t tail;  // slots with index < tail have been popped and may be reused
  char pad0[56];
  volatile uint64_t retired;  // commands with index < retired have completed
  char pad1[56];
  volatile uint32_t health;  // kHealthy, kFailed or kClosed (shared by the proxy's queues)
  // The pe the proxy is posting this queue's command to right now, -1 between
  // commands: a producer's timeout names the peer the proxy is stuck on.
  volatile int32_t posting_pe;
  char pad2[56];
  // NUL-terminated, set before health becomes kFailed: names the peer pe, its node
  // and what failed.
  char error[kErrorTextBytes];
};

// What a producer needs to push into one queue. Trivially copyable: pass it to
// kernels by value. Get it from Proxy::HostQueue (CPU producers) or
// Proxy::DeviceQueue (kernels); the pointers are valid where the view is used.
struct QueueView {
  Command* slots;         // capacity slots
  uint64_t* head;         // producers' claim counter
  QueueControl* control;  // the proxy's side
  uint64_t capacity;      // a power of two
  uint64_t timeout_ns;    // bound of each producer wait (full queue, quiet, barrier)
  int32_t queue_id;       // index of the queue within its proxy
  int32_t my_pe;          // the producer's pe
  int32_t n_pes;
  int32_t reserved;
};

}  // namespace mori::proxy
