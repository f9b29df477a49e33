// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The arguments of a low-latency dispatch and combine (low_latency/protocol.hpp),
// shared by the CPU implementation and the CUDA kernels. Tensors arrive as
// pointers; mori.ep's Python layer checked shapes, dtypes and devices.

#include <cstdint>

#include "common/dtype.hpp"
#include "low_latency/protocol.hpp"

namespace mori::ep {

struct LlDispatchArgs {
  LlLayout layout;
  const void* tokens;       // [num_tokens][token_row_bytes]
  int64_t token_row_bytes;  // <= shape.hidden_bytes (bf16 rows when fp8_cast)
  const float* weights;     // [num_tokens][K], or nullptr: zeros are sent
  const void* scales;       // [num_tokens][scale_bytes], token-major only, or nullptr
  const int32_t* indices;   // [num_tokens][K]
  int64_t num_tokens;
  // Expert-major only: cast bf16 rows to e4m3 with a fp32 scale per 128 columns
  // (DeepEP's use_fp8), power-of-two scales with round_scale.
  bool fp8_cast = false;
  bool round_scale = false;
  // The rows' dtype code (DtypeTagName), compared across ranks in the wire tag
  // (LlDispatchTag).
  uint32_t dtype_tag = 0;
};

// Where the receiving half of a dispatch writes. Token-major: out_* (rows in source
// pe, then source token order; capacity W * M). Expert-major: the packed_* tensors.
struct LlRecvArgs {
  void* out_tokens = nullptr;      // [W*M][hidden_bytes] (rows of token_row_bytes)
  float* out_weights = nullptr;    // [W*M][K]
  void* out_scales = nullptr;      // [W*M][scale_bytes]
  int32_t* out_indices = nullptr;  // [W*M][K]
  int32_t* out_src_pos = nullptr;  // [W*M] src_pe * M + src_token
  int32_t* total_recv = nullptr;   // [1]
  void* packed_x = nullptr;        // [E][W*M][row bytes]: bf16 rows, or e4m3 with fp8_cast
  // fp8_cast: DeepEP's column-major scales, storage [E][Q][W*M] fp32, or with ue8m0
  // [E][Q/4][W*M] int32 whose byte j is the exponent of scale group 4 * q + j.
  void* packed_scales = nullptr;
  bool ue8m0 = false;
  int32_t* packed_count = nullptr;  // [E]
  int32_t* src_info = nullptr;      // [E][W*M]: src_pe * src_info_stride + src_token
  int64_t src_info_stride = 0;      // 0: the source token alone (DeepEP)
  int64_t* layout_range = nullptr;  // [E][W]: (begin << 32) | count, DeepEP's
  int32_t* slot_k = nullptr;        // [E][W*M]: the top-k slot of the row (combine)
};

struct LlCombineArgs {
  LlLayout layout;
  const void* input;         // token-major [rows][...]; expert-major [E][W*M][hidden] bf16
  int64_t input_row_stride;  // bytes between rows (expert-major: rows of one expert)
  int64_t input_rows;        // token-major: rows present (>= total_recv)
  CombineDtype dtype;        // token-major: of input and output; expert-major bf16
  const float* weights;      // token-major: [rows][K] combined alongside, or nullptr
  // Token-major: the dispatch output's src_pos and row count.
  const int32_t* src_pos = nullptr;
  int64_t total_recv = 0;
  // Expert-major: the dispatch's handle.
  const int32_t* src_info = nullptr;
  int64_t src_info_stride = 0;
  const int64_t* layout_range = nullptr;
  const int32_t* slot_k = nullptr;
  const int32_t* packed_count = nullptr;
  // Expert-major, at the source: the routing and the weights of the reduction.
  const int32_t* topk_idx = nullptr;    // [num_tokens][K]
  const float* topk_weights = nullptr;  // [num_tokens][K], nullptr: 1
  int64_t num_tokens = 0;
  void* out = nullptr;           // [num_tokens][hidden_dim]
  float* out_weights = nullptr;  // token-major: [num_tokens][K] or nullptr
  bool fp8_cast = false;         // token-major bf16: MORI's fp8_direct_cast
  // Token-major bf16: MORI's fp8_blockwise, 0 off, else the scale blocks per row
  // (common/numeric.hpp).
  int fp8_block_scale_dim = 0;
  // Expert-major: reduce per rank on the experts' pe with the weights the dispatch
  // sent (low_latency/protocol.hpp); topk_weights is then not read.
  bool pre_reduce = false;
};

// The wire tags a call posts in its flags (low_latency/protocol.hpp, LlTagName).
MORI_HOST_DEVICE inline uint32_t LlDispatchTag(const LlDispatchArgs& a) {
  if (a.layout == LlLayout::kExpertMajor)
    return LlExpertTag(a.dtype_tag, a.fp8_cast, a.round_scale);
  return a.dtype_tag;
}

// Whether a combine exchanges weights (its flags' LlCombineWord): token-major with
// out_weights set (MORI's combine with weights; its input weights then go out with
// the rows). Expert-major combines weight their rows at the source or on the experts'
// pe from the dispatch's weights, and exchange none.
MORI_HOST_DEVICE inline bool LlCombineWeights(const LlCombineArgs& a) {
  return a.layout == LlLayout::kTokenMajor && a.out_weights != nullptr;
}

MORI_HOST_DEVICE inline uint32_t LlCombineTag(const LlCombineArgs& a) {
  if (a.layout == LlLayout::kExpertMajor)
    return a.pre_reduce ? kLlTagExpertPartial : kLlTagExpertBf16;
  if (a.fp8_block_scale_dim > 0) return kLlTagBf16Fp8Blockwise;
  return a.fp8_cast ? kLlTagBf16AsFp8 : CombineDtypeTag(a.dtype);
}

}  // namespace mori::ep
