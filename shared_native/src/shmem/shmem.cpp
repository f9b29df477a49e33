// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/shmem/shmem.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <vector>

#include "allocator.hpp"
#include "heap_backend.hpp"
#include "local_group.hpp"
#include "mori/core/env.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/host_ops.hpp"

namespace mori::shmem {
namespace internal {

void HeapBackend::BarrierOnStream(const DeviceContext&, uintptr_t) {
  MORI_THROW(NotSupportedError,
             "barrier_on_stream needs a CUDA heap; this heap is in host memory (use barrier_all)");
}

}  // namespace internal

namespace {

using internal::Allocator;
using internal::HeapBackend;
using internal::LocalGroup;

constexpr size_t kDefaultHeapSize = size_t{1} << 30;
constexpr size_t kHeapGranularity = size_t{2} << 20;
constexpr size_t kMaxHeapSize = size_t{1} << 62;

// Process-wide heap state. The mutex serializes the API; the barrier and wait
// loops do not hold it while they spin on memory.
struct State {
  std::mutex mu;
  bool initialized = false;
  uint64_t generation = 0;
  std::shared_ptr<bootstrap::Bootstrap> boot;
  std::unique_ptr<HeapBackend> backend;
  std::unique_ptr<Allocator> alloc;
  LocalGroup group;
  InitOptions options;
  int my_pe = 0;
  int n_pes = 1;
  bool all_reachable = true;
  size_t internal_allocations = 0;
  // Internal symmetric blocks: host barrier counters, device barrier counters,
  // and the device barrier's epoch word.
  uint64_t* host_arrive = nullptr;
  uint64_t host_epoch = 0;
  DeviceContext ctx{};
  std::vector<std::function<void()>> at_finalize;
};

// Never destroyed: at process exit the OS reclaims the mappings, and running the
// backend's and bootstrap's destructors after the Python interpreter is gone (a
// TorchBootstrap needs the GIL) would crash.
State& S() {
  static State* state = new State;
  return *state;
}

State& Checked() {
  State& s = S();
  if (!s.initialized) {
    MORI_THROW(InvalidStateError, "mori shmem is not initialized: call init() first");
  }
  return s;
}

struct MallocRecord {
  uint64_t nbytes;
  uint64_t align;
  uint64_t offset;  // UINT64_MAX when this pe could not allocate
};

void* AllocateCollective(State& s, size_t nbytes, size_t align, bool internal) {
  uint64_t offset = UINT64_MAX;
  std::string local_error;
  ErrorCode local_code = ErrorCode::kInternal;
  try {
    offset = s.alloc->Allocate(nbytes, align);
  } catch (const Error& e) {
    local_error = e.what();
    local_code = e.code();
  }
  MallocRecord mine{nbytes, align, offset};
  std::vector<MallocRecord> all(s.n_pes);
  try {
    s.boot->AllGather(&mine, sizeof(mine), all.data());
  } catch (...) {
    // The collective failed (another pe is elsewhere, or gone): keep the heaps
    // symmetric by giving the block back.
    if (offset != UINT64_MAX) s.alloc->Free(offset);
    throw;
  }

  std::string problem;
  ErrorCode code = ErrorCode::kInvalidArgument;
  if (offset == UINT64_MAX) {
    code = local_code;
    problem = local_error;
  }
  for (int pe = 0; pe < s.n_pes && problem.empty(); ++pe) {
    const MallocRecord& r = all[pe];
    if (r.offset == UINT64_MAX) {
      code = pe == s.my_pe ? local_code : ErrorCode::kOutOfMemory;
      problem = pe == s.my_pe ? local_error
                              : StrCat("pe ", pe, " could not allocate ", r.nbytes,
                                       " symmetric bytes (see that pe's error)");
    } else if (r.nbytes != all[0].nbytes || r.align != all[0].align) {
      problem = StrCat("asymmetric malloc: pe 0 asked for ", all[0].nbytes, " bytes (align ",
                       all[0].align, ") but pe ", pe, " for ", r.nbytes, " bytes (align ", r.align,
                       "); every pe must make the same malloc calls in the same order");
    } else if (r.offset != all[0].offset) {
      problem =
          StrCat("asymmetric heap: the block lands at offset ", all[0].offset, " on pe 0 but ",
                 r.offset, " on pe ", pe, "; the pes' earlier malloc/free sequences differ");
    }
  }
  if (!problem.empty()) {
    if (offset != UINT64_MAX) s.alloc->Free(offset);
    ThrowError(code, problem);
  }
  if (internal) ++s.internal_allocations;
  return s.backend->base(s.my_pe) + offset;
}

void ZeroSymmetric(State& s, void* p, size_t nbytes) {
  std::vector<char> zeros(nbytes, 0);
  s.backend->Copy(p, zeros.data(), nbytes);
}

size_t OffsetOf(State& s, const void* ptr, size_t nbytes, const char* what) {
  const char* base = s.backend->base(s.my_pe);
  const char* p = static_cast<const char*>(ptr);
  if (p < base || p >= base + s.backend->size() ||
      nbytes > static_cast<size_t>(base + s.backend->size() - p)) {
    MORI_THROW(InvalidArgumentError, what, " ", ptr, " (+", nbytes,
               " bytes) is not in this pe's symmetric heap [", static_cast<const void*>(base), ", ",
               static_cast<const void*>(base + s.backend->size()), ")");
  }
  return static_cast<size_t>(p - base);
}

char* PeerAddress(State& s, const void* sym, size_t nbytes, int pe, const char* what) {
  MORI_CHECK_ARG(pe >= 0 && pe < s.n_pes, "pe ", pe, " out of range [0, ", s.n_pes, ")");
  size_t off = OffsetOf(s, sym, nbytes, what);
  char* base = s.backend->base(pe);
  if (base == nullptr) {
    MORI_THROW(NotSupportedError, "pe ", pe, " is not load/store reachable from pe ", s.my_pe,
               " (another node); host ", what, " across nodes needs a network transport");
  }
  return base + off;
}

// The local (non-symmetric) side of a put/get: which memory it is cannot be
// checked portably, but a null or wrapping range is certainly wrong.
void CheckLocalRange(const void* p, size_t nbytes, const char* what) {
  if (nbytes == 0) return;
  MORI_CHECK_ARG(p != nullptr, what, " is a null address (", nbytes,
                 " bytes); a tensor without memory (meta device, or empty storage)?");
  const auto a = reinterpret_cast<uintptr_t>(p);
  MORI_CHECK_ARG(a + nbytes > a, what, " ", p, " + ", nbytes,
                 " bytes wraps around the address space");
}

size_t HeapSizeFrom(const InitOptions& o) {
  size_t size = o.heap_size;
  if (size == 0) {
    size = env::Size("MORI_SHMEM_HEAP_SIZE", kDefaultHeapSize, 4096, kMaxHeapSize);
  }
  MORI_CHECK_ARG(size >= 4096, "heap size ", size, " bytes is too small (minimum 4096)");
  // Backends add offsets of up to local_pes * size to a pointer and size files
  // with off_t: a heap beyond 2^62 bytes per pe is a mistake, not a request.
  MORI_CHECK_ARG(size <= kMaxHeapSize, "heap size ", size, " bytes exceeds the maximum of ",
                 kMaxHeapSize, " bytes per pe");
  return (size + kHeapGranularity - 1) / kHeapGranularity * kHeapGranularity;
}

HandleType HandleTypeFrom(const InitOptions& o) {
  if (o.handle_type != HandleType::kAuto) return o.handle_type;
  const auto name = env::Get("MORI_SHMEM_HANDLE");
  return name ? ParseHandleType(*name) : HandleType::kAuto;
}

}  // namespace

const char* HandleTypeName(HandleType type) noexcept {
  switch (type) {
    case HandleType::kAuto:
      return "auto";
    case HandleType::kFabric:
      return "fabric";
    case HandleType::kPosixFd:
      return "posix_fd";
    case HandleType::kNone:
      return "none";
  }
  return "?";
}

HandleType ParseHandleType(const std::string& name) {
  if (name == "auto") return HandleType::kAuto;
  if (name == "fabric") return HandleType::kFabric;
  if (name == "posix_fd" || name == "posix-fd" || name == "fd") return HandleType::kPosixFd;
  MORI_THROW(InvalidArgumentError, "unknown shmem handle type '", name,
             "' (expected auto, fabric or posix_fd)");
}

size_t ParseSize(const std::string& text) {
  return static_cast<size_t>(env::ParseSize("size", text, 0, SIZE_MAX));
}

void Init(std::shared_ptr<bootstrap::Bootstrap> boot, const InitOptions& options) {
  MORI_CHECK_ARG(boot != nullptr, "shmem init needs a bootstrap");
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.initialized) {
    MORI_THROW(InvalidStateError, "mori shmem is already initialized (pe ", s.my_pe, " of ",
               s.n_pes, "); call finalize() before init() again");
  }
  InitOptions o = options;
  o.heap_size = HeapSizeFrom(options);
  o.handle_type = HandleTypeFrom(options);
  o.timeout = CheckedTimeout(o.timeout, "shmem timeout");

  LocalGroup group = internal::DiscoverLocalGroup(*boot);
  internal::BackendOptions bo{o.heap_size, o.device, o.handle_type, o.timeout};
  std::unique_ptr<HeapBackend> backend = o.device >= 0
                                             ? internal::CreateCudaBackend(*boot, group, bo)
                                             : internal::CreateHostBackend(*boot, group, bo);

  s.boot = std::move(boot);
  s.backend = std::move(backend);
  s.alloc = std::make_unique<Allocator>(s.backend->size());
  s.group = std::move(group);
  s.options = o;
  s.my_pe = s.boot->Rank();
  s.n_pes = s.boot->WorldSize();
  s.all_reachable = s.group.local_pes.size() == static_cast<size_t>(s.n_pes);
  s.internal_allocations = 0;
  s.host_epoch = 0;
  try {
    // One internal block, first in the heap: host barrier counters, device barrier
    // counters, device barrier epoch.
    const size_t counters = s.n_pes;
    const size_t internal_bytes = sizeof(uint64_t) * (2 * counters + 1);
    auto* words = static_cast<uint64_t*>(AllocateCollective(s, internal_bytes, 256, true));
    ZeroSymmetric(s, words, internal_bytes);
    s.host_arrive = words;
    uint64_t* device_arrive = words + counters;
    uint64_t* device_epoch = words + 2 * counters;
    s.ctx = DeviceContext{s.backend->peer_bases_for_kernels(),
                          s.backend->base(s.my_pe),
                          s.backend->size(),
                          s.my_pe,
                          s.n_pes,
                          device_arrive,
                          device_epoch};
    // Nobody signals a peer before that peer has zeroed its counters.
    s.boot->Barrier();
  } catch (...) {
    s.backend->Release();
    s.backend.reset();
    s.alloc.reset();
    s.boot.reset();
    throw;
  }
  s.initialized = true;
  ++s.generation;
  MORI_LOG_INFO(kShmem, "pe ", s.my_pe, "/", s.n_pes, ": symmetric heap ready (",
                s.backend->kind() == MemoryKind::kHost ? "host" : "cuda", ", ", s.backend->size(),
                " bytes, ", s.group.local_pes.size(), " local pes)");
}

void Finalize(bool force) {
  State& s = Checked();
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    hooks.swap(s.at_finalize);
  }
  for (auto& fn : hooks) fn();  // outside the lock: a hook may call the heap's API
  std::lock_guard<std::mutex> lock(s.mu);
  struct Live {
    uint64_t count;
    uint64_t bytes;
  };
  Live mine{s.alloc->live_count() - s.internal_allocations, s.alloc->used_bytes()};
  std::vector<Live> all(s.n_pes);
  s.boot->AllGather(&mine, sizeof(mine), all.data());
  if (!force) {
    for (int pe = 0; pe < s.n_pes; ++pe) {
      if (all[pe].count > 0) {
        MORI_THROW(InvalidStateError, "finalize with live symmetric allocations: pe ", pe, " has ",
                   all[pe].count, " (", all[pe].bytes,
                   " bytes incl. internal); free them or finalize(force=True)");
      }
    }
  }
  s.boot->Barrier();
  s.backend->Release();
  s.backend.reset();
  s.alloc.reset();
  s.boot.reset();
  s.initialized = false;
  s.ctx = DeviceContext{};
  MORI_LOG_INFO(kShmem, "pe ", s.my_pe, ": symmetric heap finalized");
}

bool Initialized() noexcept { return S().initialized; }
uint64_t Generation() noexcept { return S().generation; }

int MyPe() { return Checked().my_pe; }
int NPes() { return Checked().n_pes; }

HeapInfo GetHeapInfo() {
  State& s = Checked();
  std::lock_guard<std::mutex> lock(s.mu);
  HeapInfo h;
  h.kind = s.backend->kind();
  h.device = s.options.device;
  h.handle_type = s.backend->handle_type();
  h.handle_notes = s.backend->handle_notes();
  h.heap_size = s.backend->size();
  h.used_bytes = s.alloc->used_bytes();
  h.free_bytes = s.alloc->free_bytes();
  h.largest_free_block = s.alloc->largest_free_block();
  h.live_allocations = s.alloc->live_count() - s.internal_allocations;
  h.local_pes = s.group.local_pes;
  return h;
}

DeviceContext GetDeviceContext() { return Checked().ctx; }

void AtFinalize(std::function<void()> fn) {
  State& s = Checked();
  std::lock_guard<std::mutex> lock(s.mu);
  s.at_finalize.push_back(std::move(fn));
}

std::shared_ptr<bootstrap::Bootstrap> GetBootstrap() {
  State& s = Checked();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.boot;
}

void* Malloc(size_t nbytes, size_t align) {
  State& s = Checked();
  std::lock_guard<std::mutex> lock(s.mu);
  return AllocateCollective(s, nbytes, align, false);
}

void Free(void* ptr) {
  State& s = Checked();
  std::lock_guard<std::mutex> lock(s.mu);
  MORI_CHECK_ARG(ptr != nullptr, "free of a null pointer");
  const size_t off = OffsetOf(s, ptr, 1, "free of");
  try {
    s.alloc->Free(off);
  } catch (const Error& e) {
    ThrowError(e.code(), StrCat("free of address ", ptr, ": ", e.what()));
  }
}

bool IsSymmetric(const void* ptr, size_t nbytes) {
  State& s = Checked();
  const char* base = s.backend->base(s.my_pe);
  const char* p = static_cast<const char*>(ptr);
  return p >= base && p < base + s.backend->size() &&
         nbytes <= static_cast<size_t>(base + s.backend->size() - p);
}

void* Ptr(const void* sym, int pe) {
  State& s = Checked();
  MORI_CHECK_ARG(pe >= 0 && pe < s.n_pes, "pe ", pe, " out of range [0, ", s.n_pes, ")");
  const size_t off = OffsetOf(s, sym, 1, "address");
  char* base = s.backend->base(pe);
  return base == nullptr ? nullptr : base + off;
}

void Put(void* dst_sym, const void* src, size_t nbytes, int pe) {
  State& s = Checked();
  CheckLocalRange(src, nbytes, "put source");
  s.backend->Copy(PeerAddress(s, dst_sym, nbytes, pe, "put to"), src, nbytes);
}

void Get(void* dst, const void* src_sym, size_t nbytes, int pe) {
  State& s = Checked();
  CheckLocalRange(dst, nbytes, "get destination");
  s.backend->Copy(dst, PeerAddress(s, src_sym, nbytes, pe, "get from"), nbytes);
}

void Signal(uint64_t* sig_sym, uint64_t value, int pe, SignalOp op) {
  State& s = Checked();
  MORI_CHECK_ARG(reinterpret_cast<uintptr_t>(sig_sym) % 8 == 0, "signal address ",
                 static_cast<void*>(sig_sym), " is not 8-byte aligned");
  auto* remote = reinterpret_cast<uint64_t*>(PeerAddress(s, sig_sym, 8, pe, "signal to"));
  s.backend->SignalWord(remote, value, op);
}

uint64_t WaitUntil(uint64_t* sig_sym, Cmp cmp, uint64_t value, std::chrono::milliseconds timeout) {
  State& s = Checked();
  timeout = CheckedTimeout(timeout, "wait_until timeout");
  MORI_CHECK_ARG(reinterpret_cast<uintptr_t>(sig_sym) % 8 == 0, "signal address ",
                 static_cast<void*>(sig_sym), " is not 8-byte aligned");
  OffsetOf(s, sig_sym, 8, "signal");
  if (s.backend->kind() == MemoryKind::kHost) return host::WaitUntil(sig_sym, cmp, value, timeout);
  // CUDA heaps: each probe is a device-to-host copy, so poll more gently.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    uint64_t v = s.backend->LoadWord(sig_sym);
    if (Compare(v, cmp, value)) return v;
    if (std::chrono::steady_clock::now() > deadline) {
      MORI_THROW(TimeoutError, "wait_until timed out after ", timeout.count(), " ms: signal at ",
                 static_cast<void*>(sig_sym), " is ", v, ", waiting for value ", CmpName(cmp), " ",
                 value);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(5));
  }
}

void BarrierAll() {
  State& s = Checked();
  if (!s.all_reachable) {
    s.boot->Barrier();
    return;
  }
  // The host protocol: same as the device one, on a separate counter array.
  const uint64_t k = ++s.host_epoch;
  // Peer addresses come from the backend: ctx.peer_bases may be device memory.
  const size_t slot = reinterpret_cast<char*>(&s.host_arrive[s.my_pe]) - s.backend->base(s.my_pe);
  for (int pe = 0; pe < s.n_pes; ++pe) {
    s.backend->SignalWord(reinterpret_cast<uint64_t*>(s.backend->base(pe) + slot), 1,
                          SignalOp::kAdd);
  }
  const auto deadline = std::chrono::steady_clock::now() + s.options.timeout;
  for (int pe = 0; pe < s.n_pes; ++pe) {
    for (uint64_t spins = 0;; ++spins) {
      uint64_t v = s.backend->LoadWord(&s.host_arrive[pe]);
      if (v >= k) break;
      if (std::chrono::steady_clock::now() > deadline) {
        MORI_THROW(TimeoutError, "barrier_all #", k, " on pe ", s.my_pe, " timed out after ",
                   s.options.timeout.count(), " ms waiting for pe ", pe, " (it has entered ", v,
                   " barriers)");
      }
      if (spins > 1024) std::this_thread::yield();
    }
  }
}

void BarrierOnStream(uintptr_t stream) {
  State& s = Checked();
  s.backend->BarrierOnStream(s.ctx, stream);
}

}  // namespace mori::shmem
