// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CUDA kernels of the collectives (protocol_cuda.hpp) and CommunicatorCuda's
// launches. One kernel per call; block b of every rank copies and reads the same
// byte ranges, so it signals and waits only for block b of its peers. Reductions
// run over the ranks in ascending order, bf16/fp16 accumulating in fp32 and
// rounding once (the CPU implementation's order: every rank gets the same bits).
// Peers' memory is reached through mori-core's device API (peer bases of the
// symmetric heap, SignalSet, LoadAcquire, Trap).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "collectives_cuda.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/device.cuh"
#include "mori/shmem/shmem.hpp"

namespace mori::ccl {

namespace dev = mori::shmem::device;
using mori::shmem::DeviceContext;

namespace {

// How long a rank waits before trapping on a peer's rejection: two processes sharing
// one GPU whose kernels trap at the same instant can leave one launch never ending
// (mori-ep measured this; its TrapRejectedBy pauses likewise). At most half the timeout.
__device__ constexpr uint64_t kPeerTrapPauseNs = 1000000000;

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

template <typename T>
__device__ __forceinline__ T* At(const Params& p, size_t offset) {
  return reinterpret_cast<T*>(p.block + offset);
}

// pe's copy of this rank's block at `offset` (the constructor checked every pe is
// load/store reachable).
template <typename T>
__device__ __forceinline__ T* PeerAt(const Params& p, size_t offset, int pe) {
  return reinterpret_cast<T*>(p.ctx.peer_bases[pe] + (p.block - p.ctx.my_base) + offset);
}

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
      "  rank %d calls %s of %lld bytes of %s, op %s, %s, src %d, %lld-byte rows, %d blocks "
      "(descriptor hash 0x%06x)\n",
      rank, KindName(d.kind), static_cast<long long>(d.bytes), DtypeName(d.dtype), OpName(d.op),
      AlgorithmName(d.algorithm), d.root, static_cast<long long>(d.row_bytes), d.blocks, d.hash);
}

__device__ void PauseNs(uint64_t ns) {
  const uint64_t t0 = dev::GlobalTimerNs();
  while (dev::GlobalTimerNs() - t0 < ns) __nanosleep(100000);
}

__device__ uint64_t PeerTrapPause(const Params& p) {
  const uint64_t half = p.timeout_ns / 2;
  return half < kPeerTrapPauseNs ? half : kPeerTrapPauseNs;
}

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

// ------------------------------------------------------------------ kernels

// All-reduce (one-shot / two-shot) and reduce-scatter.
template <int Kind, typename T, int Op>
__global__ void __launch_bounds__(kThreadsPerBlock) ReduceKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x, nb = gridDim.x, W = p.world;
  char* staging = At<char>(p, StagingOffset(p, par));
  const char* srcs[kMaxCudaWorld];
  for (int s = 0; s < W; ++s) srcs[s] = PeerAt<const char>(p, StagingOffset(p, par), s);
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  int64_t lo, hi;
  if constexpr (Kind == kOneShotKernel) {
    SplitRange(0, p.bytes, nb, b, &lo, &hi);
    Copy(staging + lo, p.src + lo, hi - lo);
    Post(p, arrive, e, par);
    WaitAll(p, arrive, e, par, "arrive");
    ReduceRange<T, Op>(srcs, W, lo, hi, p.dst + lo, nullptr);
  } else if constexpr (Kind == kTwoShotKernel) {
    // Shard s (16-byte aligned) is reduced by rank s; block b handles piece b of each.
    for (int s = 0; s < W; ++s) {
      int64_t slo, shi;
      SplitRange(0, p.bytes, W, s, &slo, &shi);
      SplitRange(slo, shi, nb, b, &lo, &hi);
      Copy(staging + lo, p.src + lo, hi - lo);
    }
    Post(p, arrive, e, par);
    WaitAll(p, arrive, e, par, "arrive");
    {
      int64_t slo, shi;
      SplitRange(0, p.bytes, W, p.me, &slo, &shi);
      SplitRange(slo, shi, nb, b, &lo, &hi);
      char* reduced = At<char>(p, ReducedOffset(p, par));
      ReduceRange<T, Op>(srcs, W, lo, hi, reduced + lo, p.dst + lo);
    }
    uint64_t* ready = Words(p, p.layout.ready, par, b);
    Post(p, ready, e, par);
    WaitAll(p, ready, e, par, "publish its reduced shard");
    for (int k = 1; k < W; ++k) {
      const int s = (p.me + k) % W;
      int64_t slo, shi;
      SplitRange(0, p.bytes, W, s, &slo, &shi);
      SplitRange(slo, shi, nb, b, &lo, &hi);
      Copy(p.dst + lo, PeerAt<const char>(p, ReducedOffset(p, par), s) + lo, hi - lo);
    }
  } else {  // reduce-scatter: segment s of the input (bytes / W) goes to rank s
    const int64_t seg = p.bytes / W;
    for (int s = 0; s < W; ++s) {
      SplitRange(s * seg, (s + 1) * seg, nb, b, &lo, &hi);
      Copy(staging + lo, p.src + lo, hi - lo);
    }
    Post(p, arrive, e, par);
    WaitAll(p, arrive, e, par, "arrive");
    SplitRange(p.me * seg, (p.me + 1) * seg, nb, b, &lo, &hi);
    ReduceRange<T, Op>(srcs, W, lo, hi, p.dst + (lo - p.me * seg), nullptr);
  }
  Finish(p, e);
}

__global__ void __launch_bounds__(kThreadsPerBlock) AllGatherKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x;
  int64_t lo, hi;
  SplitRange(0, p.bytes, gridDim.x, b, &lo, &hi);
  Copy(At<char>(p, StagingOffset(p, par)) + lo, p.src + lo, hi - lo);
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  for (int k = 0; k < p.world; ++k) {
    const int s = (p.me + k) % p.world;
    Copy(p.dst + s * p.bytes + lo, PeerAt<const char>(p, StagingOffset(p, par), s) + lo, hi - lo);
  }
  Finish(p, e);
}

__global__ void __launch_bounds__(kThreadsPerBlock) BroadcastKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x;
  int64_t lo, hi;
  SplitRange(0, p.bytes, gridDim.x, b, &lo, &hi);
  if (p.me == p.root) Copy(At<char>(p, StagingOffset(p, par)) + lo, p.src + lo, hi - lo);
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  if (p.me != p.root) {
    Copy(p.dst + lo, PeerAt<const char>(p, StagingOffset(p, par), p.root) + lo, hi - lo);
  }
  Finish(p, e);
}

__device__ __forceinline__ int64_t* Rows(const Params& p, int parity, int pe) {
  return PeerAt<int64_t>(p, p.layout.rows + static_cast<size_t>(parity) * 2 * p.world * 8, pe);
}

__global__ void __launch_bounds__(kThreadsPerBlock) AllToAllKernel(Params p) {
  __shared__ int64_t src_off[kMaxCudaWorld], dst_off[kMaxCudaWorld], cnt[kMaxCudaWorld];
  __shared__ int bad;
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x, W = p.world;
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  if (threadIdx.x == 0) {
    // This rank's splits into rows[par] (every block writes the same values before
    // its own signal, which is what its peers' block acquires), checked here.
    int64_t* mine = Rows(p, par, p.me);
    int64_t in_sum = 0, out_sum = 0;
    bad = 0;
    for (int d = 0; d < W; ++d) {
      const int64_t in = p.in_splits ? p.in_splits[d] : p.src_rows / W;
      const int64_t out = p.out_splits ? p.out_splits[d] : p.dst_rows / W;
      mine[d] = in;
      mine[W + d] = out;
      if (in < 0 || out < 0) bad = 1;
      in_sum += in;
      out_sum += out;
    }
    if (!bad && in_sum > p.src_rows) bad = 2;
    if (!bad && out_sum > p.dst_rows) bad = 3;
    if (bad && FirstToReport(p)) {
      printf(
          "mori.ccl all_to_all (call %llu) on rank %d: %s (in_splits sum to %lld for %lld input "
          "rows; out_splits sum to %lld for %lld output rows)\n",
          static_cast<unsigned long long>(e), p.me,
          bad == 1   ? "a negative split"
          : bad == 2 ? "in_splits exceed the input's rows"
                     : "out_splits exceed the output's rows",
          static_cast<long long>(in_sum), static_cast<long long>(p.src_rows),
          static_cast<long long>(out_sum), static_cast<long long>(p.dst_rows));
    }
  }
  __syncthreads();
  if (bad) {
    // Peers trap naming this rank instead of timing out.
    Post(p, arrive, e, par, kRejectedHash);
    dev::Trap();
  }
  int64_t lo, hi;
  SplitRange(0, p.src_rows * p.row_bytes, gridDim.x, b, &lo, &hi);
  Copy(At<char>(p, StagingOffset(p, par)) + lo, p.src + lo, hi - lo);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  if (threadIdx.x == 0) {
    // Every rank checks every pair (sends of s to d == what d expects from s), so
    // a disagreement traps on every rank with the same message.
    for (int s = 0; s < W; ++s) {
      const int64_t* in_s = Rows(p, par, s);
      for (int d = 0; d < W; ++d) {
        const int64_t expect = Rows(p, par, d)[W + s];
        if (in_s[d] != expect) {
          if (FirstToReport(p)) {
            printf(
                "mori.ccl all_to_all (call %llu) on rank %d: splits disagree: rank %d sends %lld "
                "rows to rank %d, which expects %lld rows from it\n",
                static_cast<unsigned long long>(e), p.me, s, static_cast<long long>(in_s[d]), d,
                static_cast<long long>(expect));
          }
          StaggeredTrap(p);
        }
      }
    }
    int64_t out_prefix = 0;
    for (int s = 0; s < W; ++s) {
      const int64_t* in_s = Rows(p, par, s);
      int64_t before = 0;
      for (int d = 0; d < p.me; ++d) before += in_s[d];
      src_off[s] = before;
      cnt[s] = in_s[p.me];
      dst_off[s] = out_prefix;
      out_prefix += cnt[s];
    }
  }
  __syncthreads();
  for (int k = 0; k < W; ++k) {
    const int s = (p.me + k) % W;
    SplitRange(0, cnt[s] * p.row_bytes, gridDim.x, b, &lo, &hi);
    Copy(p.dst + dst_off[s] * p.row_bytes + lo,
         PeerAt<const char>(p, StagingOffset(p, par), s) + src_off[s] * p.row_bytes + lo, hi - lo);
  }
  Finish(p, e);
}

// Barrier, and the copy engine's first step: block 0's arrive words only.
__global__ void EnterKernel(Params p, int finish) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1);
  uint64_t* arrive = Words(p, p.layout.arrive, par, 0);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  if (finish) Finish(p, e);
}

// The copy engine's second step: this rank's input is in ce_staging.
__global__ void StagedKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1);
  uint64_t* staged = At<uint64_t>(p, p.layout.ce_staged);
  Post(p, staged, e, par);
  WaitAll(p, staged, e, par, "stage its input");
  Finish(p, e);
}

// A rejection of the next call, into every block's arrive words on every pe.
__global__ void RejectKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1);
  dev::Fence();
  const uint64_t w = MakeWord(e, kRejectedHash);
  for (int i = threadIdx.x; i < kMaxBlocks * p.world; i += blockDim.x) {
    uint64_t* words = Words(p, p.layout.arrive, par, i / p.world);
    dev::SignalSet(p.ctx, &words[p.me], w, i % p.world);
  }
  uint64_t* staged = At<uint64_t>(p, p.layout.ce_staged);
  const uint64_t header = (static_cast<uint64_t>(static_cast<uint32_t>(e)) << 32) | kRejectedHash;
  for (int s = threadIdx.x; s < p.world; s += blockDim.x) {
    dev::SignalSet(p.ctx, &staged[p.me], w, s);
    dev::SignalSet(p.ctx, At<uint64_t>(p, LLSlotOffset(p, par, p.me)), header, s);
  }
  Finish(p, e);
}

// ------------------------------------------------------------------ one_shot_ll

__device__ __forceinline__ void StoreRelaxed(uint64_t* addr, uint64_t value) {
  asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(addr), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t LoadRelaxed(const uint64_t* addr) {
  uint64_t value;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(value) : "l"(addr) : "memory");
  return value;
}

// Spins until packet `*addr` carries `flag` (bounded); returns it.
__device__ __forceinline__ uint64_t WaitPacket(const Params& p, const uint64_t* addr, uint32_t flag,
                                               int from, uint64_t e) {
  uint64_t v = LoadRelaxed(addr);
  if (static_cast<uint32_t>(v >> 32) == flag) return v;
  const uint64_t t0 = dev::GlobalTimerNs();
  while (static_cast<uint32_t>((v = LoadRelaxed(addr)) >> 32) != flag) {
    if (dev::GlobalTimerNs() - t0 > p.timeout_ns) {
      TrapTimeout(p, from, e, MakeWord(v >> 32, 0), "send its packets");
    }
  }
  return v;
}

// 32-bit word i of the input as elements of T (zero past `bytes`); element loads, so
// any T-aligned input works.
template <typename T>
__device__ __forceinline__ uint32_t LoadWord(const char* src, int64_t bytes, int64_t i) {
  if constexpr (sizeof(T) == 4) {
    return reinterpret_cast<const uint32_t*>(src)[i];
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
    const uint32_t lo = h[2 * i];
    const uint32_t hi = 4 * i + 2 < bytes ? h[2 * i + 1] : 0u;
    return lo | (hi << 16);
  }
}

template <typename T>
__device__ __forceinline__ T WordElem(uint32_t w, int k) {
  if constexpr (sizeof(T) == 4) {
    T v;
    memcpy(&v, &w, 4);
    return v;
  } else {
    const uint16_t bits = static_cast<uint16_t>(w >> (16 * k));
    T v;
    memcpy(&v, &bits, 2);
    return v;
  }
}

// One kernel: push this rank's words to every pe, check every pe's header, reduce the
// block's words as the peers' packets arrive (rank order, fp32, one rounding).
template <typename T, int Op>
__global__ void __launch_bounds__(kThreadsPerBlock) AllReduceLLKernel(Params p) {
  using E = Elem<T>;
  using Acc = typename E::Acc;
  constexpr int kPer = 4 / sizeof(T);
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), W = p.world;
  const uint32_t flag = static_cast<uint32_t>(e);
  const int64_t nw = (p.bytes + 3) / 4;
  const int64_t per = (nw + gridDim.x - 1) / gridDim.x;
  const int64_t wlo = min(nw, per * blockIdx.x), whi = min(nw, wlo + per);
  const size_t mine = LLSlotOffset(p, par, p.me);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *At<CallDesc>(p, DescOffset(p, par)) = p.desc;
    dev::Fence();
    for (int s = 0; s < W; ++s) {
      dev::StoreRelease(PeerAt<uint64_t>(p, mine, s),
                        (static_cast<uint64_t>(flag) << 32) | p.desc.hash);
    }
  }
  for (int64_t i = wlo + threadIdx.x; i < whi; i += blockDim.x) {
    const uint64_t pkt = (static_cast<uint64_t>(flag) << 32) | LoadWord<T>(p.src, p.bytes, i);
    for (int k = 0; k < W; ++k) {
      const int s = (p.me + k) % W;
      StoreRelaxed(PeerAt<uint64_t>(p, mine + 8 * (1 + i), s), pkt);
    }
  }
  // Every block checks every header before it writes a byte: calls that differ never mix.
  for (int s = threadIdx.x; s < W; s += blockDim.x) {
    const uint64_t* header = At<const uint64_t>(p, LLSlotOffset(p, par, s));
    uint64_t h = dev::LoadAcquire(header);
    if (static_cast<uint32_t>(h >> 32) != flag) {
      const uint64_t t0 = dev::GlobalTimerNs();
      while (static_cast<uint32_t>((h = dev::LoadAcquire(header)) >> 32) != flag) {
        if (dev::GlobalTimerNs() - t0 > p.timeout_ns) {
          TrapTimeout(p, s, e, MakeWord(h >> 32, 0), "arrive");
        }
      }
    }
    const uint32_t hash = static_cast<uint32_t>(h) & kHashMask;
    if (hash != p.desc.hash) TrapMismatch(p, s, e, par, MakeWord(e, hash));
  }
  __syncthreads();
  for (int64_t i = wlo + threadIdx.x; i < whi; i += blockDim.x) {
    Acc acc[kPer];
    for (int s = 0; s < W; ++s) {
      const uint64_t* pkt = At<const uint64_t>(p, LLSlotOffset(p, par, s) + 8 * (1 + i));
      const uint32_t w = static_cast<uint32_t>(WaitPacket(p, pkt, flag, s, e));
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const Acc v = E::Load(WordElem<T>(w, k));
        acc[k] = s == 0 ? First<Op, Acc>(v) : Combine<Op, Acc>(acc[k], v);
      }
    }
    T* out = reinterpret_cast<T*>(p.dst);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t el = i * kPer + k;
      if (el * static_cast<int64_t>(sizeof(T)) < p.bytes) out[el] = E::Store(acc[k]);
    }
  }
  Finish(p, e);
}

template <typename T>
const void* LLKernelByOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return reinterpret_cast<const void*>(&AllReduceLLKernel<T, 0>);
    case ReduceOp::kMax:
      return reinterpret_cast<const void*>(&AllReduceLLKernel<T, 1>);
    case ReduceOp::kMin:
      return reinterpret_cast<const void*>(&AllReduceLLKernel<T, 2>);
  }
  MORI_THROW(InvalidArgumentError, "unknown reduce op code ", static_cast<int>(op));
}

const void* LLKernelFor(DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kFloat32:
      return LLKernelByOp<float>(op);
    case DataType::kBFloat16:
      return LLKernelByOp<__nv_bfloat16>(op);
    case DataType::kFloat16:
      return LLKernelByOp<__half>(op);
    case DataType::kInt32:
      return LLKernelByOp<int32_t>(op);
    default:
      break;
  }
  MORI_THROW(InvalidArgumentError, "the CUDA collectives reduce float32, bfloat16, float16 and ",
             "int32, not ", DataTypeName(dtype));
}

template <int Kind, typename T>
const void* ReduceKernelByOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return reinterpret_cast<const void*>(&ReduceKernel<Kind, T, 0>);
    case ReduceOp::kMax:
      return reinterpret_cast<const void*>(&ReduceKernel<Kind, T, 1>);
    case ReduceOp::kMin:
      return reinterpret_cast<const void*>(&ReduceKernel<Kind, T, 2>);
  }
  MORI_THROW(InvalidArgumentError, "unknown reduce op code ", static_cast<int>(op));
}

template <int Kind>
const void* ReduceKernelFor(DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kFloat32:
      return ReduceKernelByOp<Kind, float>(op);
    case DataType::kBFloat16:
      return ReduceKernelByOp<Kind, __nv_bfloat16>(op);
    case DataType::kFloat16:
      return ReduceKernelByOp<Kind, __half>(op);
    case DataType::kInt32:
      return ReduceKernelByOp<Kind, int32_t>(op);
    default:
      break;
  }
  MORI_THROW(InvalidArgumentError, "the CUDA collectives reduce float32, bfloat16, float16 and ",
             "int32, not ", DataTypeName(dtype));
}

}  // namespace

struct CommunicatorCuda::Launch {
  const void* kernel;
  int blocks;
  int threads;
  Params params;
};

CommunicatorCuda::CommunicatorCuda(void* block, size_t max_bytes, int device,
                                   std::chrono::milliseconds timeout, int max_blocks)
    : block_(static_cast<char*>(block)),
      max_bytes_(max_bytes),
      device_(device),
      timeout_ns_(static_cast<uint64_t>(timeout.count()) * 1000000ull),
      max_blocks_(max_blocks) {
  ctx_ = shmem::GetDeviceContext();
  world_ = ctx_.n_pes;
  me_ = ctx_.my_pe;
  layout_ = MakeCudaLayout(world_, max_bytes);
  if (world_ > kMaxCudaWorld) {
    MORI_THROW(NotSupportedError, "the CUDA collectives take world sizes up to ", kMaxCudaWorld,
               ", got ", world_);
  }
  MORI_CHECK_ARG(max_blocks >= 1 && max_blocks <= kMaxBlocks, "max_blocks ", max_blocks,
                 " must be in [1, ", kMaxBlocks, "]");
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the communicator's buffer is not a symmetric block of ", layout_.total_bytes,
                 " bytes");
  for (int pe = 0; pe < world_; ++pe) {
    if (shmem::Ptr(block, pe) == nullptr) {
      MORI_THROW(NotSupportedError, "the CUDA collectives need every pe on this node, but pe ", pe,
                 " is not load/store reachable from pe ", me_);
    }
  }
  mori::cuda::ScopedDevice guard(device_);
  MORI_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  MORI_CUDA_CHECK(cudaMemset(block_, 0, CudaSignalBytes(layout_)));
  // Packets of flag 0 never match a call (calls count from 1).
  MORI_CUDA_CHECK(cudaMemset(block_ + layout_.ll, 0, layout_.total_bytes - layout_.ll));
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  shmem::BarrierAll();
}

int CommunicatorCuda::BlocksFor(int64_t bytes, int max_blocks) const {
  int cap = max_blocks > 0 ? std::min(max_blocks, kMaxBlocks) : max_blocks_;
  cap = std::max(1, std::min(cap, sm_count_ > 0 ? sm_count_ : cap));
  const int64_t want = (bytes + kBytesPerBlock - 1) / kBytesPerBlock;
  return static_cast<int>(std::clamp<int64_t>(want, 1, cap));
}

CallDesc CommunicatorCuda::Describe(CollectiveKind kind, DataType dtype, int op,
                                    CudaAlgorithm algorithm, int root, int blocks, int64_t bytes,
                                    int64_t row_bytes) const {
  CallDesc d{};
  d.kind = static_cast<int32_t>(kind);
  d.dtype = kind == CollectiveKind::kBarrier ? -1 : static_cast<int32_t>(dtype);
  d.op = op;
  d.algorithm = kind == CollectiveKind::kBarrier ? -1 : static_cast<int32_t>(algorithm);
  d.root = root;
  d.blocks = blocks;
  d.bytes = bytes;
  d.row_bytes = row_bytes;
  d.hash = DescHash(d);
  return d;
}

void CommunicatorCuda::Enqueue(Launch& l, uintptr_t stream) {
  l.params.ctx = ctx_;
  l.params.block = block_;
  l.params.layout = layout_;
  l.params.world = world_;
  l.params.me = me_;
  l.params.timeout_ns = timeout_ns_;
  void* args[] = {&l.params};
  MORI_CUDA_CHECK(cudaLaunchKernel(l.kernel, dim3(l.blocks), dim3(l.threads), args, 0,
                                   reinterpret_cast<cudaStream_t>(stream)));
  MORI_CUDA_CHECK(cudaGetLastError());
  ++calls_;
}

void CommunicatorCuda::AllReduce(const void* src, void* dst, size_t count, DataType dtype,
                                 ReduceOp op, CudaAlgorithm algorithm, int max_blocks,
                                 uintptr_t stream) {
  const int64_t bytes = static_cast<int64_t>(count * DataTypeSize(dtype));
  if (static_cast<size_t>(bytes) > max_bytes_) {
    Reject(StrCat("all_reduce of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  MORI_CHECK_ARG(algorithm == CudaAlgorithm::kOneShot || algorithm == CudaAlgorithm::kTwoShot ||
                     algorithm == CudaAlgorithm::kOneShotLL,
                 "all_reduce algorithm code ", static_cast<int>(algorithm));
  if (algorithm == CudaAlgorithm::kOneShotLL && static_cast<size_t>(bytes) > ll_max_bytes()) {
    Reject(StrCat("one_shot_ll all_reduce of ", bytes, " bytes exceeds its ", ll_max_bytes()),
           stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  Launch l{};
  l.blocks = BlocksFor(bytes, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = algorithm == CudaAlgorithm::kOneShot   ? ReduceKernelFor<kOneShotKernel>(dtype, op)
             : algorithm == CudaAlgorithm::kTwoShot ? ReduceKernelFor<kTwoShotKernel>(dtype, op)
                                                    : LLKernelFor(dtype, op);
  l.params.desc = Describe(CollectiveKind::kAllReduce, dtype, static_cast<int>(op), algorithm, -1,
                           l.blocks, bytes, 0);
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = bytes;
  Enqueue(l, stream);
}

void CommunicatorCuda::ReduceScatter(const void* src, void* dst, size_t count, DataType dtype,
                                     ReduceOp op, int max_blocks, uintptr_t stream) {
  const int64_t bytes = static_cast<int64_t>(count * DataTypeSize(dtype)) * world_;
  if (static_cast<size_t>(bytes) > max_bytes_) {
    Reject(StrCat("reduce_scatter of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  Launch l{};
  l.blocks = BlocksFor(bytes / world_, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = ReduceKernelFor<kReduceScatterKernel>(dtype, op);
  l.params.desc = Describe(CollectiveKind::kReduceScatter, dtype, static_cast<int>(op),
                           CudaAlgorithm::kSm, -1, l.blocks, bytes, 0);
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = bytes;
  Enqueue(l, stream);
}

void CommunicatorCuda::CopyEngineCall(const CallDesc& desc, const void* src, size_t bytes,
                                      void* dst, size_t chunk_bytes, bool all_to_all,
                                      uintptr_t stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  Launch enter{};
  enter.kernel = reinterpret_cast<const void*>(&EnterKernel);
  enter.blocks = 1;
  enter.threads = 32;
  enter.params.desc = desc;
  enter.params.ctx = ctx_;
  enter.params.block = block_;
  enter.params.layout = layout_;
  enter.params.world = world_;
  enter.params.me = me_;
  enter.params.timeout_ns = timeout_ns_;
  int finish = 0;
  void* enter_args[] = {&enter.params, &finish};
  MORI_CUDA_CHECK(cudaLaunchKernel(enter.kernel, dim3(1), dim3(32), enter_args, 0, s));
  MORI_CUDA_CHECK(cudaGetLastError());
  char* staging = block_ + layout_.ce_staging;
  if (bytes > 0) {
    MORI_CUDA_CHECK(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToDevice, s));
  }
  void* staged_args[] = {&enter.params};
  MORI_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&StagedKernel), dim3(1), dim3(32),
                                   staged_args, 0, s));
  MORI_CUDA_CHECK(cudaGetLastError());
  char* out = static_cast<char*>(dst);
  for (int k = 0; k < world_; ++k) {
    const int pe = (me_ + k) % world_;
    const char* peer = static_cast<const char*>(shmem::Ptr(staging, pe));
    const size_t from = all_to_all ? static_cast<size_t>(me_) * chunk_bytes : 0;
    if (chunk_bytes > 0) {
      MORI_CUDA_CHECK(cudaMemcpyAsync(out + static_cast<size_t>(pe) * chunk_bytes, peer + from,
                                      chunk_bytes, cudaMemcpyDefault, s));
    }
  }
  ++calls_;
}

void CommunicatorCuda::AllGather(const void* src, void* dst, size_t bytes, DataType dtype,
                                 CudaAlgorithm algorithm, int max_blocks, uintptr_t stream) {
  if (bytes > max_bytes_) {
    Reject(StrCat("all_gather of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  const int64_t b = static_cast<int64_t>(bytes);
  if (algorithm == CudaAlgorithm::kCopyEngine) {
    const CallDesc d = Describe(CollectiveKind::kAllGather, dtype, -1, algorithm, -1, 1, b, 0);
    CopyEngineCall(d, src, bytes, dst, bytes, false, stream);
    return;
  }
  Launch l{};
  l.blocks = BlocksFor(b, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = reinterpret_cast<const void*>(&AllGatherKernel);
  l.params.desc =
      Describe(CollectiveKind::kAllGather, dtype, -1, CudaAlgorithm::kSm, -1, l.blocks, b, 0);
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = b;
  Enqueue(l, stream);
}

void CommunicatorCuda::AllToAll(const void* src, void* dst, size_t row_bytes, int64_t src_rows,
                                int64_t dst_rows, const int64_t* in_splits,
                                const int64_t* out_splits, DataType dtype, CudaAlgorithm algorithm,
                                int max_blocks, uintptr_t stream) {
  const size_t bytes = static_cast<size_t>(src_rows) * row_bytes;
  if (bytes > max_bytes_) {
    Reject(StrCat("all_to_all of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  const int64_t rb = static_cast<int64_t>(row_bytes);
  if (algorithm == CudaAlgorithm::kCopyEngine) {
    MORI_CHECK_ARG(in_splits == nullptr && out_splits == nullptr && src_rows % world_ == 0 &&
                       dst_rows == src_rows,
                   "the copy-engine all_to_all takes equal splits only");
    const CallDesc d = Describe(CollectiveKind::kAllToAll, dtype, -1, algorithm, -1, 1,
                                static_cast<int64_t>(bytes), rb);
    CopyEngineCall(d, src, bytes, dst, bytes / world_, true, stream);
    return;
  }
  Launch l{};
  // Ranks of an all-to-all-v move different byte counts: the grid comes from the
  // bound alone, so that every rank launches the same one.
  l.blocks = BlocksFor(static_cast<int64_t>(kMaxBlocks) * kBytesPerBlock, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = reinterpret_cast<const void*>(&AllToAllKernel);
  l.params.desc =
      Describe(CollectiveKind::kAllToAll, dtype, -1, CudaAlgorithm::kSm, -1, l.blocks, -1, rb);
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = static_cast<int64_t>(bytes);
  l.params.row_bytes = rb;
  l.params.src_rows = src_rows;
  l.params.dst_rows = dst_rows;
  l.params.in_splits = in_splits;
  l.params.out_splits = out_splits;
  Enqueue(l, stream);
}

void CommunicatorCuda::Broadcast(void* buf, size_t bytes, DataType dtype, int root, int max_blocks,
                                 uintptr_t stream) {
  if (bytes > max_bytes_) {
    Reject(StrCat("broadcast of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  if (root < 0 || root >= world_) {
    Reject(StrCat("broadcast src ", root, " out of range [0, ", world_, ")"), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  Launch l{};
  const int64_t b = static_cast<int64_t>(bytes);
  l.blocks = BlocksFor(b, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = reinterpret_cast<const void*>(&BroadcastKernel);
  l.params.desc =
      Describe(CollectiveKind::kBroadcast, dtype, -1, CudaAlgorithm::kSm, root, l.blocks, b, 0);
  l.params.src = static_cast<const char*>(buf);
  l.params.dst = static_cast<char*>(buf);
  l.params.bytes = b;
  l.params.root = root;
  Enqueue(l, stream);
}

void CommunicatorCuda::Barrier(uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  Params p{};
  p.desc =
      Describe(CollectiveKind::kBarrier, DataType::kFloat32, -1, CudaAlgorithm::kSm, -1, 1, 0, 0);
  p.ctx = ctx_;
  p.block = block_;
  p.layout = layout_;
  p.world = world_;
  p.me = me_;
  p.timeout_ns = timeout_ns_;
  int finish = 1;
  void* args[] = {&p, &finish};
  MORI_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&EnterKernel), dim3(1), dim3(32),
                                   args, 0, reinterpret_cast<cudaStream_t>(stream)));
  MORI_CUDA_CHECK(cudaGetLastError());
  ++calls_;
}

void CommunicatorCuda::Reject(const std::string& reason, uintptr_t stream) {
  {
    mori::cuda::ScopedDevice guard(device_);
    Launch l{};
    l.kernel = reinterpret_cast<const void*>(&RejectKernel);
    l.blocks = 1;
    l.threads = 256;
    Enqueue(l, stream);
  }
  throw InvalidArgumentError(reason);
}

}  // namespace mori::ccl
