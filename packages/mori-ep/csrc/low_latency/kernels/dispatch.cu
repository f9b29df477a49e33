// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The low-latency dispatch kernel (low_latency/protocol.hpp): one kernel that runs the
// dispatch phases a launch asks for (kLlDispatchSend, kLlDispatchRecv, or the
// rejection), one warp per token (send) or per (expert, source) (expert-major
// layout). Written for few tokens per rank: every block recomputes the routing masks
// of all tokens in shared memory instead of a grid-wide scan. The arithmetic (the fp8
// cast, bf16/fp8 rounding) is the CPU implementation's (low_latency/cpu.cpp), so
// outputs are bit-identical.
#include <algorithm>

#include "low_latency/kernels/device.cuh"

namespace mori::ep::low_latency {

namespace {

// ------------------------------------------------------------- dispatch send
// kCe: the copy-engine variant (LlParams::copy_engine), a kernel of its own.
template <bool kCe>
__device__ void DispatchSend(const LlParams& p, uint64_t call, uint32_t* masks) {
  const Ctx c{p};
  const LlDispatchArgs& a = p.d;
  const int W = p.world, K = p.top_k, me = p.me;
  const int64_t P = p.recv_slots, n = a.num_tokens, hidden = p.hidden_dim;
  const int num_experts = p.experts_per_rank * W;
  const bool expert_major = a.layout == LlLayout::kExpertMajor;
  LlDeviceState* st = c.State();
  uint64_t* stamps = p.stamps[kLlPartDispatchSend];
  Stamp(stamps, 0);
  // Rows per destination, counted with the masks (every block posts them), and
  // whether an id failed its check (every block sees every token's ids).
  __shared__ int sent[kMaxCudaWorldSize];
  __shared__ int bad_ids;
  if (threadIdx.x < W) sent[threadIdx.x] = 0;
  if (threadIdx.x == 0) bad_ids = 0;
  __syncthreads();
  // Routing masks of every token (each block its own copy), and the id checks.
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    uint32_t mask = 0;
    const int32_t* row = a.indices + t * K;
    for (int j = 0; j < K; ++j) {
      const int32_t e = row[j];
      if (e == -1) continue;
      bool bad = e < 0 || e >= num_experts;
      const char* why = "out of range";
      if (!bad && expert_major) {
        for (int i = 0; i < j; ++i) bad |= row[i] == e;
        why = "repeated (the expert-major layout needs distinct experts)";
      }
      if (bad) {
        bad_ids = 1;
        if (blockIdx.x == 0 && atomicCAS(&st->pad, 0u, 1u) == 0u) {
          printf(
              "mori.ep low-latency dispatch on rank %d: expert id %d %s at token %lld slot %d "
              "(valid: [-1, %d))\n",
              me, e, why, static_cast<long long>(t), j, num_experts);
          dev::TrapReported();
        }
        continue;
      }
      mask |= 1u << (e / p.experts_per_rank);
    }
    masks[t] = mask;
    for (uint32_t m = mask; m != 0; m &= m - 1) atomicAdd(&sent[__ffs(m) - 1], 1);
  }
  __syncthreads();
  Stamp(stamps, 1);

  const size_t half = DispHalf<kCe>(call);
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, Q = LlCastScales(hidden);
  // Where the rows for pe d go: its area (slot [me][j]), or with the copy engines for
  // d != me this pe's staging (slot [d][j], the host copies it after the kernel).
  const auto area = [&](size_t off, int d) -> char* {
    return kCe && d != me ? p.stage + (off - p.layout.disp_tokens) : c.Peer(off, d);
  };
  const size_t tok_off = p.layout.disp_tokens + half * p.layout.half_tokens;
  const size_t w_off = p.layout.disp_weights + half * p.layout.half_weights;
  const size_t s_off = p.layout.disp_scales + half * p.layout.half_scales;
  const size_t cs_off = p.layout.disp_cast_scales + half * p.layout.half_cast_scales;
  const size_t i_off = p.layout.disp_indices + half * p.layout.half_indices;
  const size_t src_off = p.layout.disp_src + half * p.layout.half_src;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  uint8_t* token_ranks = reinterpret_cast<uint8_t*>(c.Local(p.layout.token_ranks));
  // Items are (token, piece of its row): piece 0 also moves the token's metadata.
  const int64_t C = RowChunks(n, nwarps, a.fp8_cast ? hidden * 2 : a.token_row_bytes);
  const int64_t QC = (Q + C - 1) / C;  // cast groups per piece
  for (int64_t item = gwarp; item < n * C; item += nwarps) {
    const int64_t t = item / C, ch = item % C;
    const uint32_t mask = masks[t];
    // Slot of t in each destination: the tokens before it routed there.
    int before[kMaxCudaWorldSize];
    for (int d = 0; d < W; ++d) before[d] = 0;
    for (int64_t u = lane; u < t; u += 32) {
      const uint32_t m = masks[u];
      for (int d = 0; d < W; ++d) before[d] += (m >> d) & 1;
    }
    for (int d = 0; d < W; ++d) before[d] = WarpSum(before[d]);
    if (ch == 0 && lane < W) token_ranks[t * W + lane] = (mask >> lane) & 1;
    const char* row = static_cast<const char*>(a.tokens) + t * a.token_row_bytes;
    for (int d = 0; d < W; ++d) {
      // Past the receive slots: no row (the last block rejects the call).
      if (!((mask >> d) & 1) || before[d] >= P) continue;
      const int64_t slot = (kCe && d != me ? d : me) * P + before[d];
      if (a.fp8_cast) {
        const uint16_t* x = reinterpret_cast<const uint16_t*>(row);
        uint8_t* dst = reinterpret_cast<uint8_t*>(area(tok_off, d)) + slot * H;
        float* dsc = reinterpret_cast<float*>(area(cs_off, d)) + slot * Q;
        // kBatch groups' loads are issued before any of their maxima and stores, so a
        // piece costs one load latency per kBatch groups, not one per group.
        constexpr int kBatch = 4;
        const int64_t g_end = (ch + 1) * QC < Q ? (ch + 1) * QC : Q;
        for (int64_t g0 = ch * QC; g0 < g_end; g0 += kBatch) {
          float v[kBatch][4];
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            for (int i = 0; i < 4; ++i) {
              v[j][i] = g0 + j < g_end ? Bf16BitsToFloat(x[(g0 + j) * kLlCastGroup + lane * 4 + i])
                                       : 0.0f;
            }
          }
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            const int64_t g = g0 + j;
            if (g >= g_end) break;
            float amax = kLlCastMargin;
            for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[j][i]));
            amax = WarpMax(amax);
            float inv;
            const float scale = LlCastScale(amax, a.round_scale, &inv);
            uint32_t packed = 0;
            for (int i = 0; i < 4; ++i) {
              packed |= static_cast<uint32_t>(FloatToFloat8E4M3(__fmul_rn(v[j][i], scale)))
                        << (8 * i);
            }
            reinterpret_cast<uint32_t*>(dst + g * kLlCastGroup)[lane] = packed;
            if (lane == 0) dsc[g] = inv;
          }
        }
      } else {
        CopyChunk(area(tok_off, d) + slot * H, row, a.token_row_bytes, ch, C, lane);
      }
      if (ch != 0) continue;
      float* dw = reinterpret_cast<float*>(area(w_off, d)) + slot * K;
      int32_t* di = reinterpret_cast<int32_t*>(area(i_off, d)) + slot * K;
      if (lane < K) {
        dw[lane] = a.weights != nullptr ? a.weights[t * K + lane] : 0.0f;
        di[lane] = a.indices[t * K + lane];
      }
      if (Sb > 0 && a.scales != nullptr) {
        mori::shmem::device::detail::CopyBytes(
            area(s_off, d) + slot * Sb, static_cast<const char*>(a.scales) + t * Sb, Sb, lane, 32);
      }
      if (lane == 0) reinterpret_cast<int32_t*>(area(src_off, d))[slot] = static_cast<int32_t>(t);
    }
  }
  Stamp(stamps, 2);
  // Over the cap: the first pe whose count exceeds the slots (every block finds it).
  __shared__ int over;
  if (threadIdx.x == 0) over = W;
  __syncthreads();
  if (threadIdx.x < W && sent[threadIdx.x] > P) atomicMin(&over, threadIdx.x);
  __syncthreads();
  const bool rejected = bad_ids != 0 || over < W;
  uint64_t* flags =
      reinterpret_cast<uint64_t*>(c.Local(p.layout.disp_flag)) + LlFlagIndex(half, W, 0);
  if (!kCe) {
    // Every block announces its own rows: a rejecting sender's note first (every
    // block writes the same one), then the block's flag lanes, each released after
    // the block's stores.
    if (over < W && threadIdx.x < W) {
      LlOverNote* note =
          reinterpret_cast<LlOverNote*>(c.Peer(p.layout.disp_over, threadIdx.x)) + half * W + me;
      note->word = LlWord(call, static_cast<uint64_t>(sent[over]));
      note->dest = static_cast<uint64_t>(over);
    }
    dev::Quiet();
    __syncthreads();
    for (int i = threadIdx.x; i < W * kLlFlagLanes; i += blockDim.x) {
      const int d = i / kLlFlagLanes, lane = i % kLlFlagLanes;
      if (lane % static_cast<int>(gridDim.x) != static_cast<int>(blockIdx.x)) continue;
      const uint64_t word = LlWord(call, rejected ? kLlRejected : sent[d], LlDispatchTag(a));
      dev::SignalSet(p.ctx, &flags[me * kLlFlagLanes + lane], word, d);
    }
    Stamp(stamps, 3);
  }
  // The grid's last block advances the call counter (every block has read it by now)
  // and, with the copy engines, stages the flags the host copies after the rows. A
  // launch that receives too leaves the counter to its receive phase (DispatchRecv),
  // which has seen every block's lanes: no block waits for the grid here.
  if (!kCe && !rejected && (p.phases & kLlDispatchRecv)) return;
  if (FinishBlock(&st->blocks_done)) {
    if (kCe && threadIdx.x < W) {
      const int d = threadIdx.x;
      if (over < W) {
        LlOverNote* note =
            reinterpret_cast<LlOverNote*>(c.Peer(p.layout.disp_over, d)) + half * W + me;
        note->word = LlWord(call, static_cast<uint64_t>(sent[over]));
        note->dest = static_cast<uint64_t>(over);
      }
      const uint64_t word = LlWord(call, rejected ? kLlRejected : sent[d], LlDispatchTag(a));
      if (d != me && !rejected) {
        // The host copies it after the rows. d's area is single-buffered: wait until d
        // consumed this pe's previous call (its receive posts that) before the copies.
        p.stage_flags[d] = word;
        const uint64_t* consumed =
            reinterpret_cast<const uint64_t*>(c.Local(p.layout.disp_consumed));
        WaitPeerWord(&consumed[d], LlWord(call - 1, 0), p.timeout_ns, me, d, "low-latency dispatch",
                     call, "consumed word", kCountBits);
      } else {
        dev::SignalSet(p.ctx, &flags[me * kLlFlagLanes], word, d);
      }
    }
    __syncthreads();
    if (kCe) Stamp(stamps, 3);
    if (threadIdx.x == 0) st->dispatch_calls = call;
    if (rejected) {
      if (over < W && threadIdx.x == 0) {
        ReportOverCap(me, me, static_cast<uint64_t>(sent[over]), static_cast<uint64_t>(over), P);
      }
      // Receive the call as every pe does (its flags), then end the launch.
      const int lanes = kCe ? 1 : kLlFlagLanes;
      for (int i = threadIdx.x; i < W * lanes; i += blockDim.x) {
        WaitPeerWord(&flags[(i / lanes) * kLlFlagLanes + i % lanes], LlWord(call, 0), p.timeout_ns,
                     me, i / lanes, "low-latency dispatch", call, "dispatch flag", kCountBits);
      }
      __syncthreads();
      if (threadIdx.x == 0) st->pad = 0;
      __threadfence();
      dev::TrapAfterReport();
    }
  }
}

// ---------------------------------------------------------- dispatch receive
template <bool kCe>
__device__ void DispatchRecv(const LlParams& p, uint64_t call, uint32_t* scratch) {
  const Ctx c{p};
  const LlRecvArgs& o = p.r;
  const int W = p.world, K = p.top_k, E = p.experts_per_rank;
  const int64_t M = p.max_tokens, P = p.recv_slots, WM = W * M, hidden = p.hidden_dim;
  const size_t half = DispHalf<kCe>(call);
  __shared__ int64_t counts[kMaxCudaWorldSize];
  __shared__ int64_t base[kMaxCudaWorldSize + 1];
  __shared__ int rejected_by;
  uint64_t* stamps = p.stamps[kLlPartDispatchRecv];
  Stamp(stamps, 0);
  const uint64_t* flags =
      reinterpret_cast<const uint64_t*>(c.Local(p.layout.disp_flag)) + LlFlagIndex(half, W, 0);
  WaitFlags(p, flags, call, counts, &rejected_by, LlDispatchTag(p.d), true, kCe ? 1 : kLlFlagLanes);
  // A fused launch's counter (DispatchSend left it): every block of this launch posted
  // its lanes, so every block read the counter before this store.
  if (!kCe && (p.phases & kLlDispatchSend) && blockIdx.x == 0 && threadIdx.x == 0 &&
      rejected_by < 0) {
    Ctx{p}.State()->dispatch_calls = call;
  }
  if (rejected_by >= 0) {
    TrapRejected(p, rejected_by, "dispatch",
                 reinterpret_cast<const LlOverNote*>(c.Local(p.layout.disp_over)) + half * W, call);
  }
  Stamp(stamps, 1);
  if (threadIdx.x == 0) {
    base[0] = 0;
    for (int s = 0; s < W; ++s) base[s + 1] = base[s] + counts[s];
  }
  __syncthreads();
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, Q = LlCastScales(hidden);
  const char* tokens = c.Local(p.layout.disp_tokens + half * p.layout.half_tokens);
  const float* weights =
      reinterpret_cast<const float*>(c.Local(p.layout.disp_weights + half * p.layout.half_weights));
  const char* scales = c.Local(p.layout.disp_scales + half * p.layout.half_scales);
  const float* cast = reinterpret_cast<const float*>(
      c.Local(p.layout.disp_cast_scales + half * p.layout.half_cast_scales));
  const int32_t* indices = reinterpret_cast<const int32_t*>(
      c.Local(p.layout.disp_indices + half * p.layout.half_indices));
  const int32_t* src =
      reinterpret_cast<const int32_t*>(c.Local(p.layout.disp_src + half * p.layout.half_src));
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;

  if (p.recv_layout == LlLayout::kTokenMajor) {
    const int64_t rb = p.recv_row_bytes;
    const int64_t C = RowChunks(base[W], nwarps, rb);
    for (int64_t item = gwarp; item < base[W] * C; item += nwarps) {
      const int64_t row = item / C, ch = item % C;
      int s = 0;
      while (row >= base[s + 1]) ++s;
      const int64_t slot = s * P + (row - base[s]);
      CopyChunk(static_cast<char*>(o.out_tokens) + row * H, tokens + slot * H, rb, ch, C, lane);
      if (ch != 0) continue;
      if (lane < K) {
        o.out_weights[row * K + lane] = weights[slot * K + lane];
        o.out_indices[row * K + lane] = indices[slot * K + lane];
      }
      if (Sb > 0 && o.out_scales != nullptr) {
        mori::shmem::device::detail::CopyBytes(static_cast<char*>(o.out_scales) + row * Sb,
                                               scales + slot * Sb, Sb, lane, 32);
      }
      if (lane == 0) o.out_src_pos[row] = EncodeSrcPos(s, src[slot], M);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *o.total_recv = static_cast<int32_t>(base[W]);
    Stamp(stamps, 2);
    PostConsumed<kCe>(p, call);
    Stamp(stamps, 3);
    return;
  }

  // Expert-major. Each block first counts the rows per (local expert, source) in shared
  // memory (`table`, E x W); then items (received row, slot k, piece of the row) go to
  // every warp of the grid. A row's packed position is begin(e, s) (the rows of e from
  // lower sources) plus its rank among source s's rows for e, so the order is the CPU
  // implementation's (source pe, then slot) while the copies of one expert's rows run
  // in parallel warps instead of one after another.
  const int32_t lo = p.me * E;
  int32_t* disp_pos = reinterpret_cast<int32_t*>(c.Local(p.layout.disp_pos));
  const int64_t xb = p.recv_fp8 ? hidden : p.recv_row_bytes;
  int32_t* table = reinterpret_cast<int32_t*>(scratch);
  __shared__ int64_t hits;
  for (int i = threadIdx.x; i < E * W; i += blockDim.x) table[i] = 0;
  if (threadIdx.x == 0) hits = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < base[W] * K; i += blockDim.x) {
    const int64_t row = i / K;
    int s = 0;
    while (row >= base[s + 1]) ++s;
    const int32_t e = indices[(s * P + (row - base[s])) * K + i % K] - lo;
    if (e >= 0 && e < E) {
      atomicAdd(&table[e * W + s], 1);
      atomicAdd(reinterpret_cast<unsigned long long*>(&hits), 1ull);
    }
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      int64_t b = 0;
      for (int s = 0; s < W; ++s) {
        o.layout_range[e * W + s] = (b << 32) | table[e * W + s];
        b += table[e * W + s];
      }
      o.packed_count[e] = static_cast<int32_t>(b);
    }
  }
  const int64_t C = RowChunks(hits, nwarps, xb);
  for (int64_t item = gwarp; item < base[W] * K * C; item += nwarps) {
    const int64_t row = item / (K * C), ch = item % C;
    const int k = static_cast<int>(item / C % K);
    int s = 0;
    while (row >= base[s + 1]) ++s;
    const int64_t j = row - base[s], slot = s * P + j;
    const int32_t e = indices[slot * K + k] - lo;
    if (e < 0 || e >= E) continue;
    // Rank among source s's rows for e (rows name an expert at most once).
    int64_t rank = 0;
    for (int64_t j0 = 0; j0 < j; j0 += 32) {
      bool hit = false;
      if (j0 + lane < j) {
        const int32_t* ids = indices + (s * P + j0 + lane) * K;
        for (int kk = 0; kk < K; ++kk) hit |= ids[kk] == lo + e;
      }
      rank += __popc(__ballot_sync(kFull, hit));
    }
    int64_t pos = rank;
    for (int s2 = 0; s2 < s; ++s2) pos += table[e * W + s2];
    const int64_t r = e * WM + pos;
    CopyChunk(static_cast<char*>(o.packed_x) + r * xb, tokens + slot * H, xb, ch, C, lane);
    if (ch != 0) continue;
    if (lane == 0) {
      o.src_info[r] = static_cast<int32_t>(s * o.src_info_stride + src[slot]);
      o.slot_k[r] = k;
      disp_pos[slot * K + k] = static_cast<int32_t>(r);
    }
    if (p.recv_fp8) {
      for (int64_t q = lane; q < Q; q += 32) {
        const float v = cast[slot * Q + q];
        if (o.ue8m0) {
          static_cast<uint8_t*>(o.packed_scales)[((e * (Q / 4) + q / 4) * WM + pos) * 4 + q % 4] =
              static_cast<uint8_t>(__float_as_uint(v) >> 23);
        } else {
          static_cast<float*>(o.packed_scales)[(e * Q + q) * WM + pos] = v;
        }
      }
    }
  }
  Stamp(stamps, 2);
  PostConsumed<kCe>(p, call);
  Stamp(stamps, 3);
}

// A dispatch kernel runs dispatch phases (send, receive, reject), a combine kernel
// combine phases; a launch never mixes them, and each kernel's registers are its own.
// (The names carry "DispatchKernel" / "CombineKernel": the bench's profiler reads them.)
template <int kVariant>
__global__ void __launch_bounds__(kLlMaxWarps * 32, 1)
    LowLatencyDispatchKernel(const __grid_constant__ LlParams p) {
  constexpr bool kCe = kVariant == kLlCopyEngine;
  extern __shared__ uint32_t masks[];
  LlDeviceState* st = Ctx{p}.State();
  if (p.phases & kLlRejectDispatch) return Reject<kCe>(p, true);
  // Every block reads the counter before any block can advance it (the last block of
  // the send phase does, after every block arrived there).
  const uint64_t dcall = st->dispatch_calls + ((p.phases & kLlDispatchSend) ? 1 : 0);
  __syncthreads();
  if (p.phases & kLlDispatchSend) DispatchSend<kCe>(p, dcall, masks);
  if (p.phases & kLlDispatchRecv) DispatchRecv<kCe>(p, dcall, masks);
}

}  // namespace

void LaunchDispatch(const LlParams& p, int blocks, int threads, uintptr_t stream) {
  // Shared scratch: the send's routing masks (a word per token), the expert-major
  // receive's row counts (a word per local expert and source).
  size_t smem = (p.phases & kLlDispatchSend) ? static_cast<size_t>(p.max_tokens) * 4 : 0;
  if ((p.phases & kLlDispatchRecv) && p.recv_layout == LlLayout::kExpertMajor) {
    smem = std::max(smem, static_cast<size_t>(p.experts_per_rank) * p.world * 4);
  }
  auto kernel = p.copy_engine ? LowLatencyDispatchKernel<kLlCopyEngine>
                              : LowLatencyDispatchKernel<kLlDefault>;
  if (smem > 48 * 1024) {
    MORI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  kernel<<<blocks, threads, smem, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::low_latency
