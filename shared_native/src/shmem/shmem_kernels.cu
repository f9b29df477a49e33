// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Kernels of the CUDA symmetric heap: the stream barrier and host signal the
// backend needs, and the diagnostic/benchmark kernels of mori/shmem/diag.hpp.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "mori/core/error.hpp"
#include "mori/shmem/device.cuh"
#include "mori/shmem/diag.hpp"
#include "mori/shmem/shmem.hpp"
#include "shmem/shmem_kernels.hpp"

namespace mori::shmem {
namespace {

using device::BarrierAllBlock;

int BarrierThreads(int n_pes) { return std::min(1024, std::max(32, (n_pes + 31) / 32 * 32)); }

__global__ void BarrierKernel(DeviceContext ctx, int iters, uint64_t timeout_ns) {
  for (int i = 0; i < iters; ++i) BarrierAllBlock(ctx, timeout_ns);
}

__global__ void SignalAddKernel(uint64_t* addr, uint64_t value) {
  device::Fence();
  device::AtomicAddRelease(addr, value);
}

__global__ void GlobalTimerKernel(uint64_t* out) { *out = device::GlobalTimerNs(); }

__global__ void TrapProbe(uint64_t at_ns, uint64_t max_wait_ns, int tag) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    const uint64_t start = device::GlobalTimerNs();
    uint64_t now = start;
    while (now < at_ns && now - start < max_wait_ns) {
      __nanosleep(200);
      now = device::GlobalTimerNs();
    }
    printf("mori trap probe %d: trapping at %llu ns (asked for %llu)\n", tag,
           static_cast<unsigned long long>(now), static_cast<unsigned long long>(at_ns));
    device::TrapReported();
    device::Trap();
  }
  device::TrapAfterReport(max_wait_ns + 100000000ull);
}

size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

// Splits [0, len) into `parts` contiguous pieces of a 16-byte multiple (so each
// piece keeps the alignment of the whole); returns piece `index`, maybe empty.
__device__ __forceinline__ void Piece(size_t len, unsigned parts, unsigned index, size_t* begin,
                                      size_t* count) {
  size_t per = (len + parts - 1) / parts;
  per = (per + 15) / 16 * 16;
  size_t b = static_cast<size_t>(index) * per;
  *begin = b < len ? b : len;
  *count = b < len ? (len - b < per ? len - b : per) : 0;
}

// kGet: local <- pe's sym; else pe's sym <- local. Block b moves chunk b.
template <bool kGet>
__global__ void CopyKernel(DeviceContext ctx, char* local, char* sym, size_t nbytes, size_t chunk,
                           int pe, diag::Scope scope, bool nbi) {
  const size_t begin = static_cast<size_t>(blockIdx.x) * chunk;
  if (begin >= nbytes) return;  // the whole block leaves: no barrier is split
  const size_t len = nbytes - begin < chunk ? nbytes - begin : chunk;
  char* l = local + begin;
  char* s = sym + begin;
  const unsigned tid = threadIdx.x;
  size_t off = 0, n = 0;
  switch (scope) {
    case diag::Scope::kBlock:
      if (kGet) {
        if (nbi)
          device::GetBlock_nbi(ctx, l, s, len, pe);
        else
          device::GetBlock(ctx, l, s, len, pe);
      } else {
        if (nbi)
          device::PutBlock_nbi(ctx, s, l, len, pe);
        else
          device::PutBlock(ctx, s, l, len, pe);
      }
      break;
    case diag::Scope::kWarp:
      Piece(len, blockDim.x / 32, tid / 32, &off, &n);
      if (n == 0) break;  // warp-uniform
      if (kGet) {
        if (nbi)
          device::GetWarp_nbi(ctx, l + off, s + off, n, pe);
        else
          device::GetWarp(ctx, l + off, s + off, n, pe);
      } else {
        if (nbi)
          device::PutWarp_nbi(ctx, s + off, l + off, n, pe);
        else
          device::PutWarp(ctx, s + off, l + off, n, pe);
      }
      break;
    case diag::Scope::kThread:
      Piece(len, blockDim.x, tid, &off, &n);
      if (n == 0) break;
      if (kGet) {
        if (nbi)
          device::GetThread_nbi(ctx, l + off, s + off, n, pe);
        else
          device::GetThread(ctx, l + off, s + off, n, pe);
      } else {
        if (nbi)
          device::PutThread_nbi(ctx, s + off, l + off, n, pe);
        else
          device::PutThread(ctx, s + off, l + off, n, pe);
      }
      break;
  }
  if (nbi) device::Quiet();
}

__device__ __forceinline__ uint64_t Pattern(uint64_t round, size_t word) {
  uint64_t x =
      round * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(word) * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 29);
}

struct StressParams {
  char* buf;
  uint64_t* flags;
  uint64_t* mismatches;
  size_t slot_bytes;
  int slots;
  int64_t rounds;
  int peer;
  bool sender;
  uint64_t timeout_ns;
};

__global__ void SignalStressKernelImpl(DeviceContext ctx, StressParams p) {
  const unsigned tid = threadIdx.x;
  const size_t words = p.slot_bytes / 8;
  uint64_t* data_flag = &p.flags[0];  // raised on the receiver
  uint64_t* ack_flag = &p.flags[1];   // raised on the sender
  for (int64_t r = 1; r <= p.rounds; ++r) {
    char* slot = p.buf + static_cast<size_t>((r - 1) % p.slots) * p.slot_bytes;
    uint64_t* slot_words = reinterpret_cast<uint64_t*>(slot);
    if (p.sender) {
      if (r > p.slots) {
        // The receiver must be done with round r - slots, which used this slot.
        if (tid == 0) device::WaitUntil(ack_flag, Cmp::kGe, r - p.slots, p.timeout_ns);
        __syncthreads();
      }
      for (size_t i = tid; i < words; i += blockDim.x) slot_words[i] = Pattern(r, i);
      __syncthreads();
      // Source: this pe's copy of the slot; destination: the peer's copy.
      device::PutBlock(ctx, slot, slot, p.slot_bytes, p.peer);
      if (tid == 0) device::SignalSet(ctx, data_flag, static_cast<uint64_t>(r), p.peer);
    } else {
      if (tid == 0) device::WaitUntil(data_flag, Cmp::kGe, static_cast<uint64_t>(r), p.timeout_ns);
      __syncthreads();
      unsigned long long bad = 0;
      for (size_t i = tid; i < words; i += blockDim.x) bad += slot_words[i] != Pattern(r, i);
      if (bad) atomicAdd(reinterpret_cast<unsigned long long*>(p.mismatches), bad);
      __syncthreads();  // every check of this slot is done before the ack frees it
      if (tid == 0) device::SignalSet(ctx, ack_flag, static_cast<uint64_t>(r), p.peer);
    }
  }
}

void CheckLaunch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    MORI_THROW(CudaError, "launch of ", kernel, " failed: ", cudaGetErrorName(err), " (",
               cudaGetErrorString(err), ")");
  }
}

int HeapDevice() {
  HeapInfo info = GetHeapInfo();
  if (info.kind != MemoryKind::kCuda) {
    MORI_THROW(NotSupportedError,
               "shmem diagnostic kernels need a CUDA heap; this heap is in host memory "
               "(init with a device)");
  }
  return info.device;
}

void CheckCopyArgs(const DeviceContext& ctx, const void* sym, size_t nbytes, int pe,
                   const diag::CopyLaunch& launch, const char* what) {
  MORI_CHECK_ARG(pe >= 0 && pe < ctx.n_pes, what, ": pe ", pe, " out of range [0, ", ctx.n_pes,
                 ")");
  MORI_CHECK_ARG(IsSymmetric(sym, nbytes ? nbytes : 1), what, ": address ", sym, " (+", nbytes,
                 " bytes) is not inside this pe's symmetric heap");
  MORI_CHECK_ARG(Ptr(sym, pe) != nullptr, what, ": pe ", pe,
                 " is not load/store reachable from pe ", ctx.my_pe);
  MORI_CHECK_ARG(launch.blocks >= 1 && launch.blocks <= 65535, what, ": blocks ", launch.blocks,
                 " out of range [1, 65535]");
  MORI_CHECK_ARG(launch.threads_per_block >= 32 && launch.threads_per_block <= 1024 &&
                     launch.threads_per_block % 32 == 0,
                 what, ": threads per block ", launch.threads_per_block,
                 " must be a multiple of 32 in [32, 1024]");
}

template <bool kGet>
void LaunchCopy(const DeviceContext& ctx, char* local, char* sym, size_t nbytes, int pe,
                const diag::CopyLaunch& launch) {
  if (nbytes == 0) return;
  internal::ScopedDevice guard(HeapDevice());
  const size_t chunk = RoundUp((nbytes + launch.blocks - 1) / launch.blocks, 16);
  const unsigned blocks = static_cast<unsigned>((nbytes + chunk - 1) / chunk);
  CopyKernel<kGet>
      <<<blocks, launch.threads_per_block, 0, reinterpret_cast<cudaStream_t>(launch.stream)>>>(
          ctx, local, sym, nbytes, chunk, pe, launch.scope, launch.nbi);
  CheckLaunch(kGet ? "shmem get kernel" : "shmem put kernel");
}

}  // namespace

namespace internal {

void LaunchBarrierOnStream(const DeviceContext& ctx, cudaStream_t stream, uint64_t timeout_ns) {
  BarrierKernel<<<1, BarrierThreads(ctx.n_pes), 0, stream>>>(ctx, 1, timeout_ns);
  CheckLaunch("shmem barrier_on_stream kernel");
}

void LaunchSignalAdd(uint64_t* addr, uint64_t value, cudaStream_t stream) {
  SignalAddKernel<<<1, 1, 0, stream>>>(addr, value);
  CheckLaunch("shmem signal_add kernel");
}

}  // namespace internal

namespace diag {

CopyLaunch ParseScope(const std::string& scope) {
  CopyLaunch launch;
  std::string base = scope;
  const std::string suffix = "_nbi";
  if (base.size() > suffix.size() &&
      base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0) {
    launch.nbi = true;
    base.resize(base.size() - suffix.size());
  }
  if (base == "thread") {
    launch.scope = Scope::kThread;
  } else if (base == "warp") {
    launch.scope = Scope::kWarp;
  } else if (base == "block") {
    launch.scope = Scope::kBlock;
  } else {
    MORI_THROW(InvalidArgumentError, "scope '", scope,
               "' is not one of thread, warp, block (optionally with _nbi)");
  }
  return launch;
}

void PutKernel(const DeviceContext& ctx, void* dst_sym, const void* src, size_t nbytes, int pe,
               const CopyLaunch& launch) {
  CheckCopyArgs(ctx, dst_sym, nbytes, pe, launch, "put kernel");
  LaunchCopy<false>(ctx, const_cast<char*>(static_cast<const char*>(src)),
                    static_cast<char*>(dst_sym), nbytes, pe, launch);
}

void GetKernel(const DeviceContext& ctx, void* dst, const void* src_sym, size_t nbytes, int pe,
               const CopyLaunch& launch) {
  CheckCopyArgs(ctx, src_sym, nbytes, pe, launch, "get kernel");
  LaunchCopy<true>(ctx, static_cast<char*>(dst),
                   const_cast<char*>(static_cast<const char*>(src_sym)), nbytes, pe, launch);
}

void SignalStressKernel(const DeviceContext& ctx, const SignalStressArgs& a) {
  MORI_CHECK_ARG(a.peer >= 0 && a.peer < ctx.n_pes && a.peer != ctx.my_pe, "signal stress: peer ",
                 a.peer, " must be another pe in [0, ", ctx.n_pes, ")");
  MORI_CHECK_ARG(a.slot_bytes > 0 && a.slot_bytes % 8 == 0, "signal stress: slot_bytes ",
                 a.slot_bytes, " must be a positive multiple of 8");
  MORI_CHECK_ARG(a.slots >= 1, "signal stress: slots ", a.slots, " must be >= 1");
  MORI_CHECK_ARG(a.rounds >= 0, "signal stress: rounds ", a.rounds, " must be >= 0");
  MORI_CHECK_ARG(reinterpret_cast<uintptr_t>(a.buf_sym) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(a.flags_sym) % 8 == 0,
                 "signal stress: buffer ", a.buf_sym, " must be 16-byte and flags ", a.flags_sym,
                 " 8-byte aligned");
  MORI_CHECK_ARG(IsSymmetric(a.buf_sym, a.slot_bytes * static_cast<size_t>(a.slots)),
                 "signal stress: buffer ", a.buf_sym, " (", a.slots, " x ", a.slot_bytes,
                 " bytes) is not inside the symmetric heap");
  MORI_CHECK_ARG(IsSymmetric(a.flags_sym, 16), "signal stress: flags ",
                 static_cast<void*>(a.flags_sym), " are not inside the symmetric heap");
  MORI_CHECK_ARG(Ptr(a.buf_sym, a.peer) != nullptr, "signal stress: peer ", a.peer,
                 " is not load/store reachable");
  MORI_CHECK_ARG(a.mismatches != nullptr, "signal stress: mismatches counter is null");
  MORI_CHECK_ARG(a.threads_per_block >= 32 && a.threads_per_block <= 1024,
                 "signal stress: threads per block ", a.threads_per_block,
                 " out of range [32, 1024]");
  internal::ScopedDevice guard(HeapDevice());
  StressParams p{static_cast<char*>(a.buf_sym),
                 a.flags_sym,
                 a.mismatches,
                 a.slot_bytes,
                 a.slots,
                 a.rounds,
                 a.peer,
                 a.sender,
                 a.timeout_ns};
  SignalStressKernelImpl<<<1, a.threads_per_block, 0, reinterpret_cast<cudaStream_t>(a.stream)>>>(
      ctx, p);
  CheckLaunch("shmem signal stress kernel");
}

void BarrierLoopKernel(const DeviceContext& ctx, int iters, uint64_t timeout_ns, uintptr_t stream) {
  MORI_CHECK_ARG(iters >= 0, "barrier loop: iters ", iters, " must be >= 0");
  internal::ScopedDevice guard(HeapDevice());
  BarrierKernel<<<1, BarrierThreads(ctx.n_pes), 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      ctx, iters, timeout_ns);
  CheckLaunch("shmem barrier loop kernel");
}

uint64_t GlobalTimerNs(int device) {
  internal::ScopedDevice guard(device);
  uint64_t* out = nullptr;
  MORI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(uint64_t)));
  uint64_t ns = 0;
  GlobalTimerKernel<<<1, 1>>>(out);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t copied =
      launched == cudaSuccess ? cudaMemcpy(&ns, out, sizeof(ns), cudaMemcpyDeviceToHost) : launched;
  (void)cudaFree(out);
  MORI_CUDA_CHECK(copied);
  return ns;
}

void TrapProbeKernel(int device, uint64_t at_ns, uint64_t max_wait_ns, int tag, int blocks,
                     int threads, uintptr_t stream) {
  MORI_CHECK_ARG(blocks >= 1 && threads >= 1 && threads <= 1024, "trap probe: blocks ", blocks,
                 " and threads ", threads, " must be >= 1 (threads <= 1024)");
  internal::ScopedDevice guard(device);
  TrapProbe<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(at_ns, max_wait_ns,
                                                                            tag);
  CheckLaunch("trap probe kernel");
}

}  // namespace diag
}  // namespace mori::shmem
