// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The low-latency combine kernel (low_latency/protocol.hpp): one kernel that runs the
// combine phases a launch asks for (kLlCombineSend, kLlCombineRecv, or the
// rejection), one warp per token (reduce) or per (expert, source) (expert-major
// layout). The arithmetic (bf16/fp8 rounding, the reduction order, fp32 products and
// sums without fused multiply-adds) is the CPU implementation's (low_latency/cpu.cpp),
// so outputs are bit-identical.
#include "common/fp8_blockwise.cuh"
#include "low_latency/kernels/device.cuh"

namespace mori::ep::low_latency {

namespace {

// A copy-engine op's combine writes a single-buffered area: before any row, every
// block waits until each other pe consumed this pe's previous combine.
__device__ void WaitCombConsumed(const LlParams& p, uint64_t call) {
  const uint64_t* consumed = reinterpret_cast<const uint64_t*>(p.block + p.layout.comb_consumed);
  if (threadIdx.x < p.world && threadIdx.x != p.me) {
    WaitPeerWord(&consumed[threadIdx.x], LlWord(call - 1, 0), p.timeout_ns, p.me, threadIdx.x,
                 "low-latency combine", call, "consumed word", kCountBits);
  }
  __syncthreads();
}

// -------------------------------------------------------------- combine send
// Pre-reduced expert-major combine send (low_latency/protocol.hpp). Not inlined: its
// 8-column accumulators would otherwise raise the register pressure of every phase.
__device__ __forceinline__ void CombineSendPartials(const LlParams& p, size_t ct_off) {
  const Ctx c{p};
  const LlCombineArgs& a = p.c;
  const int W = p.world, K = p.top_k, E = p.experts_per_rank, me = p.me;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  LlDeviceState* st = c.State();
  // Per received token of the last dispatch (its half and counts: no peer rewrites
  // them before this pe's next dispatch), the sum over its local slots k ascending
  // of w * y from -0.0, one fp32 row to the source's slot [t][me].
  const uint64_t dcall = st->dispatch_calls;
  const size_t dh = DispHalf(p, dcall);
  const int64_t P = p.recv_slots, hidden = p.hidden_dim, stride = a.input_row_stride / 2;
  const uint64_t* dflags =
      reinterpret_cast<const uint64_t*>(c.Local(p.layout.disp_flag)) + LlFlagIndex(dh, W, 0);
  __shared__ int64_t base[kMaxCudaWorldSize + 1];
  if (threadIdx.x == 0) {
    base[0] = 0;
    for (int s = 0; s < W; ++s) {
      base[s + 1] = base[s] + static_cast<int64_t>(CountOf(dflags[s * kLlFlagLanes]));
    }
  }
  __syncthreads();
  const float* weights =
      reinterpret_cast<const float*>(c.Local(p.layout.disp_weights + dh * p.layout.half_weights));
  const int32_t* indices =
      reinterpret_cast<const int32_t*>(c.Local(p.layout.disp_indices + dh * p.layout.half_indices));
  const int32_t* src =
      reinterpret_cast<const int32_t*>(c.Local(p.layout.disp_src + dh * p.layout.half_src));
  const int32_t* disp_pos = reinterpret_cast<const int32_t*>(c.Local(p.layout.disp_pos));
  const uint16_t* y = reinterpret_cast<const uint16_t*>(a.input);
  const int32_t lo = me * E;
  const int64_t Hp = hidden * 4;
  // Items are (received token, 256 columns): a lane sums 8 columns over the token's
  // local slots (16-byte loads where rows allow, all slots' loads issued before their
  // sums) and stores 32 bytes of the fp32 partial into the source. A warp takes a run
  // of consecutive items, so that it looks a token's rows and weights up once, not once
  // per 256 columns.
  constexpr int kCols = 8, kBatch = 4;
  const int64_t chunks = (hidden + 32 * kCols - 1) / (32 * kCols);
  const bool vec =
      hidden % kCols == 0 && stride % kCols == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  const int64_t items = base[W] * chunks, run = (items + nwarps - 1) / nwarps;
  const int64_t first = gwarp * run, last = first + run < items ? first + run : items;
  int64_t cached = -1;
  int s = 0;
  int64_t slot = 0;
  int32_t row = -1;
  float w = 0.0f;
  for (int64_t item = first; item < last; ++item) {
    const int64_t tok = item / chunks, h0 = (item % chunks) * 32 * kCols + lane * kCols;
    if (tok != cached) {
      cached = tok;
      while (tok >= base[s + 1]) ++s;
      slot = s * P + (tok - base[s]);
      // Lane k < K holds slot k's packed row (or -1 when its expert is not here) and weight.
      row = -1;
      w = 0.0f;
      if (lane < K) {
        const int32_t g = indices[slot * K + lane];
        if (g >= lo && g < lo + E) {
          row = disp_pos[slot * K + lane];
          w = weights[slot * K + lane];
        }
      }
    }
    const bool mine = h0 < hidden;
    float acc[kCols];
    for (int i = 0; i < kCols; ++i) acc[i] = kSumStart;
    for (int k0 = 0; k0 < K; k0 += kBatch) {
      int32_t rk[kBatch];
      float wk[kBatch];
      uint4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const bool in = k0 + j < K;
        rk[j] = __shfl_sync(kFull, row, in ? k0 + j : 0);
        wk[j] = __shfl_sync(kFull, w, in ? k0 + j : 0);
        if (!in) rk[j] = -1;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (rk[j] < 0 || !mine) continue;
        const uint16_t* yr = y + static_cast<int64_t>(rk[j]) * stride + h0;
        if (vec) {
          v[j] = *reinterpret_cast<const uint4*>(yr);
        } else {
          uint16_t* vv = reinterpret_cast<uint16_t*>(&v[j]);
          for (int i = 0; i < kCols; ++i) vv[i] = h0 + i < hidden ? yr[i] : 0;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (rk[j] < 0 || !mine) continue;
        const uint16_t* vv = reinterpret_cast<const uint16_t*>(&v[j]);
        for (int i = 0; i < kCols; ++i) {
          acc[i] = __fadd_rn(acc[i], __fmul_rn(wk[j], Bf16BitsToFloat(vv[i])));
        }
      }
    }
    if (!mine) continue;
    float* dst = reinterpret_cast<float*>(c.Peer(ct_off, s) + (src[slot] * W + me) * Hp) + h0;
    if (vec) {
      reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
      for (int i = 0; i < kCols && h0 + i < hidden; ++i) dst[i] = acc[i];
    }
  }
}

// 16-byte words of bf16 per lane a token-major fp8_blockwise send keeps in flight: an
// item is (row, 32 x kLlBlockwiseWords words), 2 KiB of bf16 (kLlMinChunk).
inline constexpr int kLlBlockwiseWords = 4;

// Whether token-major rows quantize word-parallel under fp8_blockwise: rows of whole
// 16-byte words, a scale block a power of two of them up to a warp, 16-byte aligned
// input rows and slot rows (combine_blockwise.cuh in intranode/kernels explains the
// lane groups); else a warp quantizes a row column by column (QuantizeRowWarp).
__device__ __forceinline__ bool BlockwiseWordParallel(const LlParams& p) {
  const LlCombineArgs& a = p.c;
  const int64_t B = BlockwiseBlockElems(p.hidden_dim, a.fp8_block_scale_dim), L = B / 8;
  return p.hidden_dim % 8 == 0 && B % 8 == 0 && L <= 32 && (L & (L - 1)) == 0 &&
         a.input_row_stride % 16 == 0 && reinterpret_cast<uintptr_t>(a.input) % 16 == 0 &&
         p.combine_row_bytes % 16 == 0;
}

// The token-major send under fp8_blockwise (LowLatencyCpu::CombineSendTokenMajor):
// every received row, quantized, to its source's slot [me][t] (own rows too); `area`
// as in CombineSend. Word-parallel items are (row, piece of 32 x kLlBlockwiseWords
// words): the loads of a piece are issued before its stores, a block's largest
// |value| comes from the block_lanes lanes holding it, its first lane stores the
// scale, and piece 0 also stores scale 1 for the blocks past the row.
template <bool kCe, typename Area>
__device__ __forceinline__ void CombineSendBlockwise(const LlParams& p, int64_t total, Area area,
                                                     size_t ct_off, size_t cw_off, int64_t gwarp,
                                                     int64_t nwarps, unsigned lane) {
  const LlCombineArgs& a = p.c;
  const int K = p.top_k, me = p.me, S = a.fp8_block_scale_dim;
  const int64_t M = p.max_tokens, Hc = p.combine_row_bytes, hidden = p.hidden_dim;
  const int64_t so = BlockwiseScalesOffset(hidden);
  const char* input = static_cast<const char*>(a.input);
  const bool words = BlockwiseWordParallel(p);
  const int L = static_cast<int>(BlockwiseBlockElems(hidden, S) / 8);
  const int64_t nwords = hidden / 8;
  const int64_t pieces =
      words ? (nwords + 32 * kLlBlockwiseWords - 1) / (32 * kLlBlockwiseWords) : 1;
  for (int64_t item = gwarp; item < total * pieces; item += nwarps) {
    const int64_t i = item / pieces, pc = item % pieces;
    const int s = static_cast<int>(a.src_pos[i] / M);
    const int64_t t = a.src_pos[i] % M;
    const int64_t slot = (kCe && s != me ? s : me) * M + t;
    char* dst = area(ct_off, s) + slot * Hc;
    const char* src_row = input + i * a.input_row_stride;
    if (words) {
      const uint4* src = reinterpret_cast<const uint4*>(src_row);
      const int64_t w0 = pc * 32 * kLlBlockwiseWords + lane;
      uint4 v[kLlBlockwiseWords];
#pragma unroll
      for (int k = 0; k < kLlBlockwiseWords; ++k) {
        const int64_t w = w0 + k * 32;
        v[k] = w < nwords ? __ldg(src + w) : make_uint4(0, 0, 0, 0);
      }
      uint2* dst8 = reinterpret_cast<uint2*>(dst);
      float* scales = reinterpret_cast<float*>(dst + so);
      static_assert(kLlBlockwiseWords % 2 == 0, "words are quantized two at a time");
#pragma unroll
      for (int k0 = 0; k0 < kLlBlockwiseWords; k0 += 2) {
        uint32_t m[2];
        GroupMaxAbs2(v[k0], v[k0 + 1], L, m[0], m[1]);  // the maxima of two words at once
#pragma unroll
        for (int k = k0; k < k0 + 2; ++k) {
          const int64_t w = w0 + k * 32;
          if (w < nwords) {
            const Fp8BlockScale sc = Fp8BlockScaleOf(static_cast<uint16_t>(m[k - k0]));
            dst8[w] = QuantizeWord(v[k], sc);
            if ((lane & (L - 1)) == 0) scales[w >> (__ffs(L) - 1)] = sc.scale;  // L: a power of two
          }
        }
      }
      if (pc == 0) {
        for (int64_t b = (nwords + L - 1) / L + lane; b < S; b += 32) scales[b] = 1.0f;
      }
    } else {
      QuantizeRowWarp(reinterpret_cast<const uint16_t*>(src_row), hidden, S, dst, lane);
    }
    if (pc == 0 && a.weights != nullptr && lane < K) {
      reinterpret_cast<float*>(area(cw_off, s))[slot * K + lane] = a.weights[i * K + lane];
    }
  }
}

// kLlPartials: the pre-reduced expert-major combine (LlCombineArgs::pre_reduce);
// kLlCopyEngine: a copy-engine op's combine (token-major rows for other pes go to the
// staging, the host copies them; every combine of such an op uses half 0).
// kBlockwise: a token-major combine under fp8_blockwise (the bf16 kernels carry none
// of its code).
template <int kVariant, bool kBlockwise>
__device__ void CombineSend(const LlParams& p, uint64_t call) {
  constexpr bool kPartials = CombinePartials<kVariant>, kCe = kVariant == kLlCopyEngine;
  constexpr bool ce = CombineCe<kVariant>;
  const Ctx c{p};
  const LlCombineArgs& a = p.c;
  const int W = p.world, K = p.top_k, E = p.experts_per_rank, me = p.me;
  const int64_t M = p.max_tokens, WM = W * M, Hc = p.combine_row_bytes;
  const size_t half = ce ? 0 : (call & 1);
  uint64_t* stamps = p.stamps[kLlPartCombineSend];
  Stamp(stamps, 0);
  if constexpr (ce) {
    WaitCombConsumed(p, call);
    Stamp(stamps, 1);
  }
  const size_t ct_off = p.layout.comb_tokens + half * p.layout.half_comb_tokens;
  const size_t cw_off = p.layout.comb_weights + half * p.layout.half_comb_weights;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  const char* input = static_cast<const char*>(a.input);
  LlDeviceState* st = c.State();
  if (a.layout == LlLayout::kTokenMajor) {
    const int64_t total = *p.total_recv;
    if (total > a.input_rows) {
      if (blockIdx.x == 0 && threadIdx.x == 0) {
        printf(
            "mori.ep low-latency combine on rank %d: input has %lld rows, fewer than "
            "total_recv %lld\n",
            me, static_cast<long long>(a.input_rows), static_cast<long long>(total));
        dev::TrapReported();
      }
      dev::TrapAfterReport();
    }
    const int64_t eb = CombineElementBytes(a.dtype);
    // Copy engines: rows for other pes into the staging (slot [s][t]), copied after.
    const auto area = [&](size_t off, int s) -> char* {
      return kCe && s != me ? p.stage_comb + (off - p.layout.comb_tokens) : c.Peer(off, s);
    };
    if constexpr (kBlockwise) {
      CombineSendBlockwise<kCe>(p, total, area, ct_off, cw_off, gwarp, nwarps, lane);
    } else {
      const int64_t C = RowChunks(total, nwarps, p.hidden_dim * eb);
      for (int64_t item = gwarp; item < total * C; item += nwarps) {
        const int64_t i = item / C, ch = item % C;
        const int s = static_cast<int>(a.src_pos[i] / M);
        const int64_t t = a.src_pos[i] % M;
        const int64_t slot = (kCe && s != me ? s : me) * M + t;
        CopyChunk(area(ct_off, s) + slot * Hc, input + i * a.input_row_stride, p.hidden_dim * eb,
                  ch, C, lane);
        if (ch == 0 && a.weights != nullptr && lane < K) {
          reinterpret_cast<float*>(area(cw_off, s))[slot * K + lane] = a.weights[i * K + lane];
        }
      }
    }
  } else if constexpr (kPartials) {
    CombineSendPartials(p, ct_off);
  } else {
    // Only the rows that exist: each block sums every expert's rows over the sources
    // (layout_range) and a warp scans them into prefix[], then a warp per row finds its
    // expert by bisection and its source among W ranges.
    __shared__ int64_t prefix[kLlMaxScanExperts + 1];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      int64_t total = 0;
      for (int s2 = 0; s2 < W; ++s2) total += a.layout_range[e * W + s2] & 0xFFFFFFFF;
      prefix[e + 1] = total;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      int64_t carry = 0;
      for (int b0 = 0; b0 < E; b0 += 32) {
        int64_t v = b0 + lane < E ? prefix[b0 + lane + 1] : 0;
        for (int o = 1; o < 32; o <<= 1) {
          const int64_t u = __shfl_up_sync(kFull, v, o);
          if (lane >= o) v += u;
        }
        if (b0 + lane < E) prefix[b0 + lane + 1] = v + carry;
        carry += __shfl_sync(kFull, v, 31);
      }
      if (lane == 0) prefix[0] = 0;
    }
    __syncthreads();
    const int64_t C = RowChunks(prefix[E], nwarps, p.hidden_dim * 2);
    for (int64_t piece = gwarp; piece < prefix[E] * C; piece += nwarps) {
      const int64_t item = piece / C, ch = piece % C;
      int lo = 0, hi = E;  // the expert e with prefix[e] <= item < prefix[e + 1]
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (prefix[mid] <= item) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      const int e = lo;
      const int64_t pos = item - prefix[e];
      int s = -1;
      for (int s2 = 0; s2 < W; ++s2) {
        const int64_t range = a.layout_range[e * W + s2];
        const int64_t b = range >> 32, cnt = range & 0xFFFFFFFF;
        if (pos >= b && pos < b + cnt) s = s2;
      }
      if (s < 0) continue;
      const int64_t r = e * WM + pos;
      const int64_t t = a.src_info[r] - s * a.src_info_stride;
      const int64_t slot = t * K + a.slot_k[r];
      CopyChunk(c.Peer(ct_off, s) + slot * Hc, input + r * a.input_row_stride, p.hidden_dim * 2, ch,
                C, lane);
    }
  }
  Stamp(stamps, 2);
  uint64_t* flags =
      reinterpret_cast<uint64_t*>(c.Local(p.layout.comb_flag)) + LlFlagIndex(half, W, 0);
  const uint64_t word = LlCombineWord(call, LlCombineTag(p.c), LlCombineWeights(p.c));
  if constexpr (!ce) {
    // Every block announces its own rows into its flag lanes, released after them.
    dev::Quiet();
    __syncthreads();
    PostLanes(p, flags, word, true);
    Stamp(stamps, 3);
  }
  // The grid's last block advances the call counter (every block has read it by now);
  // a copy-engine op's flags (lane 0) go with it, or to the host's copies. A launch
  // that receives too leaves the counter to its receive phase (CombineRecv).
  if (!ce && (p.phases & kLlCombineRecv)) return;
  if (FinishBlock(&st->blocks_done)) {
    if (ce && threadIdx.x < W) {
      if (kCe && a.layout == LlLayout::kTokenMajor && threadIdx.x != me) {
        p.stage_comb_flags[threadIdx.x] = word;  // the host copies it after the rows
      } else {
        dev::SignalSet(p.ctx, &flags[me * kLlFlagLanes], word, threadIdx.x);
      }
    }
    if (threadIdx.x == 0) st->combine_calls = call;
    if (ce) Stamp(stamps, 3);
  }
}

// Up to 32 bytes by one thread: 16-, 8- or 4-byte accesses where both ends allow.
__device__ __forceinline__ void CopySmall(char* dst, const char* src, int64_t n) {
  const uintptr_t both = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  int64_t i = 0;
  if ((both & 15) == 0) {
    for (; i + 16 <= n; i += 16) {
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
    }
  } else if ((both & 7) == 0) {
    for (; i + 8 <= n; i += 8) {
      *reinterpret_cast<uint2*>(dst + i) = *reinterpret_cast<const uint2*>(src + i);
    }
  } else if ((both & 3) == 0) {
    for (; i + 4 <= n; i += 4) {
      *reinterpret_cast<uint32_t*>(dst + i) = *reinterpret_cast<const uint32_t*>(src + i);
    }
  }
  for (; i < n; ++i) dst[i] = src[i];
}

__device__ __forceinline__ void StoreValue(void* out, int64_t i, float v, CombineDtype dtype) {
  switch (dtype) {
    case CombineDtype::kBFloat16:
      static_cast<uint16_t*>(out)[i] = FloatToBf16Bits(v);
      return;
    case CombineDtype::kFloat8E4M3:
      static_cast<uint8_t*>(out)[i] = FloatToFloat8E4M3(v);
      return;
    case CombineDtype::kFloat32:
    case CombineDtype::kFloat4E2M1x2:  // refused on CUDA before a launch (LowLatencyCuda)
      break;
  }
  static_cast<float*>(out)[i] = v;
}

// Columns [h0, h0 + 8) of my token t under fp8_blockwise (CombineTokenRowFp8Blockwise),
// column by column (rows that are not word-parallel; ReduceBlockwiseWordItems takes
// the others): each part's fp8 values times its block's scale, summed in fp32 from -0.0
// in ascending pe order, rounded once to bf16; no part: zeros.
__device__ __forceinline__ void ReduceBlockwiseColumns(const LlParams& p, const char* comb,
                                                       const uint8_t* ranks, int64_t t,
                                                       int64_t h0) {
  const LlCombineArgs& a = p.c;
  const int W = p.world;
  const int64_t M = p.max_tokens, Hc = p.combine_row_bytes, hidden = p.hidden_dim;
  const int64_t B = BlockwiseBlockElems(hidden, a.fp8_block_scale_dim);
  const int64_t so = BlockwiseScalesOffset(hidden);
  uint16_t* out = static_cast<uint16_t*>(a.out) + t * hidden + h0;
  bool any = false;
  for (int d = 0; d < W; ++d) any |= ranks[d] != 0;
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = any ? kSumStart : 0.0f;
  const int64_t cols = hidden - h0 < 8 ? hidden - h0 : 8;
  for (int d = 0; d < W; ++d) {
    if (!ranks[d]) continue;
    const char* row = comb + (d * M + t) * Hc;
    for (int i = 0; i < cols; ++i) {
      const float scale = LoadScaleBytes(row + so + 4 * ((h0 + i) / B));
      acc[i] = AddRn(acc[i], Fp8BlockDequantize(static_cast<uint8_t>(__ldcg(row + h0 + i)), scale));
    }
  }
  for (int i = 0; i < cols; ++i) out[i] = FloatToBf16Bits(acc[i]);
}

// Token t's combined weights in the two-item fp8_blockwise receive (CombineTokenWeights,
// as CombineRecv's item loop combines them): lane k < K sums slot k over the pes the
// token went to, ascending; one part: its value; none: 0.
__device__ __forceinline__ void CombineTokenWeightsLl(const LlParams& p, const float* combw,
                                                      const uint8_t* token_ranks, int64_t t,
                                                      int lane) {
  const LlCombineArgs& a = p.c;
  const int W = p.world, K = p.top_k;
  const int64_t M = p.max_tokens;
  if (a.out_weights == nullptr || lane >= K) return;
  int parts = 0;
  for (int d = 0; d < W; ++d) parts += token_ranks[t * W + d] != 0;
  float acc = parts == 0 ? 0.0f : kSumStart;
  for (int d = 0; d < W; ++d) {
    if (!token_ranks[t * W + d]) continue;
    const float w = combw[(d * M + t) * K + lane];
    acc = parts == 1 ? w : __fadd_rn(acc, w);
  }
  a.out_weights[t * K + lane] = acc;
}

// Items it[0] and it[1] of the token-major receive under fp8_blockwise ((token, 256
// columns), 8 per lane, as in CombineRecv; an item at or past `items` is none) on
// word-parallel rows (whole 8-column pieces within a block, 8-byte aligned slot rows, a
// 16-byte aligned output): per part one 8-byte load and one scale, the sums as
// ReduceBlockwiseColumns's. Every part's loads of both items are issued before either
// item's sums and stores, so a warp waits one latency chain (routing bytes, then
// parts) per two items.
__device__ __forceinline__ void ReduceBlockwiseWordItems(const LlParams& p, const char* comb,
                                                         const uint8_t* token_ranks, int64_t chunks,
                                                         int64_t items, const int64_t (&it)[2],
                                                         int lane) {
  const LlCombineArgs& a = p.c;
  const int W = p.world;
  const int64_t M = p.max_tokens, Hc = p.combine_row_bytes, hidden = p.hidden_dim;
  const int64_t B = BlockwiseBlockElems(hidden, a.fp8_block_scale_dim);
  const int64_t so = BlockwiseScalesOffset(hidden);
  int64_t t[2], h0[2];
  bool live[2];
  uint32_t parts[2] = {0, 0};  // bit d: the token went to pe d
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    t[j] = it[j] / chunks;
    h0[j] = (it[j] % chunks) * 256 + lane * 8;
    live[j] = it[j] < items && h0[j] < hidden;
    if (!live[j]) continue;
#pragma unroll
    for (int d = 0; d < kMaxCudaWorldSize; ++d) {
      if (d < W && token_ranks[t[j] * W + d]) parts[j] |= 1u << d;
    }
  }
  uint2 q[2][kMaxCudaWorldSize];
  float sc[2][kMaxCudaWorldSize];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int d = 0; d < kMaxCudaWorldSize; ++d) {
      q[j][d] = make_uint2(0, 0);
      sc[j][d] = 0.0f;
      if (parts[j] >> d & 1u) {
        const char* row = comb + (d * M + t[j]) * Hc;
        q[j][d] = __ldcg(reinterpret_cast<const uint2*>(row + h0[j]));
        sc[j][d] = __ldcg(reinterpret_cast<const float*>(row + so) + h0[j] / B);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (!live[j]) continue;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = parts[j] ? kSumStart : 0.0f;
    const int first = __ffs(parts[j]) - 1;  // its sum from -0.0 is one fused step
#pragma unroll
    for (int d = 0; d < kMaxCudaWorldSize; ++d) {
      if (parts[j] >> d & 1u) {
        float x[8];
        Fp8WordValues(q[j][d], x);
        AccumulateParts(acc, x, sc[j][d], d == first);
      }
    }
    uint32_t o[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) o[v] = SumsToBf16x2(acc[2 * v], acc[2 * v + 1]);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.out) + t[j] * hidden + h0[j]) =
        make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// ----------------------------------------------------------- combine receive
template <int kVariant, bool kBlockwise>
__device__ void CombineRecv(const LlParams& p, uint64_t call) {
  constexpr bool kPartials = CombinePartials<kVariant>;
  constexpr bool ce = CombineCe<kVariant>;
  const Ctx c{p};
  const LlCombineArgs& a = p.c;
  const int W = p.world, K = p.top_k;
  const int64_t M = p.max_tokens, hidden = p.hidden_dim, Hc = p.combine_row_bytes;
  const size_t half = ce ? 0 : (call & 1);
  __shared__ int64_t counts[kMaxCudaWorldSize];
  __shared__ int rejected_by;
  uint64_t* stamps = p.stamps[kLlPartCombineRecv];
  Stamp(stamps, 0);
  const uint64_t* flags =
      reinterpret_cast<const uint64_t*>(c.Local(p.layout.comb_flag)) + LlFlagIndex(half, W, 0);
  WaitFlags(p, flags, call, counts, &rejected_by, LlCombineTag(p.c), false, ce ? 1 : kLlFlagLanes,
            LlCombineWeights(p.c));
  // A fused launch's counter (CombineSend left it): every block posted its lanes, so
  // every block read the counter before this store.
  if (!ce && (p.phases & kLlCombineSend) && blockIdx.x == 0 && threadIdx.x == 0) {
    c.State()->combine_calls = call;
  }
  if (rejected_by >= 0) TrapRejected(p, rejected_by, "combine", nullptr, call);
  Stamp(stamps, 1);
  const char* comb = c.Local(p.layout.comb_tokens + half * p.layout.half_comb_tokens);
  const float* combw = reinterpret_cast<const float*>(
      c.Local(p.layout.comb_weights + half * p.layout.half_comb_weights));
  const uint8_t* token_ranks = reinterpret_cast<const uint8_t*>(c.Local(p.layout.token_ranks));
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  if (a.layout == LlLayout::kTokenMajor) {
    const int64_t n = p.combine_tokens;
    const int64_t eb = CombineElementBytes(a.dtype), row_bytes = hidden * eb;
    // Items are (token, 256 columns), 8 per lane, so that a few tokens still spread
    // over many warps (a warp per token walked a 7168-column row alone) while each item
    // moves 16 bytes per lane per part (4 columns per lane cost a load latency per 8 B).
    constexpr int kCols = 8;  // per lane: a 256-column item, one 16-byte load per bf16 part
    const int64_t chunks = (hidden + 32 * kCols - 1) / (32 * kCols);
    bool words = false;
    if constexpr (kBlockwise) {
      words = hidden % 8 == 0 && BlockwiseBlockElems(hidden, a.fp8_block_scale_dim) % 8 == 0 &&
              Hc % 8 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
    }
    // fp8_blockwise, word-parallel: two items per warp at once, each with its weights
    // (the loop below also takes the column-by-column case and the other dtypes).
    if (kBlockwise && words) {
      static_assert(32 * kCols == 256, "ReduceBlockwiseWordItems takes 256-column items");
      for (int64_t item = gwarp; item < n * chunks; item += 2 * nwarps) {
        const int64_t it[2] = {item, item + nwarps};
        ReduceBlockwiseWordItems(p, comb, token_ranks, chunks, n * chunks, it, lane);
        for (int j = 0; j < 2; ++j) {
          if (it[j] < n * chunks && it[j] % chunks == 0) {
            CombineTokenWeightsLl(p, combw, token_ranks, it[j] / chunks, lane);
          }
        }
      }
    }
    for (int64_t item = gwarp; !(kBlockwise && words) && item < n * chunks; item += nwarps) {
      const int64_t t = item / chunks, h0 = (item % chunks) * 32 * kCols + lane * kCols;
      // As CombineTokenRow / CombineTokenWeights (common/numeric.hpp): no part: zeros; one
      // part: its bytes; else an fp32 sum from -0.0 in ascending pe order.
      int parts = 0, only = 0;
      for (int d = 0; d < W; ++d) {
        if (token_ranks[t * W + d]) ++parts, only = d;
      }
      if constexpr (kBlockwise) {
        if (h0 < hidden) ReduceBlockwiseColumns(p, comb, token_ranks + t * W, t, h0);
      } else if (h0 < hidden) {
        const int64_t cols = hidden - h0 < kCols ? hidden - h0 : kCols;
        char* o = static_cast<char*>(a.out) + t * row_bytes + h0 * eb;
        if (parts == 0) {
          for (int64_t i = 0; i < cols * eb; ++i) o[i] = 0;
        } else if (CopiesSinglePart(parts, a.fp8_cast)) {
          CopySmall(o, comb + (only * M + t) * Hc + h0 * eb, cols * eb);
        } else {
          float acc[kCols];
          for (int i = 0; i < kCols; ++i) acc[i] = kSumStart;
          for (int d = 0; d < W; ++d) {
            if (!token_ranks[t * W + d]) continue;
            const char* row = comb + (d * M + t) * Hc;
            for (int i = 0; i < cols; ++i) {
              acc[i] = __fadd_rn(acc[i], CombineElementValue(row, h0 + i, a.dtype, a.fp8_cast));
            }
          }
          for (int i = 0; i < cols; ++i) StoreValue(a.out, t * hidden + h0 + i, acc[i], a.dtype);
        }
      }
      if (item % chunks == 0 && a.out_weights != nullptr && lane < K) {
        float acc = parts == 0 ? 0.0f : kSumStart;
        for (int d = 0; d < W; ++d) {
          if (!token_ranks[t * W + d]) continue;
          const float w = combw[(d * M + t) * K + lane];
          acc = parts == 1 ? w : __fadd_rn(acc, w);
        }
        a.out_weights[t * K + lane] = acc;
      }
    }
    Stamp(stamps, 2);
    PostConsumed<ce>(p, call, true);  // every block gets here
    Stamp(stamps, 3);
    return;
  }
  if constexpr (kPartials) {
    // The partials of the pes each token went to, ascending pe (low_latency/cpu.cpp);
    // items are (token, 256 columns), 8 per lane (two 16-byte loads per part where rows
    // allow), four parts' loads issued before their sums.
    constexpr int kCols = 8;
    const int64_t Hp = hidden * 4;
    const int64_t chunks = (hidden + 32 * kCols - 1) / (32 * kCols);
    const bool vec = hidden % kCols == 0;
    uint16_t* out = static_cast<uint16_t*>(a.out);
    for (int64_t item = gwarp; item < a.num_tokens * chunks; item += nwarps) {
      const int64_t t = item / chunks, h0 = (item % chunks) * 32 * kCols + lane * kCols;
      if (h0 >= hidden) continue;
      bool any = false;
      for (int d = 0; d < W; ++d) any |= token_ranks[t * W + d] != 0;
      float acc[kCols];
      for (int i = 0; i < kCols; ++i) acc[i] = any ? kSumStart : 0.0f;
      for (int d0 = 0; d0 < W; d0 += 4) {
        float v[4][kCols];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int d = d0 + j;
          if (d >= W || !token_ranks[t * W + d]) continue;
          const float* part = reinterpret_cast<const float*>(comb + (t * W + d) * Hp) + h0;
          if (vec) {
            reinterpret_cast<float4*>(v[j])[0] = reinterpret_cast<const float4*>(part)[0];
            reinterpret_cast<float4*>(v[j])[1] = reinterpret_cast<const float4*>(part)[1];
          } else {
            for (int i = 0; i < kCols; ++i) v[j][i] = h0 + i < hidden ? part[i] : 0.0f;
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int d = d0 + j;
          if (d >= W || !token_ranks[t * W + d]) continue;
          for (int i = 0; i < kCols; ++i) acc[i] = __fadd_rn(acc[i], v[j][i]);
        }
      }
      for (int i = 0; i < kCols && h0 + i < hidden; ++i) {
        out[t * hidden + h0 + i] = FloatToBf16Bits(acc[i]);
      }
    }
    Stamp(stamps, 2);
    PostConsumed<ce>(p, call, true);  // every block gets here
    Stamp(stamps, 3);
  } else {
    // Items are (token, 256 columns), 8 per lane; lane k < K holds slot k's id and
    // weight. No part: zeros; else a sum from -0.0 over k ascending (low_latency/cpu.cpp).
    // The loads of eight slots are issued before their sums (one 16-byte load per slot
    // where rows allow), so an item costs a load latency per eight slots, not per slot.
    constexpr int kCols = 8, kBatch = 4;
    const int64_t chunks = (hidden + 32 * kCols - 1) / (32 * kCols);
    const bool vec =
        hidden % kCols == 0 && Hc % 16 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
    uint16_t* out = static_cast<uint16_t*>(a.out);
    for (int64_t item = gwarp; item < a.num_tokens * chunks; item += nwarps) {
      const int64_t t = item / chunks, h0 = (item % chunks) * 32 * kCols + lane * kCols;
      const bool mine = h0 < hidden;
      int32_t g = -1;
      float w = 1.0f;
      if (lane < K) {
        g = a.topk_idx[t * K + lane];
        if (a.topk_weights != nullptr) w = a.topk_weights[t * K + lane];
      }
      const bool any = __any_sync(kFull, lane < K && g >= 0);
      float acc[kCols];
      for (int i = 0; i < kCols; ++i) acc[i] = any ? kSumStart : 0.0f;
      for (int k0 = 0; k0 < K; k0 += kBatch) {
        int32_t gk[kBatch];
        float wk[kBatch];
        uint4 v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const bool in = k0 + j < K;
          gk[j] = __shfl_sync(kFull, g, in ? k0 + j : 0);
          wk[j] = __shfl_sync(kFull, w, in ? k0 + j : 0);
          if (!in) gk[j] = -1;
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (gk[j] < 0 || !mine) continue;
          const uint16_t* y = reinterpret_cast<const uint16_t*>(comb + (t * K + k0 + j) * Hc) + h0;
          if (vec) {
            v[j] = *reinterpret_cast<const uint4*>(y);
          } else {
            uint16_t* vv = reinterpret_cast<uint16_t*>(&v[j]);
            for (int i = 0; i < kCols; ++i) vv[i] = h0 + i < hidden ? y[i] : 0;
          }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (gk[j] < 0 || !mine) continue;
          const uint16_t* vv = reinterpret_cast<const uint16_t*>(&v[j]);
          for (int i = 0; i < kCols; ++i) {
            acc[i] = __fadd_rn(acc[i], __fmul_rn(wk[j], Bf16BitsToFloat(vv[i])));
          }
        }
      }
      if (!mine) continue;
      if (vec) {
        uint16_t o[kCols];
        for (int i = 0; i < kCols; ++i) o[i] = FloatToBf16Bits(acc[i]);
        *reinterpret_cast<uint4*>(out + t * hidden + h0) = *reinterpret_cast<const uint4*>(o);
      } else {
        for (int i = 0; i < kCols && h0 + i < hidden; ++i) {
          out[t * hidden + h0 + i] = FloatToBf16Bits(acc[i]);
        }
      }
    }
    Stamp(stamps, 2);
    PostConsumed<ce>(p, call, true);
    Stamp(stamps, 3);
  }
}

template <int kVariant, bool kBlockwise = false>
__global__ void __launch_bounds__(kLlMaxWarps * 32, 1)
    LowLatencyCombineKernel(const __grid_constant__ LlParams p) {
  constexpr bool kCe = kVariant == kLlCopyEngine;
  LlDeviceState* st = Ctx{p}.State();
  if (p.phases & kLlRejectCombine) return Reject<kCe>(p, false);
  const uint64_t ccall = st->combine_calls + ((p.phases & kLlCombineSend) ? 1 : 0);
  __syncthreads();
  if (p.phases & kLlCombineSend) CombineSend<kVariant, kBlockwise>(p, ccall);
  if (p.phases & kLlCombineRecv) CombineRecv<kVariant, kBlockwise>(p, ccall);
}

}  // namespace

void LaunchCombine(const LlParams& p, int blocks, int threads, uintptr_t stream) {
  auto kernel = LowLatencyCombineKernel<kLlDefault>;
  if (p.c.pre_reduce && (p.phases & kLlRejectCombine) == 0) {
    kernel = p.copy_engine ? LowLatencyCombineKernel<kLlPartialsCe>
                           : LowLatencyCombineKernel<kLlPartials>;
  } else if (p.c.fp8_block_scale_dim > 0 && (p.phases & kLlRejectCombine) == 0) {
    // fp8_blockwise: token-major only (LowLatencyCuda::CombineSend refuses the rest).
    kernel = p.copy_engine ? LowLatencyCombineKernel<kLlCopyEngine, true>
                           : LowLatencyCombineKernel<kLlDefault, true>;
  } else if (p.copy_engine) {
    kernel = LowLatencyCombineKernel<kLlCopyEngine>;
  }
  kernel<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::low_latency
