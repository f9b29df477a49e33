// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device pieces of MORI's fp8_blockwise combine (common/numeric.hpp holds the rule,
// host and device: Fp8BlockScaleOf, Fp8BlockQuantize, Fp8BlockDequantize, AddRn),
// shared by the intra-node and low-latency combine kernels: a 16-byte word of 8 bf16
// values quantized at once, a scale block's largest |value| over the lanes that hold
// it, and a whole row quantized by a warp for layouts that are not word-parallel.
// Internal linkage: each kernel file gets its own copy (no -rdc).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/numeric.hpp"

namespace mori::ep {

namespace {

// The largest |value| of 8 bf16 values (a 16-byte word) as bf16 bits (NaN's bits win,
// as in QuantizeRowFp8Blockwise).
__device__ __forceinline__ uint32_t MaxAbsBits(const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) m = max(m, max(w[j] & 0x7FFFu, (w[j] >> 16) & 0x7FFFu));
  return m;
}

// The largest `m` over the aligned group of `lanes` lanes (a power of two <= 32);
// every lane of the warp calls it.
__device__ __forceinline__ uint32_t GroupMax(uint32_t m, int lanes) {
  for (int o = 1; o < lanes; o <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  return m;
}

// 8 bf16 values (a 16-byte word) quantized by `s` into 8 fp8 bytes, value j in byte j.
__device__ __forceinline__ uint2 QuantizeWord(const uint4& v, const Fp8BlockScale& s) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint16_t b16 = static_cast<uint16_t>(w[j / 2] >> (16 * (j % 2)));
    o[j / 4] |= static_cast<uint32_t>(Fp8BlockQuantize(b16, s)) << (8 * (j % 4));
  }
  return make_uint2(o[0], o[1]);
}

// Adds the 8 fp8 values of `q` (value j in byte j), each times `scale`, to acc[0..8).
__device__ __forceinline__ void AccumulateFp8Word(float* acc, const uint2& q, float scale) {
  const uint32_t w[2] = {q.x, q.y};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    acc[j] = AddRn(acc[j], Fp8BlockDequantize((w[j / 4] >> (8 * (j % 4))) & 0xFFu, scale));
  }
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
