// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device pieces of MORI's fp8_blockwise combine (common/numeric.hpp holds the rule,
// host and device: Fp8BlockScaleOf, Fp8BlockQuantize, Fp8BlockDequantize, AddRn),
// shared by the intra-node and low-latency combine kernels: a 16-byte word of 8 bf16
// values quantized at once, a scale block's largest |value| over the lanes that hold
// it, and a whole row quantized by a warp for layouts that are not word-parallel.
// The word-parallel pieces convert with sm_89+/sm_90 instructions (fp32 <-> e4m3x2,
// fp32 -> bf16x2), two values each, where the host rule takes ~10-20 integer
// operations a value; each states why its bits are the rule's (older architectures
// fall back to the rule itself). The column-by-column pieces keep the rule's code.
// Internal linkage: each kernel file gets its own copy (no -rdc).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/numeric.hpp"

namespace mori::ep {

namespace {

// The larger 16-bit half of each 16-bit lane of a and b (unsigned), two at once.
__device__ __forceinline__ uint32_t MaxU16x2(uint32_t a, uint32_t b) {
#if __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return __vmaxu2(a, b);
#endif
}

// The largest |value| of each half of 8 bf16 values (a 16-byte word), as bf16 bits in
// the two 16-bit halves (NaN's bits win, as in QuantizeRowFp8Blockwise).
__device__ __forceinline__ uint32_t MaxAbsBits2(const uint4& v) {
  constexpr uint32_t kAbs = 0x7FFF7FFFu;
  return MaxU16x2(MaxU16x2(v.x & kAbs, v.y & kAbs), MaxU16x2(v.z & kAbs, v.w & kAbs));
}

// The largest |value| of 8 bf16 values (a 16-byte word) as bf16 bits.
__device__ __forceinline__ uint32_t MaxAbsBits(const uint4& v) {
  const uint32_t m = MaxAbsBits2(v);
  return max(m & 0xFFFFu, m >> 16);
}

// The largest `m` over the aligned group of `lanes` lanes (a power of two <= 32);
// every lane of the warp calls it.
__device__ __forceinline__ uint32_t GroupMax(uint32_t m, int lanes) {
  for (int o = 1; o < lanes; o <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  return m;
}

// GroupMax of the largest |value| of two words at once (one shuffle per step for
// both): the bf16 bits of a's in the low 16 bits, b's in the high 16 bits. (A warp
// reduction, redux.sync, under each lane group's own member mask compiles on sm_90 to
// one collective pass per group: no cheaper for groups of 16 lanes.)
__device__ __forceinline__ uint32_t GroupMaxAbsPair(const uint4& a, const uint4& b, int lanes) {
  const uint32_t x = MaxAbsBits2(a), y = MaxAbsBits2(b);
  uint32_t m = MaxU16x2(__byte_perm(x, y, 0x5410), __byte_perm(x, y, 0x7632));
  // Unrolled (no loop counter per step); `lanes` is the warp's, so every lane skips the
  // same steps.
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    if (o < lanes) m = MaxU16x2(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  }
  return m;
}

// GroupMaxAbsPair's two maxima apart: a's in `ma`, b's in `mb`.
__device__ __forceinline__ void GroupMaxAbs2(const uint4& a, const uint4& b, int lanes,
                                             uint32_t& ma, uint32_t& mb) {
  const uint32_t m = GroupMaxAbsPair(a, b, lanes);
  ma = m & 0xFFFFu;
  mb = m >> 16;
}

// Two fp32 values rounded to fp8 e4m3fn by the sm_89+ conversion (older: the host
// rule; round to nearest even, saturating: past 448 and infinities give +-448; the same magnitudes
// as FloatToFloat8E4M3), `lo` in byte 0 and `hi` in byte 1. A NaN gives 0x7F; callers OR in the
// sign bits (FloatToFloat8E4M3 keeps a NaN's sign).
__device__ __forceinline__ uint32_t CvtE4m3x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return FloatToFloat8E4M3(lo) | (static_cast<uint32_t>(FloatToFloat8E4M3(hi)) << 8);
#endif
}

// The two fp8 e4m3fn values of the low 16 bits of `q` (byte 0 to `lo`), exactly, by
// the sm_89+ conversion to f16 (every e4m3fn value is an f16 normal or zero) and
// f16 -> f32. A NaN gives a NaN (its payload may differ from Float8E4M3ToFloat's; every
// NaN of a combine sum ends as bf16 0x7FC0, so the outputs keep their bits).
__device__ __forceinline__ void CvtE4m3x2ToFloat(uint32_t q, float& lo, float& hi) {
#if __CUDA_ARCH__ >= 890
  asm("{\n\t.reg .b32 t;\n\t.reg .b16 l, h;\n\t"
      "cvt.rn.f16x2.e4m3x2 t, %2;\n\tmov.b32 {l, h}, t;\n\t"
      "cvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
      : "=f"(lo), "=f"(hi)
      : "h"(static_cast<unsigned short>(q)));
#else
  lo = Float8E4M3ToFloat(q & 0xFFu);
  hi = Float8E4M3ToFloat((q >> 8) & 0xFFu);
#endif
}

// 8 bf16 values (a 16-byte word) quantized by `s` into 8 fp8 bytes, value j in byte j:
// Fp8BlockQuantize's bits (the product rounded to fp32, then FloatToFloat8E4M3, whose
// sign is the bf16 value's: a product by s.inv > 0 keeps it), two values per
// conversion. (One case differs on the wire only: inf * 0, in a block whose largest
// |value| is infinite, is a NaN of the host's sign; the whole block then sums to NaN,
// bf16 0x7FC0, either way.)
__device__ __forceinline__ uint2 QuantizeWord(const uint4& v, const Fp8BlockScale& s) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t pr[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float lo = __uint_as_float(w[j] << 16), hi = __uint_as_float(w[j] & 0xFFFF0000u);
    if (s.scaled) lo = __fmul_rn(lo, s.inv), hi = __fmul_rn(hi, s.inv);
    pr[j] = CvtE4m3x2(lo, hi);
  }
  // Byte j of the sign words: the sign byte (byte 1 or 3) of bf16 value j.
  const uint32_t o0 =
      __byte_perm(pr[0], pr[1], 0x5410) | (__byte_perm(w[0], w[1], 0x7531) & 0x80808080u);
  const uint32_t o1 =
      __byte_perm(pr[2], pr[3], 0x5410) | (__byte_perm(w[2], w[3], 0x7531) & 0x80808080u);
  return make_uint2(o0, o1);
}

// The 8 fp8 values of `q` (value j in byte j) as fp32, exactly.
__device__ __forceinline__ void Fp8WordValues(const uint2& q, float* x) {
  const uint32_t w[2] = {q.x, q.y};
#pragma unroll
  for (int j = 0; j < 4; ++j) CvtE4m3x2ToFloat(w[j / 2] >> (16 * (j % 2)), x[2 * j], x[2 * j + 1]);
}

// Adds a part's 8 values times `scale` to acc (AddRn(acc, MulRn(x, scale)), one fp32
// rounding each). For the first part acc is kSumStart (-0.0), where that sum is the
// product itself: one fused multiply-add with -0.0 rounds once, exactly as the product
// (x * scale + -0.0 is x * scale for every x, zeros included), so it is used there.
__device__ __forceinline__ void AccumulateParts(float* acc, const float* x, float scale,
                                                bool first) {
  if (first) {
#pragma unroll
    for (int v = 0; v < 8; ++v) acc[v] = __fmaf_rn(x[v], scale, kSumStart);
  } else {
#pragma unroll
    for (int v = 0; v < 8; ++v) acc[v] = AddRn(acc[v], MulRn(x[v], scale));
  }
}

// Two fp32 sums rounded to bf16 as FloatToBf16Bits rounds them (`lo` in the low half):
// the sm_90 conversion rounds to nearest even and keeps subnormals. A sum's NaN is the
// fp32 canonical NaN (positive; fp32 adds on the device return it), which the
// conversion turns into a positive quiet NaN, 0x7FC0..0x7FFF; a signed 16-bit minimum
// with 0x7FC0 maps those to 0x7FC0 and leaves every other value (negatives are below 0
// as s16, +inf is 0x7F80, finite positives below it).
__device__ __forceinline__ uint32_t SumsToBf16x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("{\n\t.reg .b32 t;\n\tcvt.rn.bf16x2.f32 t, %1, %2;\n\t"
      "min.s16x2 %0, t, %3;\n\t}"
      : "=r"(r)
      : "f"(hi), "f"(lo), "r"(0x7FC07FC0u));
  return r;
#else
  return FloatToBf16Bits(lo) | (static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16);
#endif
}

// A 4-byte scale at any address (rows of the column-by-column paths need not be
// 4-byte aligned).
__device__ __forceinline__ float LoadScaleBytes(const char* at) {
  uint32_t v = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v |= static_cast<uint32_t>(static_cast<uint8_t>(__ldcg(at + j))) << (8 * j);
  }
  return __uint_as_float(v);
}

// bf16 row `src` of `hidden` columns quantized into wire row `dst` by one warp, block
// by block, a lane per column (any layout): the fp8 values, zeros up to
// BlockwiseScalesOffset, then every block's scale (scale 1 past the row), as
// QuantizeRowFp8Blockwise and the host's zeroed wire buffer give them.
__device__ __forceinline__ void QuantizeRowWarp(const uint16_t* src, int64_t hidden, int scale_dim,
                                                char* dst, unsigned lane) {
  uint8_t* q = reinterpret_cast<uint8_t*>(dst);
  const int64_t B = BlockwiseBlockElems(hidden, scale_dim), so = BlockwiseScalesOffset(hidden);
  for (int b = 0; b < scale_dim; ++b) {
    const int64_t lo = b * B, hi = lo + B < hidden ? lo + B : hidden;
    uint32_t m = 0;
    for (int64_t h = lo + lane; h < hi; h += 32) m = max(m, __ldg(src + h) & 0x7FFFu);
    const Fp8BlockScale s =
        Fp8BlockScaleOf(static_cast<uint16_t>(__reduce_max_sync(0xFFFFFFFFu, m)));
    for (int64_t h = lo + lane; h < hi; h += 32) q[h] = Fp8BlockQuantize(__ldg(src + h), s);
    if (lane < 4)
      dst[so + 4 * b + lane] = static_cast<char>(__float_as_uint(s.scale) >> (8 * lane));
  }
  for (int64_t h = hidden + lane; h < so; h += 32) q[h] = 0;
}

}  // namespace

}  // namespace mori::ep
