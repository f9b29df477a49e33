// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The arguments of an intra-node dispatch and combine, shared by the CPU
// implementation (intranode_cpu.hpp) and the CUDA kernels (intranode_cuda.hpp).
// Tensors arrive as pointers with sizes; shapes and dtypes were checked by the
// caller (mori.ep's Python layer).

#include <cstdint>

namespace mori::ep {

// Element type of combine's input and output. kFloat8E4M3 (e4m3fn) accumulates in
// fp32 like the others and is rounded once, saturating (numeric.hpp).
enum class CombineDtype : int { kBFloat16 = 0, kFloat32 = 1, kFloat8E4M3 = 2 };

struct DispatchArgs {
  const void* tokens;       // [num_tokens][token_row_bytes]
  int64_t token_row_bytes;  // hidden_dim * element size, <= shape.hidden_bytes
  const float* weights;     // [num_tokens][K]
  const void* scales;       // [num_tokens][scale_bytes], nullptr when scale_bytes == 0
  const int32_t* indices;   // [num_tokens][K], global expert ids, -1 = unused
  int64_t num_tokens;       // <= max_tokens
};

struct CombineArgs {
  const void* input;         // rows [0, total_recv) of expert outputs, in dispatch row order
  int64_t input_row_stride;  // bytes between rows
  int64_t input_rows;        // rows present (>= total_recv)
  CombineDtype dtype;        // of input and output
  const float* weights;      // [input_rows][K]; read only when out_weights is set
  void* out;                 // [num_tokens of the dispatch][hidden_dim]
  float* out_weights;        // [num_tokens][K], or nullptr: weights are not combined
  // MORI's fp8_direct_cast: every bf16 row is rounded to fp8 e4m3fn before it is
  // reduced (the CUDA kernels send it as fp8), then accumulated in fp32 (bf16 only).
  bool fp8_cast = false;
};

}  // namespace mori::ep
