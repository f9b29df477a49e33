// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The intra-node dispatch/combine protocol over mori's symmetric heap: the buffer
// layout and the signal encodings, shared by the CPU implementation
// (intranode/cpu.cpp, host_ops.hpp) and the CUDA kernels (intranode/kernels/,
// mori/shmem/device.cuh).
// No Python, no torch, nothing that cannot run on a device. The README of
// mori-ep describes the protocol step by step with a worked example.
//
// One symmetric block per op, identical layout on every pe (offsets in bytes from
// the block's start). W = world_size, M = max_num_inp_token_per_rank,
// C = receive capacity (W * M unless capped: EpShape::recv_capacity), K = num_experts_per_token, H
// = hidden bytes (hidden_dim * max_token_type_size), Hc = combine row bytes (hidden_dim *
// max(max_token_type_size, 2)), S = scale bytes (scale_dim * scale_type_size).
//
//   signals (written by peers)
//     count_words    u64 [W][W]   row s, column d: (epoch << kCountBits) | (row tag <<
//                                 kCountFieldBits) | count(s -> d),
//                                 written by pe s into every pe (its routing row)
//     dispatch_done  u64 [W]      entry s = epoch once pe s has written all its rows here
//     combine_done   u64 [W][G]   entry [d][g] = CombineWord(epoch, dtype, rejected, weights)
//                                 once pe d has returned here every row of this pe's tokens
//                                 in group g (G = ceil(M / kCombineGroupTokens) token
//                                 groups); weights: pe d's call combines weights (it
//                                 returned its rows' weights too; pes that differ fail)
//   private to the pe, zeroed with the signals (the CUDA kernels' state; unused on CPU)
//     state          EpDeviceState
//   dispatch receive buffers (written by peers; rows [0, total_recv) valid)
//     recv_tokens    u8  [C][H]
//     recv_weights   f32 [C][K]
//     recv_scales    u8  [C][S]
//     recv_indices   i32 [C][K]
//     recv_src_pos   i32 [C]      src_pe * M + src_token (MORI's encoding)
//     recv_group_row i32 [W][G+1] row s, entry g: where the rows of pe s's tokens of group g
//                                 (tokens [g * kCombineGroupTokens, ...)) start here;
//                                 entry G = the end of pe s's rows. Written by pe s.
//   combine receive buffers (written by peers; slot [d][t], d != this pe: pe d's
//   partial row for this pe's token t; a pe's own partial row is read from its
//   combine input, row token_self_row[t], and never copied)
//     comb_tokens    u8  [W][M][Hc]
//     comb_weights   f32 [W][M][K]
//   private to the pe (in the block so device code can reach it; never written by
//   peers)
//     total_recv     i32 [1]
//     token_ranks    u8  [M][W]   1 where the pe's token t went to pe d (last dispatch)
//     token_self_row i32 [M]      the row of the pe's token t in its own receive buffer,
//                                 -1 when t did not go to this pe
//
// Ordering: rows from pe s land at d in the contiguous range
// [sum_{s' < s} count(s' -> d), + count(s -> d)), in the source's token order.
// Row order is therefore a function of the routing alone (not of timing), which
// makes dispatch reproducible bit for bit and fixes combine's reduction order
// (ascending destination pe).
//
// Combine signals per token group rather than once per pe, so a pe can reduce the
// groups whose rows have arrived while later groups are still in flight. A pe
// returns group g's rows only after waiting for groups < g at most, so every group
// is eventually returned (no cycle of waits), whatever each pe's grid or tiling.
// How a pe orders its returns and posts is its own choice (the CUDA kernel's
// one-pass path returns every row before posting every group's word at once): a
// word means the same either way, so pes need not agree on a path.

#include <cstddef>
#include <cstdint>

#include "common/dtype.hpp"
#include "common/shape.hpp"
#include "common/signal_words.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

// count_words are common/signal_words.hpp's CountWord; the op's shape is EpShape
// (common/shape.hpp).

// combine_done words are common/signal_words.hpp's CombineWord.
// Tokens per combine signal group (combine_done, recv_group_row).
inline constexpr int kCombineGroupTokens = 8;

// State the CUDA kernels keep in device memory, so that CUDA-graph replays advance
// it: the epoch of the last dispatch and the grid-completion counters of dispatch
// and of combine's one-pass path (each reset to 0 by the last block, before the
// kernel ends).
struct EpDeviceState {
  uint64_t epoch;
  uint32_t dispatch_blocks_done;
  uint32_t combine_blocks_done;
};

// Byte offsets of each region; every region starts on a 256-byte boundary so that
// vectorized (16-byte) device copies of a row are aligned whenever the row size is.
struct EpBufferLayout {
  size_t count_words, dispatch_done, combine_done, state;
  size_t recv_tokens, recv_weights, recv_scales, recv_indices, recv_src_pos, recv_group_row;
  size_t comb_tokens, comb_weights;
  size_t total_recv, token_ranks, token_self_row;
  size_t total_bytes;
};

MORI_HOST_DEVICE inline int64_t CombineGroups(int64_t max_tokens) {
  return (max_tokens + kCombineGroupTokens - 1) / kCombineGroupTokens;
}

inline EpBufferLayout MakeLayout(const EpShape& s) {
  const size_t W = s.world_size, M = s.max_tokens, C = RecvCapacity(s), K = s.top_k;
  const size_t G = static_cast<size_t>(CombineGroups(s.max_tokens));
  EpBufferLayout l{};
  RegionCursor region;
  l.count_words = region.Take(W * W * 8);
  l.dispatch_done = region.Take(W * 8);
  l.combine_done = region.Take(W * G * 8);
  l.state = region.Take(sizeof(EpDeviceState));
  l.recv_tokens = region.Take(C * s.hidden_bytes);
  l.recv_weights = region.Take(C * K * 4);
  l.recv_scales = region.Take(C * s.scale_bytes);
  l.recv_indices = region.Take(C * K * 4);
  l.recv_src_pos = region.Take(C * 4);
  l.recv_group_row = region.Take(W * (G + 1) * 4);
  l.comb_tokens = region.Take(W * M * s.combine_row_bytes);
  l.comb_weights = region.Take(W * M * K * 4);
  l.total_recv = region.Take(8);
  l.token_ranks = region.Take(M * W);
  l.token_self_row = region.Take(M * 4);
  l.total_bytes = region.end;
  return l;
}

// Bytes that must be zero before the first call (the signal words and the device
// state), from offset 0.
inline size_t SignalBytes(const EpBufferLayout& l) { return l.recv_tokens; }

}  // namespace mori::ep
