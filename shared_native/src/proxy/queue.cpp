// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/proxy/queue.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backoff.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/core/version.hpp"

#if MORI_CORE_WITH_CUDA
#include "mori/core/cuda_runtime.hpp"
#endif

namespace mori::proxy {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t RoundCapacity(uint64_t requested) {
  if (requested > (uint64_t{1} << 30)) {
    MORI_THROW(InvalidArgumentError, "proxy queue capacity ", requested,
               " exceeds 2^30 slots (64 GiB)");
  }
  uint64_t c = 2;
  while (c < requested) c <<= 1;
  return c;
}

uint64_t LoadAcquire(const volatile uint64_t* p) {
  return __atomic_load_n(const_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
}

uint32_t LoadHealth(const QueueControl* c) {
  return __atomic_load_n(const_cast<const uint32_t*>(&c->health), __ATOMIC_ACQUIRE);
}

[[noreturn]] void ThrowUnhealthy(const QueueView& q, uint32_t health) {
  if (health == kClosed) {
    MORI_THROW(InvalidStateError, "proxy queue ", q.queue_id, " of pe ", q.my_pe,
               " is closed (the proxy was closed)");
  }
  MORI_THROW(TransportError, "proxy queue ", q.queue_id, " of pe ", q.my_pe,
             ": the proxy failed: ", const_cast<const char*>(q.control->error));
}

// Waits until *counter >= floor, bounded by the view's timeout; `what` and `index`
// name the wait in the error.
void WaitCounter(const QueueView& q, const volatile uint64_t* counter, uint64_t floor,
                 const char* what, uint64_t index) {
  uint64_t seen = LoadAcquire(counter);
  if (seen >= floor) return;
  const auto start = Clock::now();
  const auto limit = std::chrono::nanoseconds(q.timeout_ns);
  internal::Backoff backoff;
  for (;;) {
    seen = LoadAcquire(counter);
    if (seen >= floor) return;
    const uint32_t health = LoadHealth(q.control);
    if (health != kHealthy) ThrowUnhealthy(q, health);
    if (!backoff.Pause()) {
      if (Clock::now() - start > limit) {
        const int posting = q.control->posting_pe;
        MORI_THROW(TimeoutError, "proxy queue ", q.queue_id, " of pe ", q.my_pe, ": ", what,
                   " timed out after ", q.timeout_ns / 1000000, " ms (command ", index,
                   ", counter at ", seen, ", waiting for ", floor, "; capacity ", q.capacity,
                   " slots)",
                   posting >= 0 ? StrCat("; the proxy is posting a command to pe ", posting)
                                : std::string());
      }
    }
  }
}

void* AllocHost(size_t bytes, Producer producer) {
  void* p = nullptr;
  if (producer == Producer::kCuda) {
#if MORI_CORE_WITH_CUDA
    MORI_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
#else
    MORI_THROW(NotSupportedError,
               "a proxy queue for kernel producers needs libmori_core built with CUDA");
#endif
  } else {
    p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr)
      MORI_THROW(OutOfMemoryError, "proxy queue: cannot allocate ", bytes, " bytes");
  }
  std::memset(p, 0, bytes);
  return p;
}

void FreeHost(void* p, Producer producer) {
  if (p == nullptr) return;
#if MORI_CORE_WITH_CUDA
  if (producer == Producer::kCuda) {
    (void)cudaFreeHost(p);
    return;
  }
#endif
  std::free(p);
}

}  // namespace

CommandQueue::CommandQueue(const QueueOptions& options) : options_(options) {
  capacity_ = RoundCapacity(options.capacity);
  options_.timeout = CheckedTimeout(options.timeout, "proxy queue timeout");
  slots_ = static_cast<Command*>(AllocHost(capacity_ * sizeof(Command), options.producer));
  try {
    control_ = static_cast<QueueControl*>(AllocHost(sizeof(QueueControl), options.producer));
    control_->posting_pe = -1;
    if (options.producer == Producer::kHost) {
      host_head_ = static_cast<uint64_t*>(AllocHost(64, Producer::kHost));
    } else {
#if MORI_CORE_WITH_CUDA
      cuda::ScopedDevice guard(options.device);
      MORI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_head_), sizeof(uint64_t)));
      MORI_CUDA_CHECK(cudaMemset(device_head_, 0, sizeof(uint64_t)));
      void* d = nullptr;
      MORI_CUDA_CHECK(cudaHostGetDevicePointer(&d, slots_, 0));
      device_slots_ = static_cast<Command*>(d);
      MORI_CUDA_CHECK(cudaHostGetDevicePointer(&d, control_, 0));
      device_control_ = static_cast<QueueControl*>(d);
#endif
    }
  } catch (...) {
    FreeHost(control_, options.producer);
    FreeHost(slots_, options.producer);
    throw;
  }
}

CommandQueue::~CommandQueue() {
#if MORI_CORE_WITH_CUDA
  if (device_head_ != nullptr) (void)cudaFree(device_head_);
#endif
  FreeHost(host_head_, Producer::kHost);
  FreeHost(control_, options_.producer);
  FreeHost(slots_, options_.producer);
}

static QueueView MakeView(const QueueOptions& o, uint64_t capacity, Command* slots, uint64_t* head,
                          QueueControl* control) {
  QueueView v{};
  v.slots = slots;
  v.head = head;
  v.control = control;
  v.capacity = capacity;
  v.timeout_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(o.timeout).count());
  v.queue_id = o.queue_id;
  v.my_pe = o.my_pe;
  v.n_pes = o.n_pes;
  return v;
}

QueueView CommandQueue::HostView() const {
  if (options_.producer != Producer::kHost) {
    MORI_THROW(InvalidStateError, "proxy queue ", options_.queue_id,
               " was made for kernel producers: use DeviceView (DeviceQueue)");
  }
  return MakeView(options_, capacity_, slots_, host_head_, control_);
}

QueueView CommandQueue::DeviceView() const {
  if (options_.producer != Producer::kCuda) {
    MORI_THROW(InvalidStateError, "proxy queue ", options_.queue_id,
               " was made for CPU producers: use HostView (HostQueue)");
  }
  return MakeView(options_, capacity_, device_slots_, device_head_, device_control_);
}

void CommandQueue::WaitRetiredFromHost(uint64_t upto) const {
  // Host pointers only: the wait reads the control block, never the head.
  WaitRetired(MakeView(options_, capacity_, slots_, nullptr, control_), upto);
}

bool CommandQueue::TryPop(Command* out) {
  Command* slot = slots_ + (popped_ & (capacity_ - 1));
  const uint64_t seq = __atomic_load_n(&slot->seq, __ATOMIC_ACQUIRE);
  if (seq != popped_ + 1) return false;
  std::memcpy(out, slot, sizeof(Command));
  ++popped_;
  // The copy is complete before the producers may reuse the slot.
  __atomic_store_n(const_cast<uint64_t*>(&control_->tail), popped_, __ATOMIC_RELEASE);
  return true;
}

void CommandQueue::SetPostingPe(int pe) {
  __atomic_store_n(const_cast<int32_t*>(&control_->posting_pe), pe, __ATOMIC_RELAXED);
}

void CommandQueue::Retire(uint64_t upto) {
  __atomic_store_n(const_cast<uint64_t*>(&control_->retired), upto, __ATOMIC_RELEASE);
}

uint64_t CommandQueue::retired() const { return LoadAcquire(&control_->retired); }

void CommandQueue::Fail(const std::string& why) {
  if (__atomic_load_n(const_cast<uint32_t*>(&control_->health), __ATOMIC_ACQUIRE) != kHealthy) {
    return;
  }
  const size_t n = std::min(why.size(), static_cast<size_t>(kErrorTextBytes - 1));
  std::memcpy(control_->error, why.data(), n);
  control_->error[n] = '\0';
  __atomic_store_n(const_cast<uint32_t*>(&control_->health), kFailed, __ATOMIC_RELEASE);
}

void CommandQueue::MarkClosed() {
  if (__atomic_load_n(const_cast<uint32_t*>(&control_->health), __ATOMIC_ACQUIRE) != kHealthy) {
    return;
  }
  __atomic_store_n(const_cast<uint32_t*>(&control_->health), kClosed, __ATOMIC_RELEASE);
}

// ---------------------------------------------------------------------------
// CPU producers.

uint64_t Push(const QueueView& q, const Command& command) {
  const uint32_t health = LoadHealth(q.control);
  if (health != kHealthy) ThrowUnhealthy(q, health);
  const uint64_t index = __atomic_fetch_add(q.head, uint64_t{1}, __ATOMIC_RELAXED);
  if (index >= q.capacity) {
    WaitCounter(q, &q.control->tail, index - q.capacity + 1, "push into a full queue", index);
  }
  Command* slot = q.slots + (index & (q.capacity - 1));
  std::memcpy(reinterpret_cast<char*>(slot) + sizeof(uint64_t),
              reinterpret_cast<const char*>(&command) + sizeof(uint64_t),
              sizeof(Command) - sizeof(uint64_t));
  __atomic_store_n(&slot->seq, index + 1, __ATOMIC_RELEASE);
  return index;
}

uint64_t PushWrite(const QueueView& q, int pe, uint64_t dst_offset, uint64_t src_offset,
                   uint64_t nbytes) {
  return Push(q, MakeCommand(Op::kWrite, pe, dst_offset, src_offset, nbytes));
}

uint64_t PushAtomicAdd(const QueueView& q, int pe, uint64_t signal_offset, uint64_t value) {
  return Push(q, MakeCommand(Op::kAtomicAdd, pe, 0, 0, 0, signal_offset, value));
}

uint64_t PushWriteAdd(const QueueView& q, int pe, uint64_t dst_offset, uint64_t src_offset,
                      uint64_t nbytes, uint64_t signal_offset, uint64_t value) {
  return Push(q,
              MakeCommand(Op::kWriteAdd, pe, dst_offset, src_offset, nbytes, signal_offset, value));
}

void WaitRetired(const QueueView& q, uint64_t upto) {
  WaitCounter(q, &q.control->retired, upto, "wait for retirement", upto == 0 ? 0 : upto - 1);
}

void Quiet(const QueueView& q) {
  const uint64_t index = Push(q, MakeCommand(Op::kQuiet));
  WaitCounter(q, &q.control->retired, index + 1, "quiet", index);
}

void Barrier(const QueueView& q) {
  const uint64_t index = Push(q, MakeCommand(Op::kBarrier));
  WaitCounter(q, &q.control->retired, index + 1, "barrier", index);
}

void CheckHealth(const QueueView& q) {
  const uint32_t health = LoadHealth(q.control);
  if (health != kHealthy) ThrowUnhealthy(q, health);
}

}  // namespace mori::proxy
