// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "layout/layout.hpp"

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

void ValidateLocalExpertCountArgs(const LocalExpertCountArgs& a) {
  MORI_CHECK_ARG(a.indices != nullptr && a.total_recv != nullptr && a.counts != nullptr,
                 "local expert count requires non-null indices, total_recv_token_num and output ",
                 "addresses (got ", reinterpret_cast<uintptr_t>(a.indices), ", ",
                 reinterpret_cast<uintptr_t>(a.total_recv), ", ",
                 reinterpret_cast<uintptr_t>(a.counts), ")");
  MORI_CHECK_ARG(a.rank >= 0, "rank ", a.rank, " must be >= 0");
  MORI_CHECK_ARG(a.num_experts_per_rank >= 1, "num_experts_per_rank ", a.num_experts_per_rank,
                 " must be >= 1");
  MORI_CHECK_ARG(a.top_k >= 0, "num_experts_per_token ", a.top_k, " must be >= 0");
  MORI_CHECK_ARG(static_cast<int64_t>(a.rank) * a.num_experts_per_rank < (int64_t{1} << 31),
                 "rank ", a.rank, " * num_experts_per_rank ", a.num_experts_per_rank,
                 " overflows an int32 expert id");
}

void LocalExpertCountCpu(const LocalExpertCountArgs& a) {
  ValidateLocalExpertCountArgs(a);
  const int64_t base = static_cast<int64_t>(a.rank) * a.num_experts_per_rank;
  std::memset(a.counts, 0, sizeof(int32_t) * a.num_experts_per_rank);
  const int64_t assignments = static_cast<int64_t>(*a.total_recv) * a.top_k;
  for (int64_t i = 0; i < assignments; ++i) {
    const int64_t local = a.indices[i] - base;
    if (local >= 0 && local < a.num_experts_per_rank) ++a.counts[local];
  }
}

void CheckLocalExpertCountLaunch(int blocks, int warps_per_block) {
  MORI_CHECK_ARG(blocks >= 1 && warps_per_block >= 1,
                 "launch_local_expert_count requires positive block and warp settings (block_num ",
                 blocks, ", warp_per_block ", warps_per_block,
                 "; a call's value <= 0 takes the config's block_num / warp_num_per_block)");
  MORI_CHECK_ARG(warps_per_block <= 32, "warp_per_block ", warps_per_block,
                 " exceeds 32 (1024 threads per block)");
}

#if !MORI_EP_WITH_CUDA
void LaunchLocalExpertCount(const LocalExpertCountArgs& a, int blocks, int warps_per_block,
                            uintptr_t stream) {
  (void)stream;  // no device: the count has finished when this returns
  CheckLocalExpertCountLaunch(blocks, warps_per_block);
  LocalExpertCountCpu(a);
}
#endif

}  // namespace mori::ep
