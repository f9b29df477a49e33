// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// fp8 e4m3fn conversions shared by the CPU implementation and the CUDA kernels, so
// that both give the same bits: e4m3fn has no infinities, 0x7f / 0xff are NaN and
// 448 is the largest finite value. Converted as torch 2.13 converts (round to
// nearest even, saturating: magnitudes past 448 and infinities give +-448, NaN gives
// NaN), so references computed with torch match bit for bit.

#include <cstdint>
#include <cstring>

#include "common/dtype.hpp"        // CombineDtype
#include "mori/shmem/context.hpp"  // MORI_HOST_DEVICE

namespace mori::ep {

MORI_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

MORI_HOST_DEVICE inline float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

MORI_HOST_DEVICE inline float Float8E4M3ToFloat(uint8_t v) {
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu, mant = v & 0x7u;
  uint32_t mag;
  if (exp == 0xF && mant == 0x7) {
    mag = 0x7FC00000u;  // the canonical quiet NaN
  } else if (exp == 0) {
    mag = FloatBits(static_cast<float>(mant) * 0x1p-9f);  // subnormal: mant * 2^-6 / 8
  } else {
    mag = ((exp + 120u) << 23) | (mant << 20);
  }
  return BitsFloat(mag | sign);
}

MORI_HOST_DEVICE inline uint8_t FloatToFloat8E4M3(float f) {
  uint32_t bits = FloatBits(f);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t out;
  if (bits > 0x7F800000u) {  // NaN
    out = 0x7F;
  } else if (bits >= 0x43E00000u) {  // >= 448 (or inf): saturate
    out = 0x7E;
  } else if (bits < (121u << 23)) {  // below 2^-6: subnormal, rounded by an fp32 add
    const uint32_t denorm = 141u << 23;
    const float a = BitsFloat(bits) + BitsFloat(denorm);
    out = static_cast<uint8_t>(FloatBits(a) - denorm);
  } else {
    const uint32_t mant_odd = (bits >> 20) & 1u;
    bits += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu + mant_odd;
    out = static_cast<uint8_t>(bits >> 20);
  }
  return static_cast<uint8_t>(out | (sign >> 24));
}

// bf16 <-> fp32 as torch converts (round to nearest even, NaN to the canonical
// quiet NaN), so references computed with torch match bit for bit.
MORI_HOST_DEVICE inline float Bf16BitsToFloat(uint16_t v) {
  return BitsFloat(static_cast<uint32_t>(v) << 16);
}

MORI_HOST_DEVICE inline uint16_t FloatToBf16Bits(float f) {
  if (f != f) return 0x7FC0;
  uint32_t bits = FloatBits(f);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// fp4 e2m1 (OCP; torch's float4_e2m1fn_x2 holds two per byte, the first value in the
// low nibble): 1 sign, 2 exponent, 1 mantissa bits; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4,
// 6; no infinities or NaN. Rounded to nearest, ties to the even code, saturating at
// +-6 (infinities too; a NaN, which no sum of e2m1 values gives, becomes +-6), as
// MORI's float-to-e2m1 conversion with clipping.
MORI_HOST_DEVICE inline float Float4E2M1ToFloat(uint8_t nibble) {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[nibble & 0x7u];
  return (nibble & 0x8u) ? -m : m;
}

MORI_HOST_DEVICE inline uint8_t FloatToFloat4E2M1(float f) {
  const uint8_t sign = (FloatBits(f) >> 31) ? 0x8u : 0u;
  const float a = f < 0 ? -f : f;
  uint8_t code;
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.0f) {
    code = 6;
  } else {
    code = 7;  // (5, inf] and NaN: saturated
  }
  return static_cast<uint8_t>(code | sign);
}

// Bytes of one element of a combine dtype.
MORI_HOST_DEVICE inline int64_t CombineElementBytes(CombineDtype dtype) {
  return dtype == CombineDtype::kFloat32 ? 4 : (dtype == CombineDtype::kBFloat16 ? 2 : 1);
}

// What element h of a combine row contributes to a reduction: its value, or (fp8_cast)
// its bf16 value rounded to fp8 e4m3fn as MORI's fp8_direct_cast sends it.
MORI_HOST_DEVICE inline float CombineElementValue(const char* row, int64_t h, CombineDtype dtype,
                                                  bool fp8_cast) {
  if (dtype == CombineDtype::kBFloat16) {
    const float v = Bf16BitsToFloat(reinterpret_cast<const uint16_t*>(row)[h]);
    return fp8_cast ? Float8E4M3ToFloat(FloatToFloat8E4M3(v)) : v;
  }
  if (dtype == CombineDtype::kFloat8E4M3) {
    return Float8E4M3ToFloat(reinterpret_cast<const uint8_t*>(row)[h]);
  }
  return reinterpret_cast<const float*>(row)[h];
}

// Combine's sums start from -0.0, the identity of fp32 addition (+0.0 is not: +0.0 +
// -0.0 is +0.0), so a sum of one part is that part, -0.0 included. A token with no
// part is written as zeros, not as the start value.
inline constexpr float kSumStart = -0.0f;

// Whether a token whose `parts` rows are combined is copied instead of summed: one
// row, not rounded by fp8_direct_cast, comes back with its bits (an fp32 round trip
// would give bf16 NaNs the canonical payload).
MORI_HOST_DEVICE inline bool CopiesSinglePart(int parts, bool fp8_cast) {
  return parts == 1 && !fp8_cast;
}

// CombineTokenRow of float4_e2m1fn_x2 rows (`hidden` bytes, 2 * hidden values): each
// value summed in fp32 from kSumStart in part order and rounded once (FloatToFloat4E2M1).
// Columns go in chunks so each part's row is looked up once per chunk.
template <typename RowOf>
inline void CombineTokenRowFp4x2(int parts, RowOf row_of, int64_t hidden, uint8_t* out) {
  constexpr int64_t kChunk = 256;
  float lo[kChunk], hi[kChunk];
  for (int64_t h0 = 0; h0 < hidden; h0 += kChunk) {
    const int64_t n = hidden - h0 < kChunk ? hidden - h0 : kChunk;
    for (int64_t j = 0; j < n; ++j) lo[j] = hi[j] = kSumStart;
    for (int i = 0; i < parts; ++i) {
      const uint8_t* row = reinterpret_cast<const uint8_t*>(row_of(i)) + h0;
      for (int64_t j = 0; j < n; ++j) {
        lo[j] += Float4E2M1ToFloat(row[j] & 0xFu);
        hi[j] += Float4E2M1ToFloat(row[j] >> 4);
      }
    }
    for (int64_t j = 0; j < n; ++j)
      out[h0 + j] =
          static_cast<uint8_t>(FloatToFloat4E2M1(lo[j]) | (FloatToFloat4E2M1(hi[j]) << 4));
  }
}

// The host implementations' reduction of one token (intranode/cpu.cpp,
// low_latency/cpu.cpp; the CUDA kernels follow it): `parts` rows, row_of(i) the i-th
// in ascending pe order, summed in fp32 in that order and rounded once into `out`
// (hidden elements of dtype); `acc` is scratch of hidden floats.
template <typename RowOf>
inline void CombineTokenRow(int parts, RowOf row_of, CombineDtype dtype, bool fp8_cast,
                            int64_t hidden, float* acc, void* out) {
  const int64_t bytes = hidden * CombineElementBytes(dtype);
  if (parts == 0) {
    std::memset(out, 0, bytes);
    return;
  }
  if (CopiesSinglePart(parts, fp8_cast)) {
    std::memcpy(out, row_of(0), bytes);
    return;
  }
  if (dtype == CombineDtype::kFloat4E2M1x2) {
    CombineTokenRowFp4x2(parts, row_of, hidden, static_cast<uint8_t*>(out));
    return;
  }
  for (int64_t h = 0; h < hidden; ++h) acc[h] = kSumStart;
  for (int i = 0; i < parts; ++i) {
    const char* row = row_of(i);
    for (int64_t h = 0; h < hidden; ++h) acc[h] += CombineElementValue(row, h, dtype, fp8_cast);
  }
  for (int64_t h = 0; h < hidden; ++h) {
    switch (dtype) {
      case CombineDtype::kBFloat16:
        static_cast<uint16_t*>(out)[h] = FloatToBf16Bits(acc[h]);
        break;
      case CombineDtype::kFloat8E4M3:
        static_cast<uint8_t*>(out)[h] = FloatToFloat8E4M3(acc[h]);
        break;
      case CombineDtype::kFloat32:
        static_cast<float*>(out)[h] = acc[h];
        break;
      case CombineDtype::kFloat4E2M1x2:  // CombineTokenRowFp4x2
        break;
    }
  }
}

// MORI's fp8_blockwise combine (its WarpQuantizeToFp8Blockwise and blockwise
// dequant): a bf16 row of `hidden` columns is cut into `scale_dim` blocks of
// ceil(hidden / scale_dim) columns (the last short, any past the row empty). A block
// whose largest |value| (bf16 bit compare, so NaN wins and leaves it unscaled) is at
// most 448 crosses as fp8 e4m3fn of its values with scale 1; a larger one as
// fp8(v * (448 / amax)) with scale amax * (1 / 448), each product rounded to fp32.
// The receiver adds fp8 * scale, rounded to fp32, in fp32. On the wire a row is
// BlockwiseRowBytes: the fp8 bytes, padded to 4, then the fp32 scales.
inline constexpr float kFp8E4M3MaxFinite = 448.0f;

MORI_HOST_DEVICE inline int64_t BlockwiseBlockElems(int64_t hidden, int scale_dim) {
  return (hidden + scale_dim - 1) / scale_dim;
}

MORI_HOST_DEVICE inline int64_t BlockwiseScalesOffset(int64_t hidden) {
  return (hidden + 3) / 4 * 4;
}

MORI_HOST_DEVICE inline int64_t BlockwiseRowBytes(int64_t hidden, int scale_dim) {
  return BlockwiseScalesOffset(hidden) + 4 * static_cast<int64_t>(scale_dim);
}

// One block's quantization, from the largest |value| of the block as bf16 bits (NaN's
// bits win and leave it unscaled). Host and device compute it with the same roundings:
// the quotient and the product are single fp32 operations, never fused.
struct Fp8BlockScale {
  bool scaled;
  float inv;    // what a value is multiplied by before the cast
  float scale;  // what crosses with the block
};

MORI_HOST_DEVICE inline float MulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  volatile float p = a * b;  // no contraction into a neighbouring add
  return p;
#endif
}

MORI_HOST_DEVICE inline Fp8BlockScale Fp8BlockScaleOf(uint16_t max_bits) {
  const float amax = Bf16BitsToFloat(max_bits);
  if (!(amax > kFp8E4M3MaxFinite)) return {false, 1.0f, 1.0f};
#ifdef __CUDA_ARCH__
  const float inv = __fdiv_rn(kFp8E4M3MaxFinite, amax);
#else
  const float inv = kFp8E4M3MaxFinite / amax;
#endif
  return {true, inv, MulRn(amax, 1.0f / kFp8E4M3MaxFinite)};
}

// A bf16 value (bits) of a block quantized by `s`.
MORI_HOST_DEVICE inline uint8_t Fp8BlockQuantize(uint16_t v, const Fp8BlockScale& s) {
  const float f = Bf16BitsToFloat(v);
  return FloatToFloat8E4M3(s.scaled ? MulRn(f, s.inv) : f);
}

// What an fp8 value of a block with `scale` adds to a sum: the product, rounded to fp32.
MORI_HOST_DEVICE inline float Fp8BlockDequantize(uint8_t q, float scale) {
  return MulRn(Float8E4M3ToFloat(q), scale);
}

// Adds b to a, one fp32 rounding (the device never fuses it with a product).
MORI_HOST_DEVICE inline float AddRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Quantizes one bf16 row into `wire` (BlockwiseRowBytes of it; the padding before the
// scales is left as it is). The CUDA kernels (intranode/kernels/combine_blockwise.cuh,
// low_latency/kernels/combine.cu) compute the same blocks with Fp8BlockScaleOf and
// Fp8BlockQuantize, their maxima in parallel.
inline void QuantizeRowFp8Blockwise(const uint16_t* row, int64_t hidden, int scale_dim,
                                    char* wire) {
  uint8_t* q = reinterpret_cast<uint8_t*>(wire);
  const int64_t block = BlockwiseBlockElems(hidden, scale_dim);
  for (int b = 0; b < scale_dim; ++b) {
    const int64_t start = b * block, end = start + block < hidden ? start + block : hidden;
    uint16_t max_bits = 0;
    for (int64_t h = start; h < end; ++h) {
      const uint16_t a = row[h] & 0x7FFFu;
      if (a > max_bits) max_bits = a;
    }
    const Fp8BlockScale s = Fp8BlockScaleOf(max_bits);
    for (int64_t h = start; h < end; ++h) q[h] = Fp8BlockQuantize(row[h], s);
    std::memcpy(wire + BlockwiseScalesOffset(hidden) + 4 * b, &s.scale, 4);
  }
}

// The host implementations' reduction of one token under fp8_blockwise: `parts`
// wire rows (QuantizeRowFp8Blockwise), row_of(i) the i-th in ascending pe order, each
// element dequantized (Fp8BlockDequantize) and summed in fp32 from kSumStart in that
// order, rounded once to bf16 `out`; no part: zeros.
template <typename RowOf>
inline void CombineTokenRowFp8Blockwise(int parts, RowOf row_of, int64_t hidden, int scale_dim,
                                        float* acc, uint16_t* out) {
  if (parts == 0) {
    std::memset(out, 0, hidden * 2);
    return;
  }
  const int64_t block = BlockwiseBlockElems(hidden, scale_dim);
  for (int64_t h = 0; h < hidden; ++h) acc[h] = kSumStart;
  for (int i = 0; i < parts; ++i) {
    const char* wire = row_of(i);
    const uint8_t* q = reinterpret_cast<const uint8_t*>(wire);
    for (int b = 0; b < scale_dim; ++b) {
      const int64_t start = b * block, end = start + block < hidden ? start + block : hidden;
      float scale;
      std::memcpy(&scale, wire + BlockwiseScalesOffset(hidden) + 4 * b, 4);
      for (int64_t h = start; h < end; ++h) acc[h] = acc[h] + Fp8BlockDequantize(q[h], scale);
    }
  }
  for (int64_t h = 0; h < hidden; ++h) out[h] = FloatToBf16Bits(acc[h]);
}

// The same for a token's K combined weights (fp32; one part is copied).
template <typename WeightsOf>
inline void CombineTokenWeights(int parts, WeightsOf weights_of, int K, float* out) {
  for (int j = 0; j < K; ++j)
    out[j] = parts == 0 ? 0.0f : parts == 1 ? weights_of(0)[j] : kSumStart;
  for (int i = 0; parts > 1 && i < parts; ++i) {
    const float* w = weights_of(i);
    for (int j = 0; j < K; ++j) out[j] += w[j];
  }
}

}  // namespace mori::ep
