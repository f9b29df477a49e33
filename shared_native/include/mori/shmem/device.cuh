// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device API of mori's symmetric heap, for kernels in any package (mori.ep,
// mori.ccl, ...). Header-only: everything is __device__ __forceinline__ and takes
// the DeviceContext from mori::shmem::GetDeviceContext(), passed to the kernel by
// value.
//
// Memory model (PTX, system scope, since the peers are other GPUs/processes):
// - Put*/Get* are weak stores/loads through the peer mapping (NVLink or same-GPU
//   P2P). The blocking forms end with the scope's barrier and fence.sc.sys by every
//   participating thread, so when they return every byte of the transfer is
//   visible at system scope and a following Signal* by any thread of the scope
//   cannot overtake it. The _nbi forms issue the accesses and return; order them
//   with Quiet()/Fence() (every thread that issued accesses) plus the scope's
//   barrier before signalling.
// - SignalSet/SignalAdd are release operations at system scope: the stores (and
//   loads) this thread issued or observed before them are visible to a thread that
//   observes the signal value with an acquire load (WaitUntil).
// - WaitUntil uses ld.acquire.sys: loads after it see everything released before
//   the observed value. Threads of the block that did not wait themselves get the
//   same guarantee after a __syncthreads() that follows the wait (bar.sync orders
//   at CTA scope, and causality order is transitive).
// - BarrierAllBlock: a release of everything the block wrote before it, an acquire
//   of everything every pe wrote before its own BarrierAllBlock.

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "mori/shmem/context.hpp"

namespace mori::shmem::device {

// ---------------------------------------------------------------------------
// Primitive accesses (generic addressing: valid for global memory of this GPU
// and for peer memory mapped into this process).

__device__ __forceinline__ void StoreRelease(uint64_t* addr, uint64_t value) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(addr), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t AtomicAddRelease(uint64_t* addr, uint64_t value) {
  uint64_t old;
  asm volatile("atom.add.release.sys.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(addr), "l"(value)
               : "memory");
  return old;
}

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* addr) {
  uint64_t value;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(value) : "l"(addr) : "memory");
  return value;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Fails the launch (the host sees cudaErrorLaunchFailure) and never returns. nvcc
// emits __trap() as a plain `trap` instruction that the code after it follows, and
// the grid is stopped asynchronously, some time later: a thread that merely traps
// goes on running the code written for the case its check ruled out (a store
// through the null pointer it just reported, a loop over a rejected count). On an
// H200, threads were seen running for a while after a trap (their later checks
// printed), so the thread parks here until the grid is stopped.
[[noreturn]] __device__ __forceinline__ void Trap() {
  asm volatile("trap;" ::: "memory");
  for (;;) __nanosleep(1000000);
}

namespace detail {
// Set once a thread of this translation unit has printed why its launch fails. A trap
// ends the context, so it is never reset.
static __device__ unsigned g_trap_printed = 0;
}  // namespace detail

// Called by a thread right after printing why its launch fails.
__device__ __forceinline__ void TrapReported() {
  __threadfence();
  atomicExch(&detail::g_trap_printed, 1u);
}

// Traps once a thread of this translation unit has reported (TrapReported), or after
// wait_ns: a trap stops the whole grid, and a thread that traps while another is
// inside its printf loses that message (seen on an H200: the pe that trapped without
// a pause printed nothing). For every thread that traps without printing.
[[noreturn]] __device__ __forceinline__ void TrapAfterReport(uint64_t wait_ns = 100000000) {
  const uint64_t t0 = GlobalTimerNs();
  while (atomicAdd(&detail::g_trap_printed, 0u) == 0u && GlobalTimerNs() - t0 < wait_ns) {
    __nanosleep(1000);
  }
  Trap();
}

// fence.sc.sys: every access of this thread before it is performed at system scope
// before any access after it.
__device__ __forceinline__ void Fence() { __threadfence_system(); }

// Completes this thread's outstanding _nbi puts/gets. Load/store P2P has no
// separate completion queue: the stores are performed once a system fence returns.
__device__ __forceinline__ void Quiet() { __threadfence_system(); }

// ---------------------------------------------------------------------------
// Peer addresses.

// pe's copy of the symmetric address `sym`, or nullptr when pe is not load/store
// reachable from this GPU.
template <typename T>
__device__ __forceinline__ T* Ptr(const DeviceContext& ctx, T* sym, int pe) {
  return PeerPtr(ctx, sym, pe);
}

namespace detail {

__device__ __forceinline__ unsigned FlatThreadIdx() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

__device__ __forceinline__ unsigned BlockThreads() { return blockDim.x * blockDim.y * blockDim.z; }

__device__ __forceinline__ unsigned LaneId() {
  unsigned lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

template <typename T>
__device__ __forceinline__ T* PeerOrTrap(const DeviceContext& ctx, T* sym, int pe,
                                         const char* what) {
  T* p = PeerPtr(ctx, sym, pe);
  if (p == nullptr) {
    printf(
        "mori shmem %s: pe %d is not load/store reachable from pe %d (sym %p) "
        "[block (%d,%d,%d) thread (%d,%d,%d)]\n",
        what, pe, ctx.my_pe, static_cast<const void*>(sym), blockIdx.x, blockIdx.y, blockIdx.z,
        threadIdx.x, threadIdx.y, threadIdx.z);
    Trap();
  }
  return p;
}

// Copies `nwords` words of type W, thread `tid` of `nthreads` taking words
// tid, tid + nthreads, ... (coalesced across the threads). kInFlight loads are
// issued before their stores, so that a few SMs keep enough bytes in flight to
// fill NVLink (8 x 16 B per thread measured better than 4 on H200; BENCHMARKS.md).
template <typename W, int kInFlight = 8>
__device__ __forceinline__ void CopyWords(char* dst, const char* src, size_t nwords, unsigned tid,
                                          unsigned nthreads) {
  W* d = reinterpret_cast<W*>(dst);
  const W* s = reinterpret_cast<const W*>(src);
  size_t i = tid;
  const size_t step = nthreads;
  for (; i + (kInFlight - 1) * step < nwords; i += kInFlight * step) {
    W v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) v[k] = s[i + k * step];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) d[i + k * step] = v[k];
  }
  for (; i < nwords; i += step) d[i] = s[i];
}

template <unsigned kWidth>
__device__ __forceinline__ void CopyAligned(char* dst, const char* src, size_t nbytes, unsigned tid,
                                            unsigned nthreads) {
  // dst and src share their misalignment modulo kWidth: peel a head so both are
  // kWidth-aligned, move the body in kWidth words, the tail byte by byte.
  size_t head = (kWidth - (reinterpret_cast<uintptr_t>(dst) & (kWidth - 1))) & (kWidth - 1);
  if (head > nbytes) head = nbytes;
  for (size_t i = tid; i < head; i += nthreads) dst[i] = src[i];
  dst += head;
  src += head;
  nbytes -= head;
  const size_t nwords = nbytes / kWidth;
  if constexpr (kWidth == 16) {
    CopyWords<int4>(dst, src, nwords, tid, nthreads);
  } else if constexpr (kWidth == 8) {
    CopyWords<uint64_t>(dst, src, nwords, tid, nthreads);
  } else {
    CopyWords<uint32_t>(dst, src, nwords, tid, nthreads);
  }
  const size_t done = nwords * kWidth;
  for (size_t i = done + tid; i < nbytes; i += nthreads) dst[i] = src[i];
}

// The widest word size the two addresses allow (16, 8, 4 or bytes).
__device__ __forceinline__ void CopyBytes(void* dst_v, const void* src_v, size_t nbytes,
                                          unsigned tid, unsigned nthreads) {
  char* dst = static_cast<char*>(dst_v);
  const char* src = static_cast<const char*>(src_v);
  const uintptr_t skew = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if ((skew & 15) == 0) {
    CopyAligned<16>(dst, src, nbytes, tid, nthreads);
  } else if ((skew & 7) == 0) {
    CopyAligned<8>(dst, src, nbytes, tid, nthreads);
  } else if ((skew & 3) == 0) {
    CopyAligned<4>(dst, src, nbytes, tid, nthreads);
  } else {
    for (size_t i = tid; i < nbytes; i += nthreads) dst[i] = src[i];
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Put: local `src` (any memory this GPU can read) -> pe's copy of `dst_sym`.
// Get: pe's copy of `src_sym` -> local `dst`.
// Thread forms: one thread moves all bytes. Warp forms: every lane of the warp
// calls with the same arguments. Block forms: every thread of the block calls
// with the same arguments.

template <typename T>
__device__ __forceinline__ void PutThread_nbi(const DeviceContext& ctx, T* dst_sym, const T* src,
                                              size_t nbytes, int pe) {
  detail::CopyBytes(detail::PeerOrTrap(ctx, dst_sym, pe, "put"), src, nbytes, 0, 1);
}

template <typename T>
__device__ __forceinline__ void PutThread(const DeviceContext& ctx, T* dst_sym, const T* src,
                                          size_t nbytes, int pe) {
  PutThread_nbi(ctx, dst_sym, src, nbytes, pe);
  Fence();
}

template <typename T>
__device__ __forceinline__ void PutWarp_nbi(const DeviceContext& ctx, T* dst_sym, const T* src,
                                            size_t nbytes, int pe) {
  detail::CopyBytes(detail::PeerOrTrap(ctx, dst_sym, pe, "put"), src, nbytes, detail::LaneId(), 32);
}

template <typename T>
__device__ __forceinline__ void PutWarp(const DeviceContext& ctx, T* dst_sym, const T* src,
                                        size_t nbytes, int pe) {
  PutWarp_nbi(ctx, dst_sym, src, nbytes, pe);
  Fence();
  __syncwarp();
}

template <typename T>
__device__ __forceinline__ void PutBlock_nbi(const DeviceContext& ctx, T* dst_sym, const T* src,
                                             size_t nbytes, int pe) {
  detail::CopyBytes(detail::PeerOrTrap(ctx, dst_sym, pe, "put"), src, nbytes,
                    detail::FlatThreadIdx(), detail::BlockThreads());
}

template <typename T>
__device__ __forceinline__ void PutBlock(const DeviceContext& ctx, T* dst_sym, const T* src,
                                         size_t nbytes, int pe) {
  PutBlock_nbi(ctx, dst_sym, src, nbytes, pe);
  Fence();
  __syncthreads();
}

template <typename T>
__device__ __forceinline__ void GetThread_nbi(const DeviceContext& ctx, T* dst, const T* src_sym,
                                              size_t nbytes, int pe) {
  detail::CopyBytes(dst, detail::PeerOrTrap(ctx, src_sym, pe, "get"), nbytes, 0, 1);
}

template <typename T>
__device__ __forceinline__ void GetThread(const DeviceContext& ctx, T* dst, const T* src_sym,
                                          size_t nbytes, int pe) {
  GetThread_nbi(ctx, dst, src_sym, nbytes, pe);
  Fence();
}

template <typename T>
__device__ __forceinline__ void GetWarp_nbi(const DeviceContext& ctx, T* dst, const T* src_sym,
                                            size_t nbytes, int pe) {
  detail::CopyBytes(dst, detail::PeerOrTrap(ctx, src_sym, pe, "get"), nbytes, detail::LaneId(), 32);
}

template <typename T>
__device__ __forceinline__ void GetWarp(const DeviceContext& ctx, T* dst, const T* src_sym,
                                        size_t nbytes, int pe) {
  GetWarp_nbi(ctx, dst, src_sym, nbytes, pe);
  Fence();
  __syncwarp();
}

template <typename T>
__device__ __forceinline__ void GetBlock_nbi(const DeviceContext& ctx, T* dst, const T* src_sym,
                                             size_t nbytes, int pe) {
  detail::CopyBytes(dst, detail::PeerOrTrap(ctx, src_sym, pe, "get"), nbytes,
                    detail::FlatThreadIdx(), detail::BlockThreads());
}

template <typename T>
__device__ __forceinline__ void GetBlock(const DeviceContext& ctx, T* dst, const T* src_sym,
                                         size_t nbytes, int pe) {
  GetBlock_nbi(ctx, dst, src_sym, nbytes, pe);
  Fence();
  __syncthreads();
}

// ---------------------------------------------------------------------------
// Signals (one thread calls them).

// pe's copy of *sig_sym = value, release at system scope.
__device__ __forceinline__ void SignalSet(const DeviceContext& ctx, uint64_t* sig_sym,
                                          uint64_t value, int pe) {
  StoreRelease(detail::PeerOrTrap(ctx, sig_sym, pe, "signal_set"), value);
}

// pe's copy of *sig_sym += value (atomic), release at system scope. Returns the
// previous value.
__device__ __forceinline__ uint64_t SignalAdd(const DeviceContext& ctx, uint64_t* sig_sym,
                                              uint64_t value, int pe) {
  return AtomicAddRelease(detail::PeerOrTrap(ctx, sig_sym, pe, "signal_add"), value);
}

// Spins with acquire loads on this pe's word `local_sig` until
// Compare(*local_sig, cmp, value); returns the value seen. With timeout_ns > 0 it
// prints the address, the comparison, the expected and last values and the
// calling thread, then traps (the launch fails with an illegal-instruction error
// instead of hanging the GPU).
__device__ __forceinline__ uint64_t WaitUntil(const uint64_t* local_sig, Cmp cmp, uint64_t value,
                                              uint64_t timeout_ns = 0) {
  uint64_t seen = LoadAcquire(local_sig);
  if (Compare(seen, cmp, value)) return seen;
  const uint64_t start = timeout_ns ? GlobalTimerNs() : 0;
  for (;;) {
    seen = LoadAcquire(local_sig);
    if (Compare(seen, cmp, value)) return seen;
    if (timeout_ns && GlobalTimerNs() - start > timeout_ns) {
      printf(
          "mori shmem wait_until timed out after %llu ns: *%p %s %llu expected, last value "
          "%llu [block (%d,%d,%d) thread (%d,%d,%d)]\n",
          static_cast<unsigned long long>(timeout_ns), static_cast<const void*>(local_sig),
          CmpName(cmp), static_cast<unsigned long long>(value),
          static_cast<unsigned long long>(seen), blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
          threadIdx.y, threadIdx.z);
      Trap();
    }
  }
}

// ---------------------------------------------------------------------------
// Barrier over all pes, called by every thread of exactly one block per pe (the
// counters are per pe, not per block), the same number of times on every pe.
//
// Protocol: barrier_epoch (local) counts the device barriers this pe entered;
// barrier_arrive[j] on pe p counts the device barriers pe j entered, as seen by p.
// Entering barrier e, pe i increments barrier_arrive[i] on every pe (release),
// then waits until its own barrier_arrive[j] >= e for every j (acquire). The
// counters only grow, so a pe that runs ahead to barrier e+1 cannot satisfy a
// wait for e by mistake. Needs every pe load/store reachable (one node).
__device__ __forceinline__ void BarrierAllBlock(const DeviceContext& ctx, uint64_t timeout_ns = 0) {
  __shared__ uint64_t epoch;
  const unsigned tid = detail::FlatThreadIdx();
  const unsigned nthreads = detail::BlockThreads();
  // Release everything this block wrote before the barrier: each thread's own
  // stores by its fence, then bar.sync hands them to the signalling threads.
  __threadfence_system();
  __syncthreads();
  if (tid == 0) {
    epoch = *ctx.barrier_epoch + 1;
    *ctx.barrier_epoch = epoch;
  }
  __syncthreads();
  const uint64_t e = epoch;
  for (unsigned pe = tid; pe < static_cast<unsigned>(ctx.n_pes); pe += nthreads) {
    if (ctx.peer_bases[pe] == nullptr) {
      printf(
          "mori shmem barrier: pe %u is not load/store reachable from pe %d; the device "
          "barrier needs every pe on this node\n",
          pe, ctx.my_pe);
      Trap();
    }
    SignalAdd(ctx, &ctx.barrier_arrive[ctx.my_pe], 1, static_cast<int>(pe));
  }
  for (unsigned pe = tid; pe < static_cast<unsigned>(ctx.n_pes); pe += nthreads) {
    WaitUntil(&ctx.barrier_arrive[pe], Cmp::kGe, e, timeout_ns);
  }
  __syncthreads();
}

}  // namespace mori::shmem::device
