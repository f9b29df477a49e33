// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The arguments of a dispatch and a combine, and the order in which combines may
// reverse dispatches, shared by the modes that take MORI's token-major calls: the
// intra-node CPU implementation and CUDA kernels (intranode/cpu.hpp, cuda.hpp) and
// the inter-node CPU implementation (internode/cpu.hpp).
// Tensors arrive as pointers with sizes; shapes and dtypes were checked by the
// caller (mori.ep's Python layer).

#include <cstdint>

#include "common/dtype.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

struct DispatchArgs {
  const void* tokens;       // [num_tokens][token_row_bytes]
  int64_t token_row_bytes;  // hidden_dim * element size, <= shape.hidden_bytes
  const float* weights;     // [num_tokens][K]
  const void* scales;       // [num_tokens][scale_bytes], nullptr when scale_bytes == 0
  const int32_t* indices;   // [num_tokens][K], global expert ids, -1 = unused
  int64_t num_tokens;       // <= max_tokens
  // A replayed routing (mori.ep's routing handles): per token the set of destination
  // pes (bit d: pe d), taken instead of the sets in `indices`, which then travel as
  // data only (not checked). Null: route by `indices`.
  const uint32_t* rank_masks = nullptr;
  // The rows' dtype code (intranode/protocol.hpp, DtypeTagName), posted with the counts: every pe
  // compares every pe's and fails the call when they differ.
  uint32_t row_tag = 0;
};

// The routing a combine reverses: the op's last dispatch (its block's regions), or a
// snapshot of an earlier dispatch (mori.ep's EpDispatchRoutingHandle), so that the
// combines of several dispatches can be pending at once. Addresses on the op's
// device; the regions are those of intranode/protocol.hpp.
struct RoutingSnapshot {
  const int32_t* src_pos;         // [C] recv_src_pos of the received rows
  const int32_t* group_row;       // [W][G + 1] recv_group_row
  const uint8_t* token_ranks;     // [M][W]
  const int32_t* token_self_row;  // [M]
  const int32_t* total_recv;      // [1]
  const uint64_t* epoch;          // [1] the epoch of the dispatch it describes
  uint64_t host_epoch;            // the same, as the host issued it (order checks)
  int64_t num_tokens;             // tokens this pe dispatched in that call
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
  // Null: the last dispatch's routing.
  const RoutingSnapshot* routing = nullptr;
  // MORI's fp8_blockwise (common/numeric.hpp, QuantizeRowFp8Blockwise): 0 off, else
  // the scale blocks per row; bf16 rows cross as fp8 blocks with fp32 scales.
  int fp8_block_scale_dim = 0;
};

// Which dispatch a combine may reverse, as both implementations track it on the host.
// Combines consume the dispatches' epochs in increasing order (each pe's combine_done
// words only grow), so a routing of epoch e is combined once, after every combine of
// an earlier dispatch and before any of a later one; the last dispatch's routing
// needs that dispatch to have succeeded. A combine right after a combine (routing
// snapshots) must start with a barrier: no pe may return rows into a peer's slots
// before that peer has reduced the previous combine's.
class CombineOrder {
 public:
  // A dispatch was issued (ok: it succeeded).
  void Dispatched(bool ok) {
    dispatch_ok_ = ok;
    last_call_combine_ = false;
  }
  bool Pending(uint64_t epoch) const { return dispatch_ok_ && epoch > combined_epoch_; }
  uint64_t combined_epoch() const { return combined_epoch_; }
  // The routing this combine reverses: `routing`, or with none the last dispatch's
  // (`last`); nullptr when that routing may not be combined now.
  const RoutingSnapshot* Pick(const RoutingSnapshot* routing, const RoutingSnapshot& last) const {
    if (routing == nullptr) return Pending(last.host_epoch) ? &last : nullptr;
    const uint64_t e = routing->host_epoch;
    return e > combined_epoch_ && e <= last.host_epoch ? routing : nullptr;
  }
  // Records a combine of `epoch`; true when the barrier must come first.
  bool Enter(uint64_t epoch) {
    const bool barrier = last_call_combine_;
    last_call_combine_ = true;
    combined_epoch_ = epoch;
    return barrier;
  }
  // InvalidStateError for a combine Pick refused, naming the epochs (`epoch`: the
  // last dispatch's).
  [[noreturn]] void ThrowNotCombinable(const RoutingSnapshot* routing, uint64_t epoch) const;

 private:
  uint64_t combined_epoch_ = 0;
  bool dispatch_ok_ = false;
  bool last_call_combine_ = false;
};

}  // namespace mori::ep
