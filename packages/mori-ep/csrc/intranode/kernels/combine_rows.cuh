// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The row operations of the intra-node combine, shared by its three paths (tiled,
// one-pass, streaming; combine.cu): a segment of a received row returned to its
// source (as the input's dtype or as fp8 e4m3 bytes), and a token's segment reduced
// over the pes it went to, in ascending pe order, fp32, rounded once (the CPU
// implementation's order, hence its bits). Included by combine.cu only; internal
// linkage, as when it was part of that file.

#include "intranode/kernels/combine_blockwise.cuh"
#include "intranode/kernels/device.cuh"

namespace mori::ep::intranode {

namespace {

// 16-byte words per lane of a reduce item (token, segment): kReduceWords, and twice
// that in the 512-thread fp8_blockwise build, whose item quantizes my own part and
// dequantizes every part between its loads and its stores, so that each warp keeps as
// many bytes in flight per item as the bf16 copy's while its arithmetic runs.
template <int kThreads, int kWire>
inline constexpr int kReduceItemWords =
    kWire == kWireBlockwise && kThreads <= kNarrowThreads ? 2 * kReduceWords<kThreads>
                                                          : kReduceWords<kThreads>;

// 8 bf16 values (a 16-byte word) rounded to 8 fp8 e4m3 bytes, element j in byte j.
__device__ __forceinline__ uint2 Bf16WordToFp8(const int4& v) {
  const uint32_t w[4] = {static_cast<uint32_t>(v.x), static_cast<uint32_t>(v.y),
                         static_cast<uint32_t>(v.z), static_cast<uint32_t>(v.w)};
  uint32_t o[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t b16 = (w[j / 2] >> (16 * (j % 2))) & 0xFFFFu;
    o[j / 4] |= static_cast<uint32_t>(FloatToFloat8E4M3(BFloat16ToFloat(b16))) << (8 * (j % 4));
  }
  return make_uint2(o[0], o[1]);
}

// Segment `seg` of received row i back to its source s, slot [me][t] there (with
// segment 0, its weights). kWireFp8 with p.fp8_cast: each bf16 word goes as 8 fp8
// bytes (the slot's row is hidden bytes long); kWireBlockwise: as fp8 blocks with
// their scales (combine_blockwise.cuh; without p.vec the whole row, one segment).
template <int kSeg, int kWire>
__device__ __forceinline__ void ReturnRowSegment(const CombineParams& p, int64_t i, int s, int seg,
                                                 unsigned lane) {
  const Common& c = p.c;
  const int64_t M = c.max_tokens;
  const int64_t t = p.src_pos[i] % M;
  const int64_t slot = static_cast<int64_t>(c.me) * M + t;
  const char* src_row = p.input + i * p.input_row_stride;
  const bool cast = kWire == kWireFp8 && p.fp8_cast;
  if constexpr (kWire == kWireBlockwise) {
    char* dst = PeerAt<char>(c, c.layout.comb_tokens + slot * p.combine_row_bytes, s);
    if (p.vec) {
      ReturnBlockwiseSegment<kSeg>(p, i, dst, seg, lane);
    } else {
      ReturnBlockwiseRowScalar(p, i, dst, lane);
    }
  } else if (p.vec) {
    const int64_t nwords = p.row_bytes / 16;
    const int4* src = reinterpret_cast<const int4*>(src_row);
    int4* dst = PeerAt<int4>(c, c.layout.comb_tokens + slot * p.combine_row_bytes, s);
    const int sw = p.ret_seg_words;
    const int64_t w0 = static_cast<int64_t>(seg) * sw * 32 + lane;
    int4 v[kSeg];
#pragma unroll
    for (int k = 0; k < kSeg; ++k) {
      const int64_t w = w0 + k * 32;
      v[k] = k < sw && w < nwords ? __ldg(src + w) : make_int4(0, 0, 0, 0);
    }
    if (cast) {
      uint2* dst8 = reinterpret_cast<uint2*>(dst);
#pragma unroll
      for (int k = 0; k < kSeg; ++k) {
        const int64_t w = w0 + k * 32;
        if (k < sw && w < nwords) dst8[w] = Bf16WordToFp8(v[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kSeg; ++k) {
        const int64_t w = w0 + k * 32;
        if (k < sw && w < nwords) dst[w] = v[k];
      }
    }
  } else if (cast) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(src_row);
    uint8_t* dst = PeerAt<uint8_t>(c, c.layout.comb_tokens + slot * p.combine_row_bytes, s);
    for (int64_t h = lane; h < p.hidden; h += 32) {
      dst[h] = FloatToFloat8E4M3(BFloat16ToFloat(__ldg(src + h)));
    }
  } else {
    dev::PutWarp_nbi(c.ctx, At<char>(c, c.layout.comb_tokens) + slot * p.combine_row_bytes, src_row,
                     p.row_bytes, s);
  }
  if (seg == 0 && p.out_weights != nullptr) {
    const int K = c.top_k;
    float* dst = PeerAt<float>(c, c.layout.comb_weights + slot * K * 4, s);
    for (int j = static_cast<int>(lane); j < K; j += 32) dst[j] = __ldg(p.weights + i * K + j);
  }
}

// What a reduction reads and writes: 16-byte words of bf16 (8 values), fp32 (4) or
// fp8 (16) rows; kBf16ViaFp8 (fp8_direct_cast): bf16 output words of 8 values, whose
// peers' parts arrive as 8 fp8 bytes and whose own part (the combine input, bf16) is
// rounded to fp8 here, as the CPU implementation rounds every part.
enum RowKind : int { kBf16Row = 0, kF32Row = 1, kFp8Row = 2, kBf16ViaFp8Row = 3 };

template <int kKind>
constexpr int kRowVals = kKind == kF32Row   ? 4
                         : kKind == kFp8Row ? 16
                                            : 8;

// Word w of the partial row at `row`: a peer's part under kBf16ViaFp8Row is its 8-byte
// fp8 word (in x, y).
template <int kKind>
__device__ __forceinline__ uint4 LoadPartWord(const char* row, int64_t w, bool own) {
  if constexpr (kKind == kBf16ViaFp8Row) {
    if (!own) {
      const uint2 v = __ldcg(reinterpret_cast<const uint2*>(row) + w);
      return make_uint4(v.x, v.y, 0, 0);
    }
  }
  return __ldcg(reinterpret_cast<const uint4*>(row) + w);
}

// Adds the word `raw` (LoadPartWord's) to acc.
template <int kKind>
__device__ __forceinline__ void Accumulate(float* acc, const uint4& raw, bool own) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (kKind == kBf16Row) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      acc[2 * v] += BFloat16ToFloat(w[v] & 0xFFFFu);
      acc[2 * v + 1] += BFloat16ToFloat(w[v] >> 16);
    }
  } else if constexpr (kKind == kF32Row) {
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[v] += __uint_as_float(w[v]);
  } else if constexpr (kKind == kFp8Row) {
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[j] += Float8E4M3ToFloat((w[j / 4] >> (8 * (j % 4))) & 0xFFu);
  } else if (own) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float x = BFloat16ToFloat((w[j / 2] >> (16 * (j % 2))) & 0xFFFFu);
      acc[j] += Float8E4M3ToFloat(FloatToFloat8E4M3(x));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += Float8E4M3ToFloat((w[j / 4] >> (8 * (j % 4))) & 0xFFu);
  }
}

// acc rounded once to the output's 16-byte word.
template <int kKind>
__device__ __forceinline__ uint4 OutputWord(const float* acc) {
  uint32_t o[4] = {0, 0, 0, 0};
  if constexpr (kKind == kF32Row) {
#pragma unroll
    for (int v = 0; v < 4; ++v) o[v] = __float_as_uint(acc[v]);
  } else if constexpr (kKind == kFp8Row) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[j / 4] |= static_cast<uint32_t>(FloatToFloat8E4M3(acc[j])) << (8 * (j % 4));
    }
  } else {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      o[v] = FloatToBFloat16(acc[2 * v]) |
             (static_cast<uint32_t>(FloatToBFloat16(acc[2 * v + 1])) << 16);
    }
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// The partial row pe d returned for my token t: my own from the combine input,
// the others' from their slots.
__device__ __forceinline__ const char* PartialRow(const CombineParams& p, int d, int64_t t,
                                                  int64_t self_row) {
  if (d == p.c.me) return p.input + self_row * p.input_row_stride;
  return At<char>(p.c, p.c.layout.comb_tokens) +
         (static_cast<int64_t>(d) * p.c.max_tokens + t) * p.combine_row_bytes;
}

// Columns [seg * kU * 512 B, ...) of my token t's output: the sum over the pes it went
// to, ascending, fp32, rounded once. Pes are taken two at a time so that 2 x kU loads
// per lane are in flight; the additions keep the ascending order. fp8 rows (16 values
// a word) take the segment's words kU / 2 at a time, so that the accumulators fit in
// the registers the bf16 build uses.
template <int kU, int kKind>
__device__ __forceinline__ void ReduceSegment(const CombineParams& p, int64_t t, int seg,
                                              unsigned lane) {
  constexpr int kVals = kRowVals<kKind>;
  constexpr int kC = kKind == kFp8Row && kU > 1 ? kU / 2 : kU;
  const Common& c = p.c;
  const int W = c.world;
  const uint8_t* ranks = p.token_ranks + t * W;
  const int64_t self_row = p.token_self_row[t];
  const int64_t nwords = p.row_bytes / 16;
  uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.out) + t * p.row_bytes);
  int parts = 0, only = 0;
  for (int d = 0; d < W; ++d) {
    if (ranks[d]) ++parts, only = d;
  }
  if (parts == 0 || CopiesSinglePart(parts, kKind == kBf16ViaFp8Row)) {
    // No part: zeros; one part (not rounded to fp8 on the way): its words, unchanged.
    const char* row = PartialRow(p, only, t, self_row);
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int64_t w = (static_cast<int64_t>(seg) * kU + k) * 32 + lane;
      if (w < nwords) {
        out[w] = parts ? LoadPartWord<kKind>(row, w, only == c.me) : make_uint4(0, 0, 0, 0);
      }
    }
    return;
  }
#pragma unroll
  for (int k0 = 0; k0 < kU; k0 += kC) {
    const int64_t w0 = (static_cast<int64_t>(seg) * kU + k0) * 32 + lane;
    float acc[kC][kVals];
#pragma unroll
    for (int k = 0; k < kC; ++k) {
#pragma unroll
      for (int v = 0; v < kVals; ++v) acc[k][v] = kSumStart;
    }
#pragma unroll
    for (int d0 = 0; d0 < kW; d0 += 2) {
      if (d0 >= W) break;
      const bool a = ranks[d0] != 0;
      const bool b = d0 + 1 < W && ranks[d0 + 1] != 0;
      const bool own_a = d0 == c.me, own_b = d0 + 1 == c.me;
      const char* ra = PartialRow(p, d0, t, self_row);
      const char* rb = PartialRow(p, d0 + 1, t, self_row);
      uint4 va[kC], vb[kC];
#pragma unroll
      for (int k = 0; k < kC; ++k) {
        const int64_t w = w0 + k * 32;
        va[k] = a && w < nwords ? LoadPartWord<kKind>(ra, w, own_a) : make_uint4(0, 0, 0, 0);
        vb[k] = b && w < nwords ? LoadPartWord<kKind>(rb, w, own_b) : make_uint4(0, 0, 0, 0);
      }
      if (a) {
#pragma unroll
        for (int k = 0; k < kC; ++k) Accumulate<kKind>(acc[k], va[k], own_a);
      }
      if (b) {
#pragma unroll
        for (int k = 0; k < kC; ++k) Accumulate<kKind>(acc[k], vb[k], own_b);
      }
    }
#pragma unroll
    for (int k = 0; k < kC; ++k) {
      const int64_t w = w0 + k * 32;
      if (w < nwords) out[w] = OutputWord<kKind>(acc[k]);
    }
  }
}

// Any row layout: one warp reduces all of token t, element by element.
template <int kWire>
__device__ void ReduceTokenScalar(const CombineParams& p, int64_t t, unsigned lane) {
  const Common& c = p.c;
  const uint8_t* ranks = p.token_ranks + t * c.world;
  const int64_t self_row = p.token_self_row[t];
  char* out_row = static_cast<char*>(p.out) + t * p.row_bytes;
  const bool bf16 = p.dtype == CombineDtype::kBFloat16;
  int parts = 0, only = 0;
  for (int d = 0; d < c.world; ++d) {
    if (ranks[d]) ++parts, only = d;
  }
  if (parts == 0 || CopiesSinglePart(parts, p.fp8_cast)) {
    // As ReduceSegment: zeros, or the one part's bytes.
    const char* row = PartialRow(p, only, t, self_row);
    for (int64_t i = lane; i < p.row_bytes; i += 32) out_row[i] = parts ? __ldcg(row + i) : 0;
    return;
  }
  for (int64_t h = lane; h < p.hidden; h += 32) {
    float acc = kSumStart;
    for (int d = 0; d < c.world; ++d) {
      if (!ranks[d]) continue;
      const char* row = PartialRow(p, d, t, self_row);
      if constexpr (kWire == kWireNative) {
        acc += bf16 ? BFloat16ToFloat(__ldcg(reinterpret_cast<const uint16_t*>(row) + h))
                    : __ldcg(reinterpret_cast<const float*>(row) + h);
      } else if (bf16 && d == c.me) {  // fp8_direct_cast, my own part: rounded here
        const float x = BFloat16ToFloat(__ldcg(reinterpret_cast<const uint16_t*>(row) + h));
        acc += Float8E4M3ToFloat(FloatToFloat8E4M3(x));
      } else {
        acc += Float8E4M3ToFloat(__ldcg(reinterpret_cast<const uint8_t*>(row) + h));
      }
    }
    if (bf16) {
      reinterpret_cast<uint16_t*>(out_row)[h] = FloatToBFloat16(acc);
    } else if (kWire == kWireFp8) {
      reinterpret_cast<uint8_t*>(out_row)[h] = FloatToFloat8E4M3(acc);
    } else {
      reinterpret_cast<float*>(out_row)[h] = acc;
    }
  }
}

__device__ __forceinline__ void ReduceWeights(const CombineParams& p, int64_t t, unsigned lane) {
  const Common& c = p.c;
  const int K = c.top_k;
  const int64_t M = c.max_tokens;
  const uint8_t* ranks = p.token_ranks + t * c.world;
  const int64_t self_row = p.token_self_row[t];
  const float* comb_weights = At<float>(c, c.layout.comb_weights);
  int parts = 0;
  for (int d = 0; d < c.world; ++d) parts += ranks[d] != 0;
  for (int j = static_cast<int>(lane); j < K; j += 32) {
    // One part: its value (CombineTokenWeights); none: 0; else a sum from -0.0.
    float acc = parts == 0 ? 0.0f : kSumStart;
    for (int d = 0; d < c.world; ++d) {
      if (!ranks[d]) continue;
      const float w = d == c.me ? __ldg(p.weights + self_row * K + j)
                                : __ldcg(comb_weights + (static_cast<int64_t>(d) * M + t) * K + j);
      acc = parts == 1 ? w : acc + w;
    }
    p.out_weights[t * K + j] = acc;
  }
}

// One reduce item: segment `seg` of token t's row (the whole row without vector
// access; kWireBlockwise: combine_blockwise.cuh), and with segment 0 the token's weights. Shared by
// every combine path.
template <int kU, int kWire>
__device__ __forceinline__ void ReduceItem(const CombineParams& p, int64_t t, int seg,
                                           unsigned lane) {
  if constexpr (kWire == kWireBlockwise) {
    if (p.vec) {
      ReduceBlockwiseSegment<kU>(p, t, seg, lane);
    } else {
      ReduceBlockwiseTokenScalar(p, t, lane);
    }
  } else if (!p.vec) {
    ReduceTokenScalar<kWire>(p, t, lane);
  } else if constexpr (kWire == kWireNative) {
    if (p.dtype == CombineDtype::kBFloat16) {
      ReduceSegment<kU, kBf16Row>(p, t, seg, lane);
    } else {
      ReduceSegment<kU, kF32Row>(p, t, seg, lane);
    }
  } else if (p.fp8_cast) {
    ReduceSegment<kU, kBf16ViaFp8Row>(p, t, seg, lane);
  } else {
    ReduceSegment<kU, kFp8Row>(p, t, seg, lane);
  }
  if (seg == 0 && p.out_weights != nullptr) ReduceWeights(p, t, lane);
}

}  // namespace

}  // namespace mori::ep::intranode
