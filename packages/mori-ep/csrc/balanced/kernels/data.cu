// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The balanced mode's data-path kernels on a CUDA heap (load/store over NVLink P2P),
// the same operations, in the same order and with the same arithmetic, as BalancedCpu
// (balanced/cpu.cpp): the verdict exchange, the stage barrier, dispatch's row writes,
// the duplicate groups, expansion and pad zeroing, combine's duplicate sums and gather,
// prefetch's pushes and reduce_grad's ascending sums. A lost rank traps naming it and
// the stage (common/peer_wait.cuh); a refusing peer traps naming it.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "balanced/cpu.hpp"  // VerdictWord, CallKindName
#include "balanced/kernels/params.hpp"
#include "common/launch_api.hpp"
#include "common/numeric.hpp"
#include "common/peer_wait.cuh"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/device.cuh"

namespace mori::ep::balanced {
namespace {

namespace dev = mori::shmem::device;

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;

// Names for the traps' messages (device literals: a host string cannot be printed).
__device__ const char* OpName(int op) {
  switch (op) {
    case kOpDispatch:
      return "dispatch";
    case kOpCombine:
      return "combine";
    case kOpPrefetch:
      return "prefetch_weight";
    default:
      return "reduce_grad";
  }
}

__device__ const char* StageName(int stage) {
  switch (stage) {
    case kStageRowsWritten:
      return "rows written";
    case kStageDuplicatesSummed:
      return "duplicates summed";
    case kStageWeightsWritten:
      return "weights written";
    default:
      return "slots read";
  }
}

__device__ __forceinline__ int64_t Raw(int32_t v) {
  return v >= 0 ? v : -static_cast<int64_t>(v) - 1;
}

// Verdicts: post VerdictWord(call, kind, refused) to every rank, then (unless only
// posting) wait for every rank's and trap naming a refusing rank or one whose call
// differs. tpe (or null) is first written into every rank's counts row of this rank.
__global__ void EntryKernel(Common c, uint64_t call, uint32_t kind, bool refused, bool post_only,
                            const int32_t* tpe, int op_code) {
  const char* op = OpName(op_code);
  const int R = c.shape.ranks, E = c.shape.experts;
  if (tpe != nullptr) {
    for (int pe = 0; pe < R; ++pe) {
      int32_t* row = dev::Ptr(c.ctx, c.counts, pe) + static_cast<int64_t>(c.rank) * E;
      for (int e = threadIdx.x; e < E; e += blockDim.x) row[e] = tpe[e];
    }
    dev::Fence();
  }
  __syncthreads();
  uint64_t* words = c.entry + (call & 1) * R;
  const uint32_t mine = refused ? kAny : kind;
  for (int pe = threadIdx.x; pe < R; pe += blockDim.x) {
    dev::SignalSet(c.ctx, &words[c.rank], VerdictWord(call, mine, refused), pe);
  }
  if (post_only) return;
  for (int s = threadIdx.x; s < R; s += blockDim.x) {
    const uint64_t w = WaitPeerWord(&words[s], VerdictWord(call, 0, false), c.timeout_ns, c.rank, s,
                                    op, call, "entry", 4);
    const uint32_t k = static_cast<uint32_t>((w >> 1) & 7);
    if (w & 1) {
      printf(
          "mori.ep balanced %s (call %llu) on rank %d: rank %d refused its inputs (its "
          "error names the value)\n",
          op, static_cast<unsigned long long>(call), c.rank, s);
      dev::Trap();
    }
    if (k != mine) {
      printf("mori.ep balanced call %llu on rank %d: this rank called %s but rank %d called %s\n",
             static_cast<unsigned long long>(call), c.rank, CallKindName(mine), s, CallKindName(k));
      dev::Trap();
    }
  }
}

__global__ void BarrierKernel(Common c, uint64_t n, uint64_t call, int op_code, int stage_code) {
  const char* op = OpName(op_code);
  const char* stage = StageName(stage_code);
  const int R = c.shape.ranks;
  dev::Fence();
  __syncthreads();
  for (int pe = threadIdx.x; pe < R; pe += blockDim.x)
    dev::SignalSet(c.ctx, &c.phase[c.rank], n, pe);
  for (int s = threadIdx.x; s < R; s += blockDim.x) {
    WaitPeerWord(&c.phase[s], n, c.timeout_ns, c.rank, s, op, call, stage, 0);
  }
}

__global__ void PlannerErrorKernel(const int32_t* error, int rank) {
  if (threadIdx.x == 0 && error[0] != 0) {
    printf(
        "mori.ep balanced dispatch on rank %d: the planner refused the inputs (code %d: "
        "%d, %d; 1 row sum, 2 expert id, 3 counts differ from topk, 4 invariant, 5 stalled)\n",
        rank, error[0], error[1], error[2]);
    dev::Trap();
  }
}

// A warp per (token, k) pair.
__global__ void __launch_bounds__(kThreads)
    DispatchKernel(Common c, DevicePlan p, const uint16_t* hidden, int64_t row_stride,
                   const float* weights, bool fresh) {
  const int K = c.shape.top_k, lane = threadIdx.x & 31;
  const int64_t pairs = c.shape.capacity(), nvs = c.shape.nvs(), H = c.hidden;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t i = warp0; i < pairs; i += nwarps) {
    const int32_t v = p.dst[i];
    const int64_t raw = Raw(v), slot = raw % nvs;
    const int d = static_cast<int>(raw / nvs);
    const int64_t t = i / K;
    if (v >= 0) {
      dev::PutWarp_nbi(c.ctx, c.shard + slot * H, hidden + t * row_stride, H * 2, d);
    } else if (fresh && lane == 0) {
      int32_t primary = -1;
      for (int64_t j = t * K; j < i && primary < 0; ++j) {
        if (p.dst[j] >= 0 && p.dst[j] / nvs == d) primary = static_cast<int32_t>(p.dst[j] % nvs);
      }
      *dev::Ptr(c.ctx, c.dup_src + slot, d) = primary;
    }
    if (weights != nullptr && lane == 0) *dev::Ptr(c.ctx, c.weights + slot, d) = weights[i];
  }
  // The next kernel's barrier signals the peers: these stores are performed first.
  dev::Fence();
}

// One block: the duplicate groups of dup_src (ascending primary; duplicates ascending).
// scratch: [2, NvS] int32 zeroed by the caller.
__global__ void DupGroupsKernel(Common c, DevicePlan p, int32_t* scratch) {
  const int64_t nvs = c.shape.nvs();
  int32_t* per = scratch;          // duplicates per primary
  int32_t* first = scratch + nvs;  // group start, then the fill cursor
  __shared__ int32_t carry[2];
  __shared__ int32_t warp_sum[2][32];
  for (int64_t s = threadIdx.x; s < nvs; s += blockDim.x) {
    if (c.dup_src[s] >= 0) atomicAdd(&per[c.dup_src[s]], 1);
  }
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t base = 0; base < nvs; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    const int32_t n = s < nvs ? per[s] : 0;
    int32_t a = n > 0 ? 1 : 0, b = n;  // inclusive scans of (group, duplicates)
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t xa = __shfl_up_sync(0xffffffffu, a, o), xb = __shfl_up_sync(0xffffffffu, b, o);
      if (lane >= o) {
        a += xa;
        b += xb;
      }
    }
    if (lane == 31) {
      warp_sum[0][warp] = a;
      warp_sum[1][warp] = b;
    }
    __syncthreads();
    int32_t pa = carry[0], pb = carry[1];
    for (int w = 0; w < warp; ++w) {
      pa += warp_sum[0][w];
      pb += warp_sum[1][w];
    }
    if (n > 0) {
      const int32_t g = pa + a - 1, start = pb + b - n;
      p.dup_groups[3 * g] = static_cast<int32_t>(s);
      p.dup_groups[3 * g + 1] = start;
      p.dup_groups[3 * g + 2] = n;
      first[s] = start;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < warps; ++w) {
        carry[0] += warp_sum[0][w];
        carry[1] += warp_sum[1][w];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    p.dup_counts[0] = carry[0];
    p.dup_counts[1] = carry[1];
  }
  for (int64_t s = threadIdx.x; s < nvs; s += blockDim.x) {
    const int32_t q = c.dup_src[s];
    if (q >= 0) p.dup_loffs[atomicAdd(&first[q], 1)] = static_cast<int32_t>(s);
  }
  __syncthreads();
  // Each group's few duplicates (< K) into ascending slot order.
  for (int32_t g = threadIdx.x; g < carry[0]; g += blockDim.x) {
    int32_t* l = p.dup_loffs + p.dup_groups[3 * g + 1];
    const int32_t n = p.dup_groups[3 * g + 2];
    for (int32_t x = 1; x < n; ++x) {
      const int32_t v = l[x];
      int32_t y = x - 1;
      for (; y >= 0 && l[y] > v; --y) l[y + 1] = l[y];
      l[y + 1] = v;
    }
  }
}

// A warp per duplicate group (copy the primary row) and per group of the layout (zero
// its pad rows).
__global__ void __launch_bounds__(kThreads) ExpandZeroKernel(Common c, DevicePlan p) {
  const int64_t H = c.hidden, epn = c.shape.epn();
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int32_t groups = p.dup_counts[0];
  for (int64_t g = warp0; g < groups; g += nwarps) {
    const int32_t* grp = p.dup_groups + 3 * g;
    for (int32_t j = 0; j < grp[2]; ++j) {
      dev::detail::CopyBytes(c.shard + static_cast<int64_t>(p.dup_loffs[grp[1] + j]) * H,
                             c.shard + static_cast<int64_t>(grp[0]) * H, H * 2, lane, 32);
    }
  }
  for (int64_t g = warp0; g < 2 * epn; g += nwarps) {
    const int64_t first = p.zero_fill[2 * g], rows = p.zero_fill[2 * g + 1];
    uint16_t* z = c.shard + first * H;
    for (int64_t x = lane; x < rows * H; x += 32) z[x] = 0;
  }
}

// A warp per duplicate group: primary + duplicates (ascending slot) in fp32 from
// kSumStart, rounded once into the primary.
__global__ void __launch_bounds__(kThreads) CombinePrologueKernel(Common c, DevicePlan p) {
  const int64_t H = c.hidden;
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int32_t groups = p.dup_counts[0];
  for (int64_t g = warp0; g < groups; g += nwarps) {
    const int32_t* grp = p.dup_groups + 3 * g;
    uint16_t* primary = c.shard + static_cast<int64_t>(grp[0]) * H;
    for (int64_t h = lane; h < H; h += 32) {
      float acc = kSumStart + Bf16BitsToFloat(primary[h]);
      for (int32_t j = 0; j < grp[2]; ++j) {
        acc += Bf16BitsToFloat(c.shard[static_cast<int64_t>(p.dup_loffs[grp[1] + j]) * H + h]);
      }
      primary[h] = FloatToBf16Bits(acc);
    }
  }
}

// A block per token: its primary rows (k order) summed in fp32 from kSumStart, rounded
// once (one row: its bits); each pair's weight gathered.
__global__ void __launch_bounds__(kThreads)
    CombineGatherKernel(Common c, DevicePlan p, uint16_t* out, float* out_w) {
  const int K = c.shape.top_k;
  const int64_t nvs = c.shape.nvs(), H = c.hidden;
  for (int64_t t = blockIdx.x; t < c.shape.tokens; t += gridDim.x) {
    const int32_t* row = p.dst + t * K;
    int parts = 0;
    for (int k = 0; k < K; ++k) parts += row[k] >= 0;
    if (out_w != nullptr) {
      for (int k = threadIdx.x; k < K; k += blockDim.x) {
        const int64_t raw = Raw(row[k]);
        out_w[t * K + k] = *dev::Ptr(c.ctx, c.weights + raw % nvs, static_cast<int>(raw / nvs));
      }
    }
    if (H % 8 == 0) {
      // 16-byte words of 8 columns (rows are 16-byte aligned when H % 8 == 0).
      for (int64_t v = threadIdx.x; v < H / 8; v += blockDim.x) {
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = kSumStart;
        uint4 only{};
        for (int k = 0; k < K; ++k) {
          if (row[k] < 0) continue;
          const uint16_t* src = dev::Ptr(c.ctx, c.shard, static_cast<int>(row[k] / nvs));
          const uint4 w = reinterpret_cast<const uint4*>(src + (row[k] % nvs) * H)[v];
          only = w;
          const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc[2 * j] += Bf16BitsToFloat(static_cast<uint16_t>(words[j] & 0xffffu));
            acc[2 * j + 1] += Bf16BitsToFloat(static_cast<uint16_t>(words[j] >> 16));
          }
        }
        uint4 res = only;
        if (parts != 1) {
          uint32_t words[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            words[j] = static_cast<uint32_t>(FloatToBf16Bits(acc[2 * j])) |
                       (static_cast<uint32_t>(FloatToBf16Bits(acc[2 * j + 1])) << 16);
          }
          res = uint4{words[0], words[1], words[2], words[3]};
        }
        reinterpret_cast<uint4*>(out + t * H)[v] = res;
      }
      continue;
    }
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      float acc = kSumStart;
      uint16_t only = 0;
      for (int k = 0; k < K; ++k) {
        if (row[k] < 0) continue;
        const uint16_t v =
            dev::Ptr(c.ctx, c.shard, static_cast<int>(row[k] / nvs))[(row[k] % nvs) * H + h];
        only = v;
        acc += Bf16BitsToFloat(v);
      }
      out[t * H + h] = parts == 1 ? only : FloatToBf16Bits(acc);
    }
  }
}

// The owner writes its expert into rank d's slot b, in chunks of kPrefetchChunk bytes:
// a block per (slot, pool, chunk), so that a few large slots still spread over the
// GPU (a block per slot leaves all but a few SMs idle). Chunks start at multiples of
// 256 KiB from the slot's start, so each keeps the slot's alignment.
constexpr int64_t kPrefetchChunk = 256 << 10;

__global__ void __launch_bounds__(kThreads)
    PrefetchKernel(Common c, const int32_t* copy, PoolArgs a, int64_t chunks) {
  const int R = c.shape.ranks, epn = c.shape.epn();
  const int64_t jobs = static_cast<int64_t>(R) * epn * a.n * chunks;
  for (int64_t j = blockIdx.x; j < jobs; j += gridDim.x) {
    const int64_t part = j % chunks;
    const int i = static_cast<int>((j / chunks) % a.n);
    const int64_t slot = j / chunks / a.n;  // d * epn + b
    const int32_t e = copy[slot];
    const int64_t first = part * kPrefetchChunk;
    if (e < 0 || e / epn != c.rank || first >= a.bytes[i]) continue;
    const int64_t n = a.bytes[i] - first < kPrefetchChunk ? a.bytes[i] - first : kPrefetchChunk;
    const int d = static_cast<int>(slot / epn);
    char* dst = dev::Ptr(c.ctx, a.pools[i] + slot * a.bytes[i] + first, d);
    dev::detail::CopyBytes(dst, a.locals[i] + static_cast<int64_t>(e % epn) * a.bytes[i] + first, n,
                           threadIdx.x, blockDim.x);
  }
  dev::Fence();
}

// A block per (pool, local expert, tile of kReduceTile elements): warp 0 lists the
// slots holding the expert in ascending (rank, slot) order (a ballot per 32 slots),
// then every thread adds those slots' values to its elements of the fp32 local
// gradient in that order: the same sums, in the same order, as scanning every slot
// for every element, without the R * epn comparisons per element. A list longer than
// kHeldMax (not produced by the planner: a rank holds an expert at most once) falls
// back to that scan.
constexpr int64_t kReduceTile = 64 << 10;
constexpr int kHeldMax = 1024;

__global__ void __launch_bounds__(kThreads)
    ReduceGradKernel(Common c, const int32_t* copy, PoolArgs a, int64_t tiles) {
  __shared__ int32_t held[kHeldMax];
  __shared__ int held_n;
  const int epn = c.shape.epn();
  const int64_t slots = static_cast<int64_t>(c.shape.ranks) * epn;
  const int64_t jobs = static_cast<int64_t>(a.n) * epn * tiles;
  for (int64_t j = blockIdx.x; j < jobs; j += gridDim.x) {
    const int64_t part = j % tiles;
    const int le = static_cast<int>((j / tiles) % epn);
    const int i = static_cast<int>(j / tiles / epn);
    const int64_t elems = a.bytes[i], first = part * kReduceTile;
    if (first >= elems) continue;  // the same for the whole block
    const int32_t e = c.rank * epn + le;
    if (threadIdx.x < 32) {
      const unsigned lane = threadIdx.x;
      int n = 0;
      for (int64_t base = 0; base < slots; base += 32) {
        const bool hit = base + lane < slots && copy[base + lane] == e;
        const unsigned mask = __ballot_sync(0xffffffffu, hit);
        const int at = n + __popc(mask & ((1u << lane) - 1u));
        if (hit && at < kHeldMax) held[at] = static_cast<int32_t>(base + lane);
        n += __popc(mask);
      }
      if (lane == 0) held_n = n;
    }
    __syncthreads();
    const int n = held_n;
    const float* pools = reinterpret_cast<const float*>(a.pools[i]);
    float* local = reinterpret_cast<float*>(const_cast<char*>(a.locals[i])) + le * elems;
    const int64_t last = elems - first < kReduceTile ? elems : first + kReduceTile;
    for (int64_t off = first + threadIdx.x; off < last; off += blockDim.x) {
      float acc = local[off];
      if (n <= kHeldMax) {
        for (int h = 0; h < n; ++h) {
          const int64_t slot = held[h];
          acc += dev::Ptr(c.ctx, pools + slot * elems, static_cast<int>(slot / epn))[off];
        }
      } else {
        for (int64_t slot = 0; slot < slots; ++slot) {
          if (copy[slot] != e) continue;
          acc += dev::Ptr(c.ctx, pools + slot * elems, static_cast<int>(slot / epn))[off];
        }
      }
      local[off] = acc;
    }
    __syncthreads();  // the next job rewrites held
  }
}

__global__ void __launch_bounds__(kThreads)
    ZeroSlotsKernel(Common c, const int32_t* copy, PoolArgs a) {
  const int epn = c.shape.epn();
  for (int i = 0; i < a.n; ++i) {
    const int64_t elems = a.bytes[i];
    float* mine = reinterpret_cast<float*>(a.pools[i]) + static_cast<int64_t>(c.rank) * epn * elems;
    for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < epn * elems;
         x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      if (copy[c.rank * epn + x / elems] >= 0) mine[x] = 0.0f;
    }
  }
}

cudaStream_t S(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

int Blocks(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return static_cast<int>(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}

}  // namespace

void LaunchEntry(const Common& c, uint64_t call, uint32_t kind, bool refused, bool post_only,
                 const int32_t* tpe, int op, uintptr_t stream) {
  EntryKernel<<<1, 256, 0, S(stream)>>>(c, call, kind, refused, post_only, tpe, op);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchBarrier(const Common& c, uint64_t n, uint64_t call, int op, int stage,
                   uintptr_t stream) {
  BarrierKernel<<<1, 64, 0, S(stream)>>>(c, n, call, op, stage);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchPlannerCheck(const int32_t* error, int rank, uintptr_t stream) {
  PlannerErrorKernel<<<1, 32, 0, S(stream)>>>(error, rank);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchDispatchRows(const Common& c, const DevicePlan& p, const uint16_t* hidden,
                        int64_t row_stride, const float* weights, bool fresh, uintptr_t stream) {
  DispatchKernel<<<Blocks(c.shape.capacity(), kWarps), kThreads, 0, S(stream)>>>(
      c, p, hidden, row_stride, weights, fresh);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchDupGroups(const Common& c, const DevicePlan& p, int32_t* scratch, uintptr_t stream) {
  MORI_CUDA_CHECK(cudaMemsetAsync(scratch, 0, sizeof(int32_t) * 2 * c.shape.nvs(), S(stream)));
  DupGroupsKernel<<<1, 1024, 0, S(stream)>>>(c, p, scratch);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchExpandZero(const Common& c, const DevicePlan& p, uintptr_t stream) {
  ExpandZeroKernel<<<Blocks(c.shape.capacity(), kWarps), kThreads, 0, S(stream)>>>(c, p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchCombine(const Common& c, const DevicePlan& p, uint16_t* out, float* out_w, uint64_t n,
                   uint64_t call, uintptr_t stream) {
  CombinePrologueKernel<<<Blocks(c.shape.capacity(), kWarps), kThreads, 0, S(stream)>>>(c, p);
  MORI_CUDA_CHECK(cudaGetLastError());
  LaunchBarrier(c, n, call, kOpCombine, kStageDuplicatesSummed, stream);
  CombineGatherKernel<<<Blocks(c.shape.tokens, 1), kThreads, 0, S(stream)>>>(c, p, out, out_w);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchPrefetch(const Common& c, const int32_t* copy, const PoolArgs& a, uintptr_t stream) {
  int64_t most = 0;
  for (int i = 0; i < a.n; ++i) most = a.bytes[i] > most ? a.bytes[i] : most;
  const int64_t chunks = most < 1 ? 1 : (most + kPrefetchChunk - 1) / kPrefetchChunk;
  const int64_t jobs = static_cast<int64_t>(c.shape.ranks) * c.shape.epn() * a.n * chunks;
  PrefetchKernel<<<Blocks(jobs, 1), kThreads, 0, S(stream)>>>(c, copy, a, chunks);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchReduceGrad(const Common& c, const int32_t* copy, const PoolArgs& a, uint64_t n,
                      uint64_t call, uintptr_t stream) {
  int64_t most = 0;
  for (int i = 0; i < a.n; ++i) most = a.bytes[i] > most ? a.bytes[i] : most;
  const int blocks = Blocks(most * c.shape.epn(), kThreads);
  const int64_t tiles = most < 1 ? 1 : (most + kReduceTile - 1) / kReduceTile;
  ReduceGradKernel<<<Blocks(static_cast<int64_t>(a.n) * c.shape.epn() * tiles, 1), kThreads, 0,
                     S(stream)>>>(c, copy, a, tiles);
  MORI_CUDA_CHECK(cudaGetLastError());
  LaunchBarrier(c, n, call, kOpReduceGrad, kStageSlotsRead, stream);
  ZeroSlotsKernel<<<blocks, kThreads, 0, S(stream)>>>(c, copy, a);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::balanced
