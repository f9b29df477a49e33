// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// ROCm/mori's raw dispatch/combine config: the C++ struct its raw Python module
// (mori.cpp) binds as EpDispatchCombineConfig, with the fields, the defaults of that
// binding and the capacity rules it offers. mori's ops take the Python dataclass
// (mori.ep.EpDispatchCombineConfig); this struct serves the raw calls MORI makes
// with the bound config (launch_local_expert_count) and code that builds one.

#include <cstdint>

#include "mori/core/error.hpp"

namespace mori::ep {

// Receive rows per source rank under MORI's max_total_recv_tokens rule: M without a
// cap (cap <= 0), else min(ceil(cap / world_size), M), so a cap above the worst case
// W * M is clamped to it.
inline int64_t MaxRecvTokensPerRank(int64_t cap, int64_t world_size, int64_t max_tokens) {
  if (cap <= 0) return max_tokens;
  MORI_CHECK_ARG(world_size >= 1, "max_total_recv_tokens ", cap, " needs world_size >= 1, got ",
                 world_size);
  const int64_t per_rank = (cap + world_size - 1) / world_size;
  return per_rank < max_tokens ? per_rank : max_tokens;
}

// Kernel and quant type values are MORI's (EpDispatchCombineKernelType,
// EpDispatchCombineQuantType); the binding converts them to those enums.
inline constexpr int kNumKernelTypes = 6;
inline constexpr int kNumQuantTypes = 4;

struct RawDispatchCombineConfig {
  int rank = 0;
  int world_size = 0;
  int hidden_dim = 0;
  int scale_dim = 0;
  int scale_type_size = 0;
  int max_token_type_size = 0;
  int max_num_inp_token_per_rank = 0;
  int num_experts_per_rank = 0;
  int num_experts_per_token = 0;
  int max_total_recv_tokens = 0;
  int warp_num_per_block = 0;
  int block_num = 0;
  bool use_external_inp_buf = true;
  int kernel_type = 0;  // IntraNode
  int gpu_per_node = 8;
  int rdma_block_num = 0;
  int num_qp_per_pe = 1;
  int quant_type = 0;  // None

  int64_t MaxNumTokensToSendPerRank() const { return max_num_inp_token_per_rank; }
  int64_t MaxNumTokensToSend() const {
    return static_cast<int64_t>(world_size) * max_num_inp_token_per_rank;
  }
  int64_t MaxNumTokensToRecvPerRank() const {
    return MaxRecvTokensPerRank(max_total_recv_tokens, world_size, max_num_inp_token_per_rank);
  }
  int64_t MaxNumTokensToRecv() const { return world_size * MaxNumTokensToRecvPerRank(); }
};

}  // namespace mori::ep
