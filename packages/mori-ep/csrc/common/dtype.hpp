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
enum class CombineDtype : int { kBFloat16 = 0, kFloat32 = 1, kFloat8E4M3 = 2 };

// A combine dtype's tag in the combine words (intranode/protocol.hpp) and the
// low-latency combine flags (DtypeTagName).
MORI_HOST_DEVICE inline uint32_t CombineDtypeTag(CombineDtype dtype) {
  return dtype == CombineDtype::kBFloat16 ? 1 : dtype == CombineDtype::kFloat8E4M3 ? 2 : 4;
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
    default:
      return "unknown";
  }
}

}  // namespace mori::ep
