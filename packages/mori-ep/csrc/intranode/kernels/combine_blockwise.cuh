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

#include <type_traits>

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
        if ((lane & (L - 1)) == 0) scales[w >> (__ffs(L) - 1)] = s.scale;  // L: a power of two
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

// The parts token t went to as a bit mask (bit d: pe d), and where my own part is in
// the combine input.
struct BlockwiseToken {
  uint32_t mask;
  int64_t self_row;
};

__device__ __forceinline__ BlockwiseToken LoadBlockwiseToken(const CombineParams& p, int64_t t) {
  const int W = p.c.world;
  const uint8_t* ranks = p.token_ranks + t * W;
  uint32_t mask = 0;
  for (int d = 0; d < W; ++d) mask |= static_cast<uint32_t>(ranks[d] != 0) << d;
  return {mask, p.token_self_row[t]};
}

// Own words of a lane: kU a segment, padded to an even count (quantized in pairs).
template <int kU>
using OwnWords = uint4[kU + kU % 2];

// Segment `seg` (kU words a lane) of my own part (zeros where the token has none, past
// the row and in the padding), every load issued before any is used.
template <int kU>
__device__ __forceinline__ void LoadOwnWords(const CombineParams& p, const BlockwiseToken& tok,
                                             int seg, unsigned lane, OwnWords<kU>& raw) {
  const bool own = (tok.mask >> p.c.me) & 1u;
  const uint4* mine = reinterpret_cast<const uint4*>(p.input + tok.self_row * p.input_row_stride);
  const int64_t nwords = p.row_bytes / 16;
  const int64_t ws = static_cast<int64_t>(seg) * kU * 32 + lane;
#pragma unroll
  for (int k = 0; k < kU + kU % 2; ++k) {
    const int64_t w = ws + k * 32;
    raw[k] = own && k < kU && w < nwords ? __ldcg(mine + w) : make_uint4(0, 0, 0, 0);
  }
}

// 8 bf16 values (a 16-byte word) quantized as QuantizeWord quantizes them and read back
// as fp32 (Fp8BlockDequantize before its product): x[j] is value j's fp8 value. The fp8
// byte's sign bit, which QuantizeWord ORs in for a NaN only, is left out: a NaN stays a
// NaN and every sum of one is the canonical NaN (fp32 arithmetic on the device returns
// it), so the output's bits are the same. `scaled`: some value of the warp's item is
// scaled (else every inv is 1 and the products are skipped, as Fp8BlockQuantize skips
// them).
__device__ __forceinline__ void OwnWordFp8Values(const uint4& v, bool scaled, float inv, float* x) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float lo = __uint_as_float(w[j] << 16), hi = __uint_as_float(w[j] & 0xFFFF0000u);
    // inv is 1 for an unscaled block: the product is the value itself (a NaN stays one).
    if (scaled) lo = __fmul_rn(lo, inv), hi = __fmul_rn(hi, inv);
    CvtE4m3x2ToFloat(CvtE4m3x2(lo, hi), x[2 * j], x[2 * j + 1]);
  }
}

// Words [seg * kU * 32, ...) of my token t's bf16 output, given the token's parts and
// my own part's words (LoadOwnWords, maybe loaded an item earlier): the dequantized
// parts of the pes it went to, ascending, summed in fp32 from -0.0 and rounded once;
// no part: zeros. My own part is quantized here as the host quantizes it (its blocks'
// maxima need every lane of a group, so the whole warp takes part; two words' maxima
// per shuffle chain, kept as one register) and read back as fp32 without its bytes,
// where its turn in the sum comes. The sums take the segment's words kC at a time, pes
// two at a time, so 2 x kC part loads and their scales are in flight.
template <int kU>
__device__ __forceinline__ void ReduceBlockwiseWords(const CombineParams& p, int64_t t, int seg,
                                                     unsigned lane, uint32_t mask,
                                                     const OwnWords<kU>& raw) {
  constexpr int kC = kU >= 4 ? 2 : 1;
  constexpr int kPairs = (kU + 1) / 2;
  const Common& c = p.c;
  const int W = c.world, L = p.block_lanes, me = c.me;
  const int lsh = __ffs(L) - 1;  // word w's block: w >> lsh (L is a power of two)
  const int64_t nwords = p.row_bytes / 16;
  uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.out) + t * p.row_bytes);
  const int64_t ws = static_cast<int64_t>(seg) * kU * 32 + lane;
  if (mask == 0) {
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      if (ws + k * 32 < nwords) out[ws + k * 32] = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const bool own = (mask >> me) & 1u;
  const int first = __ffs(mask) - 1;
  // My own words' block maxima (bf16 bits), words 2i and 2i + 1 in own_m[i]; whether
  // any of the warp's is scaled (else the quantize's products are skipped).
  uint32_t own_m[kPairs];
  bool scaled = false;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) own_m[i] = 0;
  if (own) {
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      if (ws - lane + 2 * i * 32 >= nwords) break;  // the warp's words are past the row
      own_m[i] = GroupMaxAbsPair(raw[2 * i], raw[2 * i + 1], L);
      scaled |= Fp8BlockScaleOf(static_cast<uint16_t>(own_m[i] & 0xFFFFu)).scaled |
                Fp8BlockScaleOf(static_cast<uint16_t>(own_m[i] >> 16)).scaled;
    }
    scaled = __any_sync(kFull, scaled);
  }
  const char* row0 = At<char>(c, c.layout.comb_tokens) + t * p.combine_row_bytes;
  const int64_t pe_stride = c.max_tokens * p.combine_row_bytes;
  // The sums, in two copies: with the quantize's products (some block of the warp's
  // item scaled) and without (the common case), so that neither carries the other's
  // instructions (predicated off, they would still be issued).
  auto sums = [&](auto scaled_tag) {
    constexpr bool kScaled = decltype(scaled_tag)::value;
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
          const bool peer = d < W && d != me && ((mask >> d) & 1u);
          const char* row = row0 + d * pe_stride;
          const float* scales = reinterpret_cast<const float*>(row + p.scales_offset);
#pragma unroll
          for (int k = 0; k < kC; ++k) {
            const int64_t w = w0 + k * 32;
            q[j][k] = make_uint2(0, 0);
            sc[j][k] = 1.0f;
            if (peer && w < nwords) {
              q[j][k] = __ldcg(reinterpret_cast<const uint2*>(row) + w);
              sc[j][k] = __ldcg(scales + (w >> lsh));
            }
          }
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int d = d0 + j;
          if (d < W && ((mask >> d) & 1u)) {
#pragma unroll
            for (int k = 0; k < kC; ++k) {
              float x[8];
              if (d == me) {
                const int u = k0 + k;
                const Fp8BlockScale s =
                    Fp8BlockScaleOf(static_cast<uint16_t>(own_m[u / 2] >> (16 * (u % 2))));
                OwnWordFp8Values(raw[u], kScaled, s.inv, x);
                AccumulateParts(acc[k], x, s.scale, d == first);
              } else {
                Fp8WordValues(q[j][k], x);
                AccumulateParts(acc[k], x, sc[j][k], d == first);
              }
            }
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
  };
  if (scaled) {
    sums(std::true_type{});
  } else {
    sums(std::false_type{});
  }
}

// Words [seg * kU * 32, ...) of my token t's bf16 output (ReduceBlockwiseWords), its
// parts and own words loaded here (kU is kReduceItemWords: 8 in the 512-thread build).
template <int kU>
__device__ __forceinline__ void ReduceBlockwiseSegment(const CombineParams& p, int64_t t, int seg,
                                                       unsigned lane) {
  const BlockwiseToken tok = LoadBlockwiseToken(p, t);
  OwnWords<kU> raw;
  LoadOwnWords<kU>(p, tok, seg, lane, raw);
  ReduceBlockwiseWords<kU>(p, t, seg, lane, tok.mask, raw);
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
