// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The balanced planner as one CUDA launch (balanced/planner.hpp states the algorithm;
// the CPU planner, balanced/planner.cpp, is the reference it must equal table for
// table). No multicast and no grid barrier: every block plans steps 1-3 redundantly in
// shared memory from the gathered counts (a few KiB), block 0 writes the tables, and
// each block then places the pairs of its own tokens (step 4). A block's pairs need
// the number of earlier pairs per expert: the block counts the pairs before its range
// itself (warp-aggregated shared atomics), so blocks never wait for one another.
//
// Designed for R = 8, E = 384, S = 8192, K = 8 within 20 us on an H200: 64 blocks of
// 1024 threads; the sequential part (step 2's greedy, <= epn + R rounds per home, one
// warp per home) costs two warp reductions (redux.sync) a round.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "balanced/planner.hpp"
#include "common/launch_api.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"

namespace mori::ep::balanced {
namespace {

constexpr int kThreads = 1024;
constexpr unsigned kFull = 0xffffffffu;

// The first index of the largest (kMax) or smallest value of v[0, n), over one warp.
template <bool kMax>
__device__ __forceinline__ void WarpArgBest(const int32_t* v, int n, int32_t& best, int& index) {
  const int lane = threadIdx.x & 31;
  int32_t bv = kMax ? INT_MIN : INT_MAX;
  int bi = INT_MAX;
  for (int i = lane; i < n; i += 32) {
    const int32_t x = v[i];
    if (bi == INT_MAX || (kMax ? x > bv : x < bv)) {
      bv = x;
      bi = i;
    }
  }
  best = kMax ? __reduce_max_sync(kFull, bv) : __reduce_min_sync(kFull, bv);
  index = __reduce_min_sync(kFull, bv == best ? bi : INT_MAX);
}

__device__ __forceinline__ void Fail(int32_t* error, int32_t code, int32_t a, int32_t b) {
  if (atomicCAS(&error[0], 0, code) == 0) {
    error[1] = a;
    error[2] = b;
  }
}

struct Shared {
  int32_t* count;   // [E] pairs per expert, all ranks
  int32_t* left;    // [E] step 2: pairs of an expert not yet moved
  int32_t* before;  // [E] step 4: global index of this block's next pair per expert
  int32_t* alloc;   // [R, E]
  int32_t* offs;    // [R, E]
  int32_t* copy;    // [R, epn]
  int32_t* quota;   // [R, R]
  int32_t* bal;     // [R]
  int32_t* raw;     // [kThreads] this block's raw dst
};

__host__ __device__ inline size_t SharedWords(const PlanShape& s) {
  const size_t R = s.ranks, E = s.experts;
  return 4 * E + 2 * R * E + R * R + R + kThreads;
}

__device__ Shared Carve(int32_t* base, const PlanShape& s) {
  const int R = s.ranks, E = s.experts;
  Shared sh;
  sh.count = base;
  sh.left = sh.count + E;
  sh.before = sh.left + E;
  sh.alloc = sh.before + E;
  sh.offs = sh.alloc + R * E;
  sh.copy = sh.offs + R * E;
  sh.quota = sh.copy + E;
  sh.bal = sh.quota + R * R;
  sh.raw = sh.bal + R;
  return sh;
}

__global__ void __launch_bounds__(kThreads) PlannerKernel(PlannerParams p) {
  extern __shared__ int32_t smem[];
  const PlanShape s = p.shape;
  const int R = s.ranks, E = s.experts, epn = s.epn(), K = s.top_k;
  const int32_t cap = static_cast<int32_t>(s.capacity());
  const int64_t nvs = s.nvs();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const bool writer = blockIdx.x == 0;
  Shared sh = Carve(smem, s);

  // Counts, and the global index of this rank's first pair per expert.
  for (int e = tid; e < E; e += blockDim.x) {
    int32_t c = 0, prior = 0;
    for (int r = 0; r < R; ++r) {
      const int32_t x = p.tpe[static_cast<int64_t>(r) * E + e];
      c += x;
      if (r < p.rank) prior += x;
    }
    sh.count[e] = c;
    sh.left[e] = c;
    sh.before[e] = prior;
  }
  for (int i = tid; i < R * E; i += blockDim.x) sh.alloc[i] = sh.offs[i] = 0;
  for (int i = tid; i < R * R; i += blockDim.x) sh.quota[i] = 0;
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) sh.alloc[(e / epn) * E + e] = sh.count[e];
  for (int r = warp; r < R; r += warps) {
    int32_t row = 0, group = 0;
    for (int e = lane; e < E; e += 32) {
      const int32_t x = p.tpe[static_cast<int64_t>(r) * E + e];
      if (x < 0) Fail(p.error, kPlannerErrorRowSum, r, x);
      row += x;
    }
    for (int i = lane; i < epn; i += 32) group += sh.count[r * epn + i];
    row = __reduce_add_sync(kFull, row);
    group = __reduce_add_sync(kFull, group);
    if (lane == 0) {
      if (row != cap) Fail(p.error, kPlannerErrorRowSum, r, row);
      sh.bal[r] = group - cap;
    }
  }
  __syncthreads();

  // Step 1 (one warp): the most overloaded group fills the roomiest rank.
  if (warp == 0) {
    for (;;) {
      int32_t hv, uv;
      int h, u;
      WarpArgBest<true>(sh.bal, R, hv, h);
      WarpArgBest<false>(sh.bal, R, uv, u);
      if (hv <= 0) break;
      if (lane == 0) {
        sh.quota[h * R + u] = -uv;
        sh.bal[h] = hv + uv;
        sh.bal[u] = 0;
      }
      __syncwarp();
    }
  }
  __syncthreads();

  // Step 2 (a warp per home group): the largest quota takes from the fullest expert.
  for (int h = warp; h < R; h += warps) {
    int32_t* q = sh.quota + h * R;
    int32_t* left = sh.left + h * epn;
    for (;;) {
      int32_t qv, lv;
      int d, i;
      WarpArgBest<true>(q, R, qv, d);
      if (qv <= 0) break;
      WarpArgBest<true>(left, epn, lv, i);
      const int32_t take = lv < qv ? lv : qv;
      if (take <= 0) {
        if (lane == 0) Fail(p.error, kPlannerErrorInvariant, h, qv);
        break;
      }
      if (lane == 0) {
        const int e = h * epn + i;
        sh.alloc[d * E + e] += take;
        sh.alloc[h * E + e] -= take;
        left[i] -= take;
        q[d] -= take;
      }
      __syncwarp();
    }
  }
  __syncthreads();

  // Step 3 (a warp per destination): remote experts in ascending id, then the slots.
  for (int d = warp; d < R; d += warps) {
    int held = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      const bool remote = e < E && e / epn != d && sh.alloc[d * E + e] > 0;
      const unsigned mask = __ballot_sync(kFull, remote);
      const int at = held + __popc(mask & ((1u << lane) - 1));
      if (remote && at < epn) sh.copy[d * epn + at] = e;
      held += __popc(mask);
    }
    if (held > epn) {
      if (lane == 0) Fail(p.error, kPlannerErrorInvariant, d, held);
      held = epn;
    }
    for (int b = held + lane; b < epn; b += 32) sh.copy[d * epn + b] = -1;
    __syncwarp();
    int64_t start = 0;
    for (int base = 0; base < 2 * epn; base += 32) {
      const int g = base + lane;
      const int e = g < epn ? d * epn + g : (g < 2 * epn ? sh.copy[d * epn + g - epn] : -1);
      const int32_t rows = e >= 0 ? sh.alloc[d * E + e] : 0;
      const int32_t padded =
          rows > 0 ? (rows + s.token_padding - 1) / s.token_padding * s.token_padding : 0;
      int32_t incl = padded;
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t x = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += x;
      }
      const int64_t end = start + incl, begin = end - padded;
      if (rows > 0) sh.offs[d * E + e] = static_cast<int32_t>(begin);
      if (writer && g < 2 * epn) {
        const int64_t at = static_cast<int64_t>(d) * 2 * epn + g;
        p.tables.cu_seqlens[at] = static_cast<int32_t>(end);
        const bool pad = rows > 0 && padded > rows;
        p.tables.zero_fill[2 * at] = pad ? static_cast<int32_t>(begin + rows) : 0;
        p.tables.zero_fill[2 * at + 1] = pad ? padded - rows : 0;
      }
      start += __shfl_sync(kFull, incl, 31);
    }
    if (lane == 0 && start > nvs)
      Fail(p.error, kPlannerErrorInvariant, d, static_cast<int32_t>(start));
  }
  __syncthreads();

  if (writer) {
    for (int i = tid; i < R * E; i += blockDim.x) {
      p.tables.alloc[i] = sh.alloc[i];
      p.tables.expert_offsets[i] = sh.offs[i];
    }
    for (int i = tid; i < R * epn; i += blockDim.x) p.tables.experts_to_copy[i] = sh.copy[i];
    for (int h = tid; h < R; h += blockDim.x) {
      int32_t held = 0, lent = 0;
      for (int b = 0; b < epn; ++b) held += sh.copy[h * epn + b] >= 0;
      for (int i = 0; i < R * epn; ++i) lent += sh.copy[i] >= 0 && sh.copy[i] / epn == h;
      p.tables.remote_stats[2 * h] = held;
      p.tables.remote_stats[2 * h + 1] = lent;
    }
  }

  // Step 4. This block's tokens [t0, t1); first the pairs before them, per expert.
  const int64_t per_block = blockDim.x / K;
  const int64_t t0 = blockIdx.x * per_block;
  const int64_t t1 = t0 + per_block < s.tokens ? t0 + per_block : s.tokens;
  const int64_t first = t0 * K, mine = (t1 - t0) * K;
  for (int64_t base = 0; base < first; base += blockDim.x) {
    const int64_t i = base + tid;
    int32_t e = i < first ? p.topk[i] : -1;
    if (e >= E) e = -1;  // reported by the block that owns the pair
    const unsigned peers = __match_any_sync(kFull, e);
    if (e >= 0 && lane == __ffs(peers) - 1) atomicAdd(&sh.before[e], __popc(peers));
  }
  __syncthreads();
  const int64_t i = first + tid;
  int32_t e = tid < mine ? p.topk[i] : -1;
  if (e < -1 || e >= E || (tid < mine && e < 0)) {
    Fail(p.error, kPlannerErrorExpertId, static_cast<int32_t>(i), e);
    e = -1;
  }
  const unsigned peers = __match_any_sync(kFull, e);
  const int rank_in_warp = __popc(peers & ((1u << lane) - 1));
  int32_t g = 0;
  // Warps in order, so that pairs keep (token, k) order across the block.
  for (int w = 0; w < warps; ++w) {
    if (warp == w) {
      if (e >= 0) g = sh.before[e] + rank_in_warp;
      __syncwarp();
      if (e >= 0 && lane == __ffs(peers) - 1) sh.before[e] += __popc(peers);
    }
    __syncthreads();
  }
  if (e >= 0) {
    int d = 0;
    while (d < R - 1 && g >= sh.alloc[d * E + e]) {
      g -= sh.alloc[d * E + e];
      ++d;
    }
    sh.raw[tid] = static_cast<int32_t>(d * nvs + sh.offs[d * E + e] + g);
  }
  // The last block has seen every pair: the counts must be this rank's tpe row.
  if (t1 == s.tokens) {
    for (int x = tid; x < E; x += blockDim.x) {
      int32_t prior = 0;
      for (int r = 0; r <= p.rank; ++r) prior += p.tpe[static_cast<int64_t>(r) * E + x];
      if (sh.before[x] != prior) Fail(p.error, kPlannerErrorCounts, x, sh.before[x] - prior);
    }
  }
  __syncthreads();
  // A token's later pair to a rank an earlier one reaches is stored as -dst - 1.
  if (tid < t1 - t0) {
    const int32_t* raw = sh.raw + tid * K;
    int32_t* out = p.dst + (t0 + tid) * K;
    for (int k = 0; k < K; ++k) {
      const int64_t dk = raw[k] / nvs;
      bool dup = false;
      for (int j = 0; j < k && !dup; ++j) dup = raw[j] / nvs == dk;
      out[k] = dup ? -raw[k] - 1 : raw[k];
    }
  }
}

}  // namespace

void LaunchPlanner(const PlannerParams& p, uintptr_t stream_int) {
  const PlanShape& s = p.shape;
  CheckPlanShape(s);
  MORI_CHECK_ARG(p.rank >= 0 && p.rank < s.ranks, "rank ", p.rank, " out of range [0, ", s.ranks,
                 ")");
  MORI_CHECK_ARG(s.top_k <= kThreads, "K ", s.top_k, " exceeds the CUDA planner's ", kThreads);
  const size_t smem = SharedWords(s) * sizeof(int32_t);
  int device = 0, limit = 0;
  MORI_CUDA_CHECK(cudaGetDevice(&device));
  MORI_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (smem > static_cast<size_t>(limit)) {
    MORI_THROW(NotSupportedError, "the CUDA planner needs ", smem, " bytes of shared memory for ",
               "R ", s.ranks, ", E ", s.experts, "; the device offers ", limit);
  }
  MORI_CUDA_CHECK(cudaFuncSetAttribute(PlannerKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  auto stream = reinterpret_cast<cudaStream_t>(stream_int);
  MORI_CUDA_CHECK(cudaMemsetAsync(p.error, 0, 4 * sizeof(int32_t), stream));
  const int64_t per_block = kThreads / s.top_k;
  const int64_t blocks = (s.tokens + per_block - 1) / per_block;
  PlannerKernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::balanced
