// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The element types that cross the wire and their codes in the signal words, shared
// by every mode: a word carries its sender's dtype code, so every pe sees every pe's
// dtype in the exchange it already waits for and fails the call where they differ.

#include <cstdint>

#include "mori/shmem/context.hpp"  // MORI_HOST_DEVICE

namespace mori::ep {

// Element type of combine's input and output. kFloat8E4M3 (e4m3fn) accumulates in
// fp32 like the others and is rounded once, saturating (common/numeric.hpp).
// kFloat4E2M1x2 is torch's float4_e2m1fn_x2: one byte holds two e2m1 values (low
// nibble first), a row of hidden_dim elements is hidden_dim bytes (2 * hidden_dim
// values); each value is summed in fp32 and rounded once, saturating (MORI's combine of
// its mori_fp4x2_e2m1 type). Host heaps only.
enum class CombineDtype : int { kBFloat16 = 0, kFloat32 = 1, kFloat8E4M3 = 2, kFloat4E2M1x2 = 3 };

// The dtype codes of float4_e2m1fn_x2 rows, beside the other dtypes' (1..4) and the
// low-latency wire tags (low_latency/protocol.hpp, 5..14): rows of hidden_dim bytes, and
// rows of hidden_dim / 2 bytes (hidden_dim e2m1 values: MORI's fp4 dispatch beside a
// combine of hidden_dim columns), so ranks passing the two widths fail like two dtypes.
inline constexpr uint32_t kDtypeTagFp4x2 = 15;
inline constexpr uint32_t kDtypeTagFp4x2Half = 16;

// A combine dtype's tag in the combine words (intranode/protocol.hpp) and the
// low-latency combine flags (DtypeTagName).
MORI_HOST_DEVICE inline uint32_t CombineDtypeTag(CombineDtype dtype) {
  switch (dtype) {
    case CombineDtype::kBFloat16:
      return 1;
    case CombineDtype::kFloat8E4M3:
      return 2;
    case CombineDtype::kFloat4E2M1x2:
      return kDtypeTagFp4x2;
    default:
      return 4;
  }
}

// The dtype tags of the count and combine words (mori.ep passes a dispatch's token
// dtype; combine's is CombineDtypeTag), as the messages name them.
MORI_HOST_DEVICE inline const char* DtypeTagName(uint32_t tag) {
  switch (tag) {
    case 1:
      return "bfloat16";
    case 2:
      return "float8_e4m3fn";
    case 3:
      return "float16";
    case 4:
      return "float32";
    case kDtypeTagFp4x2:
      return "float4_e2m1fn_x2";
    case kDtypeTagFp4x2Half:
      return "float4_e2m1fn_x2 (rows of hidden_dim / 2 bytes)";
    default:
      return "unknown";
  }
}

}  // namespace mori::ep
