// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The row operations of the intra-node combine under MORI's fp8_blockwise
// (kWireBlockwise; common/numeric.hpp): a received bf16 row returned to its source as
// fp8 e4m3 blocks with one fp32 scale each (BlockwiseRowBytes), and a token's row
// reduced from such rows. The blocks, scales and sums are the CPU implementation's
// (QuantizeRowFp8Blockwise, CombineTokenRowFp8Blockwise: Fp8BlockScaleOf,
// Fp8BlockQuantize, Fp8BlockDequantize, one fp32 rounding per product and per sum),
// hence its bits. My own part stays in the combine input as bf16 and is quantized
// where it is reduced, as the CPU implementation quantizes it.
//
// With p.vec a scale block is p.block_lanes 16-byte words of bf16 (8 columns each, a
// power of two <= 32), and a warp's lane l always holds a word w with w % 32 == l, so
// the lanes of one block are the aligned group of block_lanes lanes holding its words:
// the block's largest |value| is a butterfly over that group (log2 block_lanes
// shuffles, two words' maxima per shuffle as 16-bit halves), and every lane keeps
// several 16-byte loads in flight. Conversions are the sm_89+ hardware ones, whose
// bits are the host rule's (common/fp8_blockwise.cuh says why). Other layouts (a
// block not a whole number of such words, rows not 16-byte aligned) go block by block,
// a lane per column. Included by combine_rows.cuh only; internal linkage.

#include "common/fp8_blockwise.cuh"
#include "intranode/kernels/device.cuh"

namespace mori::ep::intranode {

namespace {

// Segment `seg` of received row i (bf16, 16-byte words) to slot row `dst` of its
// source: the segment's words as 8 fp8 bytes each, and the scale of each block by the
// block's first lane; with segment 0 also scale 1 for the blocks past the row (as the
// host writes every block's scale). The segment's words are loaded before any store.
template <int kSeg>
__device__ __forceinline__ void ReturnBlockwiseSegment(const CombineParams& p, int64_t i, char* dst,
                                                       int seg, unsigned lane) {
  const int64_t nwords = p.row_bytes / 16;
  const int4* src = reinterpret_cast<const int4*>(p.input + i * p.input_row_stride);
  const int sw = p.ret_seg_words, L = p.block_lanes;
  const int64_t w0 = static_cast<int64_t>(seg) * sw * 32 + lane;
  uint4 v[kSeg];
#pragma unroll
  for (int k = 0; k < kSeg; ++k) {
    const int64_t w = w0 + k * 32;
    const int4 x = k < sw && w < nwords ? __ldg(src + w) : make_int4(0, 0, 0, 0);
    v[k] = make_uint4(x.x, x.y, x.z, x.w);
  }
  uint2* dst8 = reinterpret_cast<uint2*>(dst);
  float* scales = reinterpret_cast<float*>(dst + p.scales_offset);
  static_assert(kSeg % 2 == 0, "words are quantized two at a time");
#pragma unroll
  for (int k0 = 0; k0 < kSeg; k0 += 2) {
    if (k0 >= sw) break;  // sw is the warp's: every lane takes part in the shuffles
    uint32_t m[2];
    GroupMaxAbs2(v[k0], v[k0 + 1], L, m[0], m[1]);  // v[k0 + 1] is zeros past sw
#pragma unroll
    for (int k = k0; k < k0 + 2; ++k) {
      const int64_t w = w0 + k * 32;
      if (k < sw && w < nwords) {
        const Fp8BlockScale s = Fp8BlockScaleOf(static_cast<uint16_t>(m[k - k0]));
        dst8[w] = QuantizeWord(v[k], s);
        if ((lane & (L - 1)) == 0) scales[w / L] = s.scale;
      }
    }
  }
  if (seg == 0) {
    const int64_t used = (nwords + L - 1) / L;
    for (int64_t b = used + lane; b < p.scale_dim; b += 32) scales[b] = 1.0f;
  }
}

// Received row i to slot row `dst` of its source by QuantizeRowWarp (any layout).
__device__ __forceinline__ void ReturnBlockwiseRowScalar(const CombineParams& p, int64_t i,
                                                         char* dst, unsigned lane) {
  QuantizeRowWarp(reinterpret_cast<const uint16_t*>(p.input + i * p.input_row_stride), p.hidden,
                  p.scale_dim, dst, lane);
}

// The wire row pe d returned for my token t (d != me).
__device__ __forceinline__ const char* BlockwisePeerRow(const CombineParams& p, int d, int64_t t) {
  return At<char>(p.c, p.c.layout.comb_tokens) +
         (static_cast<int64_t>(d) * p.c.max_tokens + t) * p.combine_row_bytes;
}

// Words [seg * kU * 32, ...) of my token t's bf16 output: the dequantized parts of the
// pes it went to, ascending, summed in fp32 from -0.0 and rounded once; no part:
// zeros. My own part's kU words are loaded at once and quantized first (kU is
// kReduceItemWords: 8 in the 512-thread build); the sums then take the segment's words
// kC at a time (kU words of accumulators, fp8 words and scales would spill), pes two at
// a time, so 2 x kC part loads and their scales are in flight.
template <int kU>
__device__ __forceinline__ void ReduceBlockwiseSegment(const CombineParams& p, int64_t t, int seg,
                                                       unsigned lane) {
  constexpr int kC = kU >= 4 ? 2 : 1;
  const Common& c = p.c;
  const int W = c.world, L = p.block_lanes;
  const uint8_t* ranks = p.token_ranks + t * W;
  const int64_t self_row = p.token_self_row[t];
  const int64_t nwords = p.row_bytes / 16;
  uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.out) + t * p.row_bytes);
  int parts = 0;
  for (int d = 0; d < W; ++d) parts += ranks[d] != 0;
  if (parts == 0) {
    const int64_t w0 = static_cast<int64_t>(seg) * kU * 32 + lane;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      if (w0 + k * 32 < nwords) out[w0 + k * 32] = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const bool own = ranks[c.me] != 0;
  const uint4* mine = reinterpret_cast<const uint4*>(p.input + self_row * p.input_row_stride);
  const char* row0 = At<char>(c, c.layout.comb_tokens) + t * p.combine_row_bytes;
  const int64_t pe_stride = c.max_tokens * p.combine_row_bytes;
  const int64_t ws = static_cast<int64_t>(seg) * kU * 32 + lane;
  // My own part, quantized here as the host quantizes it (its blocks' maxima need every
  // lane of a group, so the whole warp takes part), held as fp8 words: all kU words'
  // loads are issued at once, then the maxima of two words per shuffle.
  uint2 own_q[kU];
  float own_s[kU];
#pragma unroll
  for (int k = 0; k < kU; ++k) own_q[k] = make_uint2(0, 0), own_s[k] = 0.0f;
  if (own) {
    uint4 raw[kU + kU % 2];
#pragma unroll
    for (int k = 0; k < kU + kU % 2; ++k) {
      const int64_t w = ws + k * 32;
      raw[k] = k < kU && w < nwords ? __ldcg(mine + w) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kU; k += 2) {
      if (ws - lane + k * 32 >= nwords) break;  // the warp's words are past the row
      uint32_t m[2];
      GroupMaxAbs2(raw[k], raw[k + 1], L, m[0], m[1]);
#pragma unroll
      for (int j = 0; j < 2 && k + j < kU; ++j) {
        const Fp8BlockScale s = Fp8BlockScaleOf(static_cast<uint16_t>(m[j]));
        own_q[k + j] = QuantizeWord(raw[k + j], s);
        own_s[k + j] = s.scale;
      }
    }
  }
#pragma unroll
  for (int k0 = 0; k0 < kU; k0 += kC) {
    const int64_t w0 = ws + k0 * 32;
    if (w0 - lane >= nwords) break;  // the warp's words are past the row
    float acc[kC][8];
#pragma unroll
    for (int k = 0; k < kC; ++k) {
#pragma unroll
      for (int v = 0; v < 8; ++v) acc[k][v] = kSumStart;
    }
#pragma unroll
    for (int d0 = 0; d0 < kW; d0 += 2) {
      if (d0 >= W) break;
      uint2 q[2][kC];
      float sc[2][kC];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int d = d0 + j;
        const bool peer = d < W && d != c.me && ranks[d] != 0;
        const char* row = row0 + d * pe_stride;
        const float* scales = reinterpret_cast<const float*>(row + p.scales_offset);
#pragma unroll
        for (int k = 0; k < kC; ++k) {
          const int64_t w = w0 + k * 32;
          q[j][k] = own_q[k0 + k];
          sc[j][k] = own_s[k0 + k];
          if (peer && w < nwords) {
            q[j][k] = __ldcg(reinterpret_cast<const uint2*>(row) + w);
            sc[j][k] = __ldcg(scales + w / L);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (d0 + j < W && ranks[d0 + j] != 0) {
#pragma unroll
          for (int k = 0; k < kC; ++k) AccumulateFp8Word(acc[k], q[j][k], sc[j][k]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kC; ++k) {
      const int64_t w = w0 + k * 32;
      if (w < nwords) {
        uint32_t o[4];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          o[v] = SumsToBf16x2(acc[k][2 * v], acc[k][2 * v + 1]);
        }
        out[w] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
}

// My token t's whole row, block by block, a lane per column (any layout): my own
// part's block scale from a warp maximum, then per column the parts in ascending pe
// order.
__device__ void ReduceBlockwiseTokenScalar(const CombineParams& p, int64_t t, unsigned lane) {
  const Common& c = p.c;
  const int W = c.world;
  const uint8_t* ranks = p.token_ranks + t * W;
  const int64_t self_row = p.token_self_row[t];
  const int64_t H = p.hidden, B = p.block_elems;
  uint16_t* out = reinterpret_cast<uint16_t*>(static_cast<char*>(p.out) + t * p.row_bytes);
  int parts = 0;
  for (int d = 0; d < W; ++d) parts += ranks[d] != 0;
  if (parts == 0) {
    for (int64_t h = lane; h < H; h += 32) out[h] = 0;
    return;
  }
  const bool own = ranks[c.me] != 0;
  const uint16_t* mine = reinterpret_cast<const uint16_t*>(p.input + self_row * p.input_row_stride);
  for (int b = 0; b < p.scale_dim && b * B < H; ++b) {
    const int64_t lo = b * B, hi = lo + B < H ? lo + B : H;
    Fp8BlockScale s_own{false, 1.0f, 1.0f};
    if (own) {
      uint32_t m = 0;
      for (int64_t h = lo + lane; h < hi; h += 32) m = max(m, __ldcg(mine + h) & 0x7FFFu);
      s_own = Fp8BlockScaleOf(static_cast<uint16_t>(__reduce_max_sync(kFull, m)));
    }
    for (int64_t h = lo + lane; h < hi; h += 32) {
      float acc = kSumStart;
      for (int d = 0; d < W; ++d) {
        if (!ranks[d]) continue;
        if (d == c.me) {
          const uint8_t q = Fp8BlockQuantize(__ldcg(mine + h), s_own);
          acc = AddRn(acc, Fp8BlockDequantize(q, s_own.scale));
        } else {
          const char* row = BlockwisePeerRow(p, d, t);
          const float scale = LoadScaleBytes(row + p.scales_offset + 4 * b);
          acc = AddRn(acc, Fp8BlockDequantize(static_cast<uint8_t>(__ldcg(row + h)), scale));
        }
      }
      out[h] = FloatToBFloat16(acc);
    }
  }
}

}  // namespace

}  // namespace mori::ep::intranode
