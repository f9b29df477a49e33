// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "layout.hpp"

#include <cstring>

#include "mori/core/error.hpp"

namespace mori::ep {

void ValidateLayoutArgs(const LayoutArgs& a) {
  MORI_CHECK_ARG(a.num_tokens >= 0, "num_tokens ", a.num_tokens, " must be >= 0");
  MORI_CHECK_ARG(a.top_k >= 1, "top_k ", a.top_k, " must be >= 1");
  MORI_CHECK_ARG(a.world_size >= 1, "world_size ", a.world_size, " must be >= 1");
  MORI_CHECK_ARG(a.num_experts >= a.world_size && a.num_experts % a.world_size == 0, "num_experts ",
                 a.num_experts, " must be a positive multiple of world_size ", a.world_size);
}

void DispatchLayoutCpu(const LayoutArgs& a) {
  ValidateLayoutArgs(a);
  const int experts_per_rank = a.num_experts / a.world_size;
  std::memset(a.tokens_per_rank, 0, sizeof(int32_t) * a.world_size);
  std::memset(a.tokens_per_expert, 0, sizeof(int32_t) * a.num_experts);
  std::memset(a.token_in_rank, 0, sizeof(bool) * a.num_tokens * a.world_size);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int32_t* row = a.indices + t * a.top_k;
    bool* in_rank = a.token_in_rank + t * a.world_size;
    for (int j = 0; j < a.top_k; ++j) {
      const int32_t e = row[j];
      if (e == -1) continue;
      MORI_CHECK_ARG(e >= 0 && e < a.num_experts, "expert id ", e, " out of range [-1, ",
                     a.num_experts, ") at token ", t, " slot ", j);
      ++a.tokens_per_expert[e];
      const int r = e / experts_per_rank;
      if (!in_rank[r]) {
        in_rank[r] = true;
        ++a.tokens_per_rank[r];
      }
    }
  }
}

}  // namespace mori::ep
