// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device helpers shared by the collectives' kernels (collectives.cu: one-shot,
// two-shot, reduce-scatter, all-gather, all-to-all, broadcast, barrier, copy-engine
// flags; collectives_ll.cu: one_shot_ll): the kernel parameters, the call steps
// (epoch, post, bounded wait, finish), the traps and their messages, the rank-order
// reduction. Included by .cu files only (no -rdc: every translation unit gets its own
// copy of these device functions).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <type_traits>

#include "collectives_cuda.hpp"
#include "mori/shmem/block_device.cuh"
#include "mori/shmem/device.cuh"

namespace mori::ccl {

namespace dev = mori::shmem::device;
using mori::shmem::DeviceContext;

namespace kernels {
// Internal linkage: each translation unit gets its own copy (a __device__ function
// also has a host definition, which would otherwise clash at link time).
namespace {

// Addressing the block (At, PeerAt: Params is a view of it) and the pause before a
// trap a peer caused (PauseNs, PeerTrapPauseNs) are mori-core's
// (mori/shmem/block_device.cuh).
using dev::At;
using dev::PauseNs;
using dev::PeerAt;

enum KernelKind : int { kOneShotKernel = 0, kTwoShotKernel = 1, kReduceScatterKernel = 2 };

struct Params {
  DeviceContext ctx;
  char* block;
  CudaLayout layout;
  int world, me;
  uint64_t timeout_ns;
  CallDesc desc;
  const char* src;
  char* dst;
  int64_t bytes;  // input bytes
  int64_t row_bytes;
  int64_t src_rows, dst_rows;  // all-to-all
  const int64_t* in_splits;    // all-to-all, device; nullptr: equal
  const int64_t* out_splits;
  int root;
  int64_t src_offset;  // zero-copy: src from this rank's heap base
  // Zero-copy only: the output overlaps the input where peers read it, so the reduce
  // kernels write it after the end-of-call wait (from staging); all-gather: the slot
  // of out that x occupies when it is not this rank's own (-1: none).
  int defer_output;
  int deferred_slot = -1;
};

// ------------------------------------------------------------------ names

__device__ const char* KindName(int k) {
  switch (k) {
    case 0:
      return "barrier";
    case 1:
      return "all_reduce";
    case 2:
      return "all_gather";
    case 3:
      return "reduce_scatter";
    case 4:
      return "all_to_all";
    case 5:
      return "broadcast";
  }
  return "unknown";
}

__device__ const char* DtypeName(int d) {
  switch (d) {
    case 0:
      return "float32";
    case 2:
      return "bfloat16";
    case 3:
      return "float16";
    case 4:
      return "int32";
  }
  return "-";
}

__device__ const char* OpName(int o) {
  switch (o) {
    case 0:
      return "sum";
    case 1:
      return "max";
    case 2:
      return "min";
  }
  return "-";
}

__device__ const char* AlgorithmName(int a) {
  switch (a) {
    case 0:
      return "one_shot";
    case 1:
      return "two_shot";
    case 2:
      return "sm";
    case 3:
      return "copy_engine";
    case 4:
      return "one_shot_ll";
  }
  return "-";
}

// ------------------------------------------------------------------ addressing

__device__ __forceinline__ CudaCallState* State(const Params& p) {
  return At<CudaCallState>(p, p.layout.state);
}

__device__ __forceinline__ size_t StagingOffset(const Params& p, int parity) {
  return p.layout.staging + static_cast<size_t>(parity) * p.layout.max_bytes;
}

__device__ __forceinline__ size_t ReducedOffset(const Params& p, int parity) {
  return p.layout.reduced + static_cast<size_t>(parity) * p.layout.max_bytes;
}

// The [W] signal words of (parity, block) in `area` (arrive or ready).
__device__ __forceinline__ uint64_t* Words(const Params& p, size_t area, int parity, int block) {
  return At<uint64_t>(p, area) + (static_cast<size_t>(parity) * kMaxBlocks + block) * p.world;
}

__device__ __forceinline__ size_t DescOffset(const Params& p, int parity) {
  return p.layout.desc + static_cast<size_t>(parity) * sizeof(CallDesc);
}

// Where pe s's input of this call lies (every thread, after the arrive wait): its
// staging, or in a zero-copy call the offset pe s stored in sources[parity][s].
__device__ __forceinline__ const char* PeerInput(const Params& p, int parity, int s) {
  if (!p.desc.zero_copy) return PeerAt<const char>(p, StagingOffset(p, parity), s);
  const int64_t off = At<const int64_t>(p, p.layout.sources)[parity * p.world + s];
  return p.ctx.peer_bases[s] + off;
}

// Offset in the block of the packets pe `from` posts, parity `parity`.
__device__ __forceinline__ size_t LLSlotOffset(const Params& p, int parity, int from) {
  return p.layout.ll + (static_cast<size_t>(parity) * p.world + from) * (p.layout.ll_words + 1) * 8;
}

// ------------------------------------------------------------------ failures

// True in the first thread of this rank's grid to report: one message per failure,
// the other threads trap quietly.
__device__ bool FirstToReport(const Params& p) {
  return atomicExch(&State(p)->print_latch, 1u) == 0u;
}

__device__ void PrintDesc(int rank, const CallDesc& d) {
  printf(
      "  rank %d calls %s of %lld bytes of %s, op %s, %s, src %d, %lld-byte rows, %d blocks, "
      "%s input (descriptor hash 0x%06x)\n",
      rank, KindName(d.kind), static_cast<long long>(d.bytes), DtypeName(d.dtype), OpName(d.op),
      AlgorithmName(d.algorithm), d.root, static_cast<long long>(d.row_bytes), d.blocks,
      d.zero_copy ? "symmetric (zero-copy)" : "staged", d.hash);
}

// How long a rank waits before trapping on a peer's rejection: at most half the
// timeout (dev::PeerTrapPauseNs says why).
__device__ uint64_t PeerTrapPause(const Params& p) { return dev::PeerTrapPauseNs(p.timeout_ns); }

// A failure every rank detects at once (calls that differ, splits that do not pair
// up, peers that time out together): rank r traps after r / (W - 1) of the pause, so
// that no two processes sharing a GPU trap at the same instant.
[[noreturn]] __device__ void StaggeredTrap(const Params& p) {
  if (p.world > 1 && p.me > 0) PauseNs(PeerTrapPause(p) * p.me / (p.world - 1));
  dev::Trap();
}

[[noreturn]] __device__ void TrapRejectedBy(const Params& p, int from, uint64_t e) {
  if (FirstToReport(p)) {
    printf(
        "mori.ccl %s (call %llu) on rank %d: rejected by rank %d (its inputs failed validation; "
        "see its error)\n",
        KindName(p.desc.kind), static_cast<unsigned long long>(e), p.me, from);
  }
  PauseNs(PeerTrapPause(p));
  dev::Trap();
}

[[noreturn]] __device__ void TrapMismatch(const Params& p, int peer, uint64_t e, int parity,
                                          uint64_t word) {
  if (WordHash(word) == kRejectedHash) TrapRejectedBy(p, peer, e);
  if (FirstToReport(p)) {
    // The peer wrote its descriptor before the word this thread acquired.
    const CallDesc theirs = *PeerAt<const CallDesc>(p, DescOffset(p, parity), peer);
    printf("mori.ccl call %llu on rank %d: ranks disagree (no data moved on this rank):\n",
           static_cast<unsigned long long>(e), p.me);
    PrintDesc(p.me, p.desc);
    PrintDesc(peer, theirs);
  }
  StaggeredTrap(p);
}

[[noreturn]] __device__ void TrapTimeout(const Params& p, int peer, uint64_t e, uint64_t word,
                                         const char* what) {
  if (FirstToReport(p)) {
    printf(
        "mori.ccl %s (call %llu) on rank %d: rank %d did not %s within %llu ms (its last signal "
        "is from call %llu) [block %d]\n",
        KindName(p.desc.kind), static_cast<unsigned long long>(e), p.me, peer, what,
        static_cast<unsigned long long>(p.timeout_ns / 1000000),
        static_cast<unsigned long long>(WordEpoch(word)), blockIdx.x);
  }
  StaggeredTrap(p);
}

// ------------------------------------------------------------------ call steps

// This call's number (every thread of the block).
__device__ uint64_t CallEpoch(const Params& p) {
  __shared__ uint64_t epoch;
  if (threadIdx.x == 0) epoch = *reinterpret_cast<volatile uint64_t*>(&State(p)->epoch) + 1;
  __syncthreads();
  return epoch;
}

// Every thread: releases this block's stores, then posts Word(e, hash) into
// words[me] of every pe. `words` is this rank's symmetric address of the array.
__device__ void Post(const Params& p, uint64_t* words, uint64_t e, int parity,
                     uint32_t hash = 0xffffffffu) {
  if (threadIdx.x == 0) *At<CallDesc>(p, DescOffset(p, parity)) = p.desc;
  dev::Fence();
  __syncthreads();
  const uint64_t w = MakeWord(e, hash == 0xffffffffu ? p.desc.hash : hash);
  for (int s = threadIdx.x; s < p.world; s += blockDim.x) {
    dev::SignalSet(p.ctx, &words[p.me], w, s);
  }
}

// Zero-copy, before Post of the arrive words (which releases it): this rank's input
// offset into sources[parity][me] of every pe.
__device__ void PushSource(const Params& p, int parity) {
  const size_t at = p.layout.sources + (static_cast<size_t>(parity) * p.world + p.me) * 8;
  for (int s = threadIdx.x; s < p.world; s += blockDim.x) *PeerAt<int64_t>(p, at, s) = p.src_offset;
}

// Every thread: waits until every pe's word in `words` is of call e (bounded), then
// checks that it carries this call's hash.
__device__ void WaitAll(const Params& p, const uint64_t* words, uint64_t e, int parity,
                        const char* what) {
  for (int s = threadIdx.x; s < p.world; s += blockDim.x) {
    uint64_t w = dev::LoadAcquire(&words[s]);
    if (WordEpoch(w) < e) {
      const uint64_t t0 = dev::GlobalTimerNs();
      while (WordEpoch(w = dev::LoadAcquire(&words[s])) < e) {
        if (dev::GlobalTimerNs() - t0 > p.timeout_ns) TrapTimeout(p, s, e, w, what);
      }
    }
    if (WordEpoch(w) != e || WordHash(w) != p.desc.hash) TrapMismatch(p, s, e, parity, w);
  }
  __syncthreads();
}

// Counts the block as finished; the last block stores the epoch for the next call
// (every block read it before counting).
__device__ void Finish(const Params& p, uint64_t e) {
  __syncthreads();
  if (threadIdx.x == 0) {
    CudaCallState* st = State(p);
    __threadfence();
    if (atomicAdd(&st->blocks_done, 1u) == gridDim.x - 1) {
      st->blocks_done = 0;
      st->epoch = e;
      __threadfence();
    }
  }
}

__device__ __forceinline__ void Copy(char* dst, const char* src, int64_t n) {
  if (n > 0) dev::detail::CopyBytes(dst, src, static_cast<size_t>(n), threadIdx.x, blockDim.x);
}

// ------------------------------------------------------------------ reduction

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  using Acc = float;
  __device__ static float Load(float v) { return v; }
  __device__ static float Store(float a) { return a; }
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  __device__ static float Load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 Store(float a) { return __float2bfloat16_rn(a); }
};
template <>
struct Elem<__half> {
  using Acc = float;
  __device__ static float Load(__half v) { return __half2float(v); }
  __device__ static __half Store(float a) { return __float2half_rn(a); }
};
template <>
struct Elem<int32_t> {
  using Acc = int32_t;
  __device__ static int32_t Load(int32_t v) { return v; }
  __device__ static int32_t Store(int32_t a) { return a; }
};

// One step of op over the ranks in order (as ReduceCpu): sum adds (int32 wraps);
// max/min keep the first NaN met.
template <int Op, typename Acc>
__device__ __forceinline__ Acc Combine(Acc acc, Acc v) {
  if constexpr (Op == 0) {
    if constexpr (std::is_same_v<Acc, int32_t>) {
      return static_cast<int32_t>(static_cast<uint32_t>(acc) + static_cast<uint32_t>(v));
    } else {
      return acc + v;
    }
  } else {
    if (acc != acc) return acc;
    if (v != v || (Op == 1 ? v > acc : v < acc)) return v;
    return acc;
  }
}

template <int Op, typename Acc>
__device__ __forceinline__ Acc First(Acc v) {
  // Sum starts from zero (an all -0.0 input sums to +0.0, as on the CPU).
  if constexpr (Op == 0) return Combine<Op, Acc>(Acc(0), v);
  return v;
}

// dst[0, hi - lo) (and dst2, when not null) = op over s of srcs[s][lo, hi), bytes;
// [lo, hi) holds whole elements. 16-byte words where every address allows.
template <typename T, int Op>
__device__ void ReduceRange(const char* const* srcs, int world, int64_t lo, int64_t hi, char* dst,
                            char* dst2) {
  using E = Elem<T>;
  using Acc = typename E::Acc;
  constexpr int V = 16 / sizeof(T);
  const int64_t n = hi - lo;
  if (n <= 0) return;
  uintptr_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(dst2);
  for (int s = 0; s < world; ++s) align |= reinterpret_cast<uintptr_t>(srcs[s] + lo);
  const int64_t nvec = (align & 15) == 0 ? n / 16 : 0;
  for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
    int4 raw[kMaxCudaWorld];
#pragma unroll
    for (int s = 0; s < kMaxCudaWorld; ++s) {
      if (s < world) raw[s] = *reinterpret_cast<const int4*>(srcs[s] + lo + j * 16);
    }
    Acc acc[V];
    {
      const T* v = reinterpret_cast<const T*>(&raw[0]);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = First<Op, Acc>(E::Load(v[k]));
    }
#pragma unroll
    for (int s = 1; s < kMaxCudaWorld; ++s) {
      if (s < world) {
        const T* v = reinterpret_cast<const T*>(&raw[s]);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = Combine<Op, Acc>(acc[k], E::Load(v[k]));
      }
    }
    int4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = E::Store(acc[k]);
    *reinterpret_cast<int4*>(dst + j * 16) = out;
    if (dst2 != nullptr) *reinterpret_cast<int4*>(dst2 + j * 16) = out;
  }
  const int64_t count = n / static_cast<int64_t>(sizeof(T));
  for (int64_t i = nvec * V + threadIdx.x; i < count; i += blockDim.x) {
    Acc acc = First<Op, Acc>(E::Load(reinterpret_cast<const T*>(srcs[0] + lo)[i]));
    for (int s = 1; s < world; ++s) {
      acc = Combine<Op, Acc>(acc, E::Load(reinterpret_cast<const T*>(srcs[s] + lo)[i]));
    }
    reinterpret_cast<T*>(dst)[i] = E::Store(acc);
    if (dst2 != nullptr) reinterpret_cast<T*>(dst2)[i] = E::Store(acc);
  }
}

}  // namespace
}  // namespace kernels

// The one_shot_ll kernel for (dtype, op) (collectives_ll.cu).
const void* LLKernelFor(DataType dtype, ReduceOp op);

}  // namespace mori::ccl
