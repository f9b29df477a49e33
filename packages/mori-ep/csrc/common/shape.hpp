// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The shape of an op, as every mode's buffer layout and implementations take it, and
// the placement rules the modes share (experts rank-major, MORI's src_pos encoding).

#include <cstddef>
#include <cstdint>

#include "mori/shmem/context.hpp"  // MORI_HOST_DEVICE

namespace mori::ep {

struct EpShape {
  int world_size;
  int rank;
  int64_t max_tokens;  // M
  int top_k;           // K
  int64_t hidden_dim;
  int64_t hidden_bytes;       // hidden_dim * max_token_type_size
  int64_t combine_row_bytes;  // hidden_dim * max(max_token_type_size, 2)
  int64_t scale_bytes;
  int num_experts_per_rank;
  // Rows of the receive buffers (C); 0: W * M, every row any pe can send here.
  // Smaller (MORI's max_total_recv_tokens) caps the memory; a dispatch that would
  // deliver more rows to some pe fails on every pe before any row moves. The
  // low-latency protocol takes W times its slots per source pe here (LlRecvSlots).
  int64_t recv_capacity = 0;
};

inline int64_t RecvCapacity(const EpShape& s) {
  return s.recv_capacity > 0 ? s.recv_capacity : s.world_size * s.max_tokens;
}

MORI_HOST_DEVICE inline size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Hands out a symmetric block's regions in order, each starting at a 256-byte
// boundary (the modes' layouts); `end` is the block's size so far.
struct RegionCursor {
  size_t end = 0;
  size_t Take(size_t bytes) {
    const size_t at = end;
    end = AlignUp(end + bytes, 256);
    return at;
  }
};

// Rank-major expert placement (MORI's): global expert e lives on pe e / experts_per_rank.
MORI_HOST_DEVICE inline int ExpertRank(int32_t expert, int experts_per_rank) {
  return expert / experts_per_rank;
}

MORI_HOST_DEVICE inline int32_t EncodeSrcPos(int src_pe, int64_t token, int64_t max_tokens) {
  return static_cast<int32_t>(src_pe * max_tokens + token);
}

}  // namespace mori::ep
