// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The balanced planner as one CUDA launch (balanced/planner.hpp states the algorithm;
// the CPU planner, balanced/planner.cpp, is the reference it must equal table for
// table). No multicast and no grid barrier. Each block takes a chunk of whole tokens
// (a ticket from scratch, so every earlier chunk belongs to a block that has started),
// ranks its pairs per expert (warp match + a per-warp count table scanned per expert)
// and publishes the chunk's per-expert counts; then it plans steps 1-3 redundantly in
// shared memory from the gathered counts (block 0 writes the tables); by then every
// earlier chunk has published, and the block sums their counts (decoupled look-back
// without a chain: a chunk reads every earlier chunk's counts, never a prefix) to
// place its own pairs (step 4). The last chunk checks the counts against tpe[rank].
//
// Designed for R = 8, E = 384, S = 8192, K = 8 within 20 us on an H200: 64 blocks of
// 1024 threads; steps 1 and 2 keep the balances, quotas and experts' remaining counts
// in registers (a lane per rank, two experts per lane) when R <= 32 and epn <= 64, so
// a greedy round is two warp max-reductions and three ballots.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "balanced/planner.hpp"
#include "common/launch_api.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"

namespace mori::ep::balanced {
namespace {

constexpr int kMaxWarps = 32;
constexpr unsigned kFull = 0xffffffffu;
// Shared memory the block size is chosen for (words): fits every device of sm_80 on.
constexpr int64_t kBudgetWords = 40 * 1024;
constexpr uint64_t kStallNs = 2000000000ull;

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

__device__ __forceinline__ uint64_t TimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ int32_t LoadAcquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The block size and chunking, a function of the shape only (so that the scratch can
// be sized without a device): warps as many as the budget allows, up to 32.
struct Layout {
  int warps;
  int64_t chunk_tokens;  // 0: K exceeds the block (refused)
  int64_t chunks;
  int64_t fixed_words, words;
};

__host__ __device__ inline Layout LayoutOf(const PlanShape& s) {
  const int64_t R = s.ranks, E = s.experts;
  Layout l;
  l.fixed_words = 7 * E + 2 * R * E + R * R + 3 * R + 1;
  const int64_t per_warp = E + 32;
  int64_t w = (kBudgetWords - l.fixed_words) / per_warp;
  l.warps = static_cast<int>(w > kMaxWarps ? kMaxWarps : (w < 1 ? 1 : w));
  l.chunk_tokens = 32 * l.warps / s.top_k;
  l.chunks = l.chunk_tokens ? (s.tokens + l.chunk_tokens - 1) / l.chunk_tokens : 1;
  l.words = l.fixed_words + l.warps * per_warp;
  return l;
}

// The scratch: [0] the ticket, [2, 2 + chunks) the chunks' flags (both cleared before
// each launch), then from a 16-byte boundary each expert's counts per chunk, a row of
// HistStride words per expert (read as int4).
__host__ __device__ inline int64_t HistOffset(int64_t chunks) { return (2 + chunks + 3) / 4 * 4; }
__host__ __device__ inline int64_t HistStride(int64_t chunks) { return (chunks + 3) / 4 * 4; }

struct Shared {
  int32_t* count;   // [E] pairs per expert, all ranks
  int32_t* prior;   // [E] pairs of the ranks before this one
  int32_t* mine;    // [E] tpe[rank]
  int32_t* before;  // [E] global index of this chunk's first pair per expert
  int32_t* total;   // [E] this chunk's pairs per expert
  int32_t* left;    // [E] step 2 (general path): pairs of an expert not yet moved
  int32_t* copy;    // [R, epn]
  int32_t* alloc;   // [R, E]
  int32_t* offs;    // [R, E]
  int32_t* quota;   // [R, R]
  int32_t* bal;     // [R]
  int32_t* lent;    // [R] own experts held elsewhere (step 2's moves)
  int32_t* misc;    // [R + 1] spare, then the chunk
  int32_t* wcount;  // [warps, E] per-warp pairs, then their exclusive scan per expert
  int32_t* dest;    // [threads] each pair's destination rank
};

__device__ Shared Carve(int32_t* base, const PlanShape& s, int warps) {
  const int R = s.ranks, E = s.experts;
  Shared sh;
  sh.count = base;
  sh.prior = sh.count + E;
  sh.mine = sh.prior + E;
  sh.before = sh.mine + E;
  sh.total = sh.before + E;
  sh.left = sh.total + E;
  sh.copy = sh.left + E;
  sh.alloc = sh.copy + E;
  sh.offs = sh.alloc + R * E;
  sh.quota = sh.offs + R * E;
  sh.bal = sh.quota + R * R;
  sh.lent = sh.bal + R;
  sh.misc = sh.lent + R;
  sh.wcount = sh.misc + R + 1;
  sh.dest = sh.wcount + warps * E;
  return sh;
}

__global__ void __launch_bounds__(1024, 1) PlannerKernel(PlannerParams p, int64_t chunk_tokens) {
  extern __shared__ int32_t smem[];
  const PlanShape s = p.shape;
  const int R = s.ranks, E = s.experts, epn = s.epn(), K = s.top_k;
  const int32_t cap = static_cast<int32_t>(s.capacity());
  const int64_t nvs = s.nvs();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const int B = blockDim.x;
  const bool writer = blockIdx.x == 0;
  const bool fast = R <= 32 && epn <= 64;  // steps 1 and 2 in registers
  const int chunks = gridDim.x;
  Shared sh = Carve(smem, s, warps);
  int32_t* ticket = p.scratch;
  int32_t* flag = p.scratch + 2;
  const int64_t stride = HistStride(chunks);
  int32_t* hist = p.scratch + HistOffset(chunks);  // [E, stride]: chunk counts per expert

  // Phase 0: a chunk (ticket), the counts, cleared tables.
  int32_t my_ticket = 0;
  if (tid == 0) my_ticket = atomicAdd(ticket, 1);
  for (int i = tid; i < R * E; i += B) sh.alloc[i] = sh.offs[i] = 0;
  for (int i = tid; i < warps * E; i += B) sh.wcount[i] = 0;
  for (int i = tid; i < R * R; i += B) sh.quota[i] = 0;
  for (int e = tid; e < E; e += B) {
    int32_t c = 0, prior = 0, own = 0;
    for (int r = 0; r < R; ++r) {
      const int32_t x = p.tpe[static_cast<int64_t>(r) * E + e];
      if (x < 0) Fail(p.error, kPlannerErrorRowSum, r, x);
      c += x;
      if (r < p.rank) prior += x;
      if (r == p.rank) own = x;
    }
    sh.count[e] = c;
    sh.left[e] = c;
    sh.prior[e] = prior;
    sh.before[e] = prior;
    sh.mine[e] = own;
  }
  if (tid == 0) sh.misc[R] = my_ticket;
  __syncthreads();

  // Phase 1: this chunk's pairs ranked per expert within the chunk; its counts published.
  const int c = sh.misc[R];
  const int64_t t0 = c * chunk_tokens;
  const int64_t t1 = t0 + chunk_tokens < s.tokens ? t0 + chunk_tokens : s.tokens;
  const int64_t first = t0 * K;
  const int n_pairs = static_cast<int>((t1 - t0) * K);
  const bool has = tid < n_pairs;
  int32_t e = has ? p.topk[first + tid] : -1;
  if (!fast) {
    for (int x = tid; x < E; x += B) sh.alloc[static_cast<int64_t>(x / epn) * E + x] = sh.count[x];
  }
  for (int r = warp; r < R; r += warps) {
    int32_t row = 0, group = 0;
    for (int x = lane; x < E; x += 32) row += p.tpe[static_cast<int64_t>(r) * E + x];
    for (int i = lane; i < epn; i += 32) group += sh.count[r * epn + i];
    row = __reduce_add_sync(kFull, row);
    group = __reduce_add_sync(kFull, group);
    if (lane == 0) {
      if (row != cap) Fail(p.error, kPlannerErrorRowSum, r, row);
      sh.bal[r] = group - cap;
    }
  }
  if (has && (e < 0 || e >= E)) {
    Fail(p.error, kPlannerErrorExpertId, static_cast<int32_t>(first + tid), e);
    e = -1;
  }
  const unsigned peers = __match_any_sync(kFull, e);
  const int in_warp = __popc(peers & ((1u << lane) - 1));
  if (e >= 0 && lane == __ffs(peers) - 1) sh.wcount[warp * E + e] = __popc(peers);
  __syncthreads();
  for (int x = tid; x < E; x += B) {
    int32_t run = 0;
    for (int w = 0; w < warps; ++w) {
      const int32_t v = sh.wcount[w * E + x];
      sh.wcount[w * E + x] = run;
      run += v;
    }
    sh.total[x] = run;
    hist[static_cast<int64_t>(x) * stride + c] = run;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) atomicExch(&flag[c], 1);

  // Step 1 (one warp): the most overloaded group fills the roomiest rank. A legal
  // round zeroes a negative balance for good, so R rounds bound it on any input.
  if (warp == 0) {
    if (fast) {
      int32_t b = lane < R ? sh.bal[lane] : 0;
      for (int round = 0; round < R; ++round) {
        const int32_t hv = __reduce_max_sync(kFull, lane < R ? b : INT_MIN);
        if (hv <= 0) break;
        const int32_t uv = __reduce_min_sync(kFull, lane < R ? b : INT_MAX);
        const int h = __ffs(__ballot_sync(kFull, lane < R && b == hv)) - 1;
        const int u = __ffs(__ballot_sync(kFull, lane < R && b == uv)) - 1;
        if (lane == 0) sh.quota[h * R + u] = -uv;
        if (lane == h) b = hv + uv;
        if (lane == u) b = 0;
      }
    } else {
      for (int round = 0; round < R; ++round) {
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
  }
  __syncthreads();

  // Step 2 (a warp per home group): the largest quota takes from the fullest expert.
  // Every round empties a quota or an expert, or stops.
  for (int h = warp; h < R; h += warps) {
    int moves = 0;
    if (fast) {
      // Lane d holds quota d; lane i experts h*epn + i and h*epn + 32 + i (-1: none).
      int32_t q = lane < R ? sh.quota[h * R + lane] : -1;
      int32_t l0 = lane < epn ? sh.count[h * epn + lane] : -1;
      int32_t l1 = lane + 32 < epn ? sh.count[h * epn + lane + 32] : -1;
      for (;;) {
        const int32_t qv = __reduce_max_sync(kFull, q);
        const int32_t lv = __reduce_max_sync(kFull, l1 > l0 ? l1 : l0);
        if (qv <= 0) break;
        const int d = __ffs(__ballot_sync(kFull, q == qv)) - 1;
        const unsigned m0 = __ballot_sync(kFull, l0 == lv), m1 = __ballot_sync(kFull, l1 == lv);
        const int i = m0 ? __ffs(m0) - 1 : 31 + __ffs(m1);
        const int32_t take = lv < qv ? lv : qv;
        if (take <= 0) {
          if (lane == 0) Fail(p.error, kPlannerErrorInvariant, h, qv);
          break;
        }
        if (lane == d) q -= take;
        if (lane == (i & 31)) {
          if (i < 32) {
            l0 -= take;
          } else {
            l1 -= take;
          }
        }
        if (lane == 0) sh.alloc[d * E + h * epn + i] += take;
        ++moves;
      }
      // The home keeps what was not moved.
      if (lane < epn) sh.alloc[h * E + h * epn + lane] = l0;
      if (lane + 32 < epn) sh.alloc[h * E + h * epn + lane + 32] = l1;
    } else {
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
          const int x = h * epn + i;
          sh.alloc[d * E + x] += take;
          sh.alloc[h * E + x] -= take;
          left[i] -= take;
          q[d] -= take;
        }
        ++moves;
        __syncwarp();
      }
    }
    if (lane == 0) sh.lent[h] = moves;
  }
  __syncthreads();

  // Step 3 (a warp per destination): remote experts in ascending id, then the slots.
  for (int d = warp; d < R; d += warps) {
    int held = 0;
    const int lo = d * epn, hi = lo + epn;
    for (int base = 0; base < E; base += 32) {
      const int x = base + lane;
      const bool remote = x < E && (x < lo || x >= hi) && sh.alloc[d * E + x] > 0;
      const unsigned mask = __ballot_sync(kFull, remote);
      const int at = held + __popc(mask & ((1u << lane) - 1));
      if (remote && at < epn) sh.copy[d * epn + at] = x;
      held += __popc(mask);
    }
    if (held > epn) {
      if (lane == 0) Fail(p.error, kPlannerErrorInvariant, d, held);
      held = epn;
    }
    for (int b = held + lane; b < epn; b += 32) sh.copy[d * epn + b] = -1;
    if (writer && lane == 0) {
      p.tables.remote_stats[2 * d] = held;
      p.tables.remote_stats[2 * d + 1] = sh.lent[d];
    }
    __syncwarp();
    int64_t start = 0;
    for (int base = 0; base < 2 * epn; base += 32) {
      const int g = base + lane;
      const int x = g < epn ? d * epn + g : (g < 2 * epn ? sh.copy[d * epn + g - epn] : -1);
      const int32_t rows = x >= 0 ? sh.alloc[d * E + x] : 0;
      const int32_t padded =
          rows > 0 ? (rows + s.token_padding - 1) / s.token_padding * s.token_padding : 0;
      int32_t incl = padded;
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t y = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += y;
      }
      const int64_t end = start + incl, begin = end - padded;
      if (rows > 0) sh.offs[d * E + x] = static_cast<int32_t>(begin);
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
  // Every earlier chunk has a started block (tickets): wait for its counts.
  for (int j = tid; j < c; j += B) {
    if (LoadAcquire(&flag[j]) == 0) {
      const uint64_t since = TimerNs();
      while (LoadAcquire(&flag[j]) == 0) {
        if (TimerNs() - since > kStallNs) {
          Fail(p.error, kPlannerErrorStalled, c, j);
          break;
        }
      }
    }
  }
  __syncthreads();

  if (writer) {
    for (int i = tid; i < R * E; i += B) {
      p.tables.alloc[i] = sh.alloc[i];
      p.tables.expert_offsets[i] = sh.offs[i];
    }
    for (int i = tid; i < R * epn; i += B) p.tables.experts_to_copy[i] = sh.copy[i];
  }

  // Step 4. Every earlier chunk's counts: an expert's column is contiguous, so a
  // thread sums part of one column with 16-byte loads (8 in flight) and adds it once.
  {
    const int parts = B >= E ? B / E : 1;
    const int vecs = (c + 3) / 4;  // int4s covering chunks [0, c)
    for (int idx = tid; idx < E * parts; idx += B) {
      const int x = idx % E, part = idx / E;
      const int4* col = reinterpret_cast<const int4*>(hist + static_cast<int64_t>(x) * stride);
      int32_t sum = 0;
      for (int v0 = part; v0 < vecs; v0 += 8 * parts) {
        int4 q[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int v = v0 + u * parts;
          q[u] = v < vecs ? __ldcg(col + v) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int j = 4 * (v0 + u * parts);  // chunks j .. j + 3; only those below c count
          sum += (j < c ? q[u].x : 0) + (j + 1 < c ? q[u].y : 0) + (j + 2 < c ? q[u].z : 0) +
                 (j + 3 < c ? q[u].w : 0);
        }
      }
      if (sum != 0) atomicAdd(&sh.before[x], sum);
    }
  }
  __syncthreads();
  // The last chunk has seen every pair's counts: they must be this rank's tpe row.
  if (c == chunks - 1) {
    for (int x = tid; x < E; x += B) {
      const int32_t seen = sh.before[x] - sh.prior[x] + sh.total[x];
      if (seen != sh.mine[x]) Fail(p.error, kPlannerErrorCounts, x, seen - sh.mine[x]);
    }
  }
  int d = -1;
  int64_t raw = 0;
  if (e >= 0) {
    int32_t g = sh.before[e] + sh.wcount[warp * E + e] + in_warp;
    d = 0;
    while (d < R - 1 && g >= sh.alloc[d * E + e]) {
      g -= sh.alloc[d * E + e];
      ++d;
    }
    raw = d * nvs + sh.offs[d * E + e] + g;
  }
  sh.dest[tid] = d;
  __syncthreads();
  // A token's later pair to a rank an earlier one reaches is stored as -dst - 1.
  if (has) {
    const int k = tid % K;
    bool dup = false;
    for (int j = tid - k; j < tid; ++j) dup |= sh.dest[j] == d;
    p.dst[first + tid] = static_cast<int32_t>(dup ? -raw - 1 : raw);
  }
}

}  // namespace

int64_t PlannerScratchWords(const PlanShape& s) {
  const Layout l = LayoutOf(s);
  return HistOffset(l.chunks) + s.experts * HistStride(l.chunks);
}

void LaunchPlanner(const PlannerParams& p, uintptr_t stream_int) {
  const PlanShape& s = p.shape;
  CheckPlanShape(s);
  MORI_CHECK_ARG(p.rank >= 0 && p.rank < s.ranks, "rank ", p.rank, " out of range [0, ", s.ranks,
                 ")");
  const Layout l = LayoutOf(s);
  if (l.fixed_words + s.experts + 32 > kBudgetWords || l.chunk_tokens < 1) {
    MORI_THROW(NotSupportedError, "the CUDA planner cannot plan R ", s.ranks, ", E ", s.experts,
               ", K ", s.top_k, " in ", kBudgetWords * 4, " bytes of shared memory");
  }
  const size_t smem = static_cast<size_t>(l.words) * sizeof(int32_t);
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
  MORI_CUDA_CHECK(cudaMemsetAsync(p.scratch, 0, sizeof(int32_t) * (2 + l.chunks), stream));
  PlannerKernel<<<static_cast<unsigned>(l.chunks), 32 * l.warps, smem, stream>>>(p, l.chunk_tokens);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::balanced
