// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Host side of a proxy command queue: the queue's memory (CommandQueue), the
// consumer calls the proxy thread makes, and the push API of CPU producers. The
// format and the protocol are in mori/proxy/command.hpp; kernels push with
// mori/proxy/queue_device.cuh.

#include <chrono>
#include <cstdint>
#include <string>

#include "mori/core/macros.hpp"
#include "mori/proxy/command.hpp"

namespace mori::proxy {

enum class Producer : int {
  kHost = 0,  // CPU threads push (HostView); plain host memory
  kCuda = 1,  // kernels push (DeviceView); slots and control pinned and device-mapped,
              // head in device memory of `device`
};

struct QueueOptions {
  uint64_t capacity = 1024;  // slots; rounded up to a power of two, at least 2
  Producer producer = Producer::kHost;
  int device = -1;  // CUDA device of the producer (kCuda)
  // Bounds each producer wait (full queue, quiet, barrier).
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  int queue_id = 0;
  int my_pe = 0;
  int n_pes = 1;
};

// Owns one queue's memory. The producer side is lock-free and multi-producer; the
// consumer side (TryPop, Retire, Fail, MarkClosed) belongs to one thread.
class MORI_API CommandQueue {
 public:
  explicit CommandQueue(const QueueOptions& options);
  ~CommandQueue();
  CommandQueue(const CommandQueue&) = delete;
  CommandQueue& operator=(const CommandQueue&) = delete;

  // For CPU producers (Producer::kHost); throws InvalidStateError otherwise.
  QueueView HostView() const;
  // For kernels (Producer::kCuda): device pointers; throws InvalidStateError otherwise.
  QueueView DeviceView() const;
  uint64_t capacity() const { return capacity_; }
  int queue_id() const { return options_.queue_id; }

  // Consumer: copies the next command into *out and frees its slot (publishes the
  // tail) when its producer has published it; false otherwise.
  bool TryPop(Command* out);
  // Index of the next command TryPop returns.
  uint64_t popped() const { return popped_; }
  // Host-side wait (any producer kind) until commands with index < upto retired: for
  // a host thread waiting on a kernel's commands. Bounded; throws as the push API does.
  void WaitRetiredFromHost(uint64_t upto) const;
  // Consumer: commands with index < upto have completed (monotone).
  void Retire(uint64_t upto);
  uint64_t retired() const;
  // Consumer: the pe the command being posted goes to (-1: none).
  void SetPostingPe(int pe);
  // Consumer: stops the producers: their waits fail with `why` (set once; the first
  // reason stays).
  void Fail(const std::string& why);
  // Consumer: later pushes fail with "closed".
  void MarkClosed();

 private:
  QueueOptions options_;
  uint64_t capacity_ = 0;
  Command* slots_ = nullptr;
  QueueControl* control_ = nullptr;
  uint64_t* host_head_ = nullptr;    // kHost
  uint64_t* device_head_ = nullptr;  // kCuda
  Command* device_slots_ = nullptr;
  QueueControl* device_control_ = nullptr;
  uint64_t popped_ = 0;
};

// ---------------------------------------------------------------------------
// CPU producers. Thread-safe. Each call that waits is bounded by the view's
// timeout_ns: a queue full for that long throws TimeoutError naming the queue, its
// pe and the slots in flight; a failed proxy throws TransportError with its error
// (the peer pe and node that failed); a closed one InvalidStateError. Offsets are
// byte offsets in the symmetric heaps; the proxy checks them against the heap size
// and fails (naming the value) on a bad one.

// Claims the next index, waits for a free slot, writes `command` (its seq is
// ignored) and publishes it. Returns the command's index.
MORI_API uint64_t Push(const QueueView& q, const Command& command);
MORI_API uint64_t PushWrite(const QueueView& q, int pe, uint64_t dst_offset, uint64_t src_offset,
                            uint64_t nbytes);
MORI_API uint64_t PushAtomicAdd(const QueueView& q, int pe, uint64_t signal_offset, uint64_t value);
MORI_API uint64_t PushWriteAdd(const QueueView& q, int pe, uint64_t dst_offset, uint64_t src_offset,
                               uint64_t nbytes, uint64_t signal_offset, uint64_t value);
// Waits until commands with index < upto have retired.
MORI_API void WaitRetired(const QueueView& q, uint64_t upto);
// Push kQuiet and wait for it: every earlier command of the queue has completed.
MORI_API void Quiet(const QueueView& q);
// Push kBarrier and wait for it (collective over every pe's proxy).
MORI_API void Barrier(const QueueView& q);
// Throws the proxy's error if the queue's proxy failed or was closed.
MORI_API void CheckHealth(const QueueView& q);

}  // namespace mori::proxy
