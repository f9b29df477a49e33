// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CPU implementation of the intra-node protocol (intranode/protocol.hpp), written with
// the host counterparts of the device API (mori/shmem/host_ops.hpp) in the order a
// CUDA kernel issues the same operations, so the two stay comparable line by line.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/call_checks.hpp"
#include "common/host_block.hpp"
#include "common/numeric.hpp"
#include "intranode/cpu.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/host_ops.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

namespace hs = mori::shmem::host;
using mori::shmem::Cmp;

void CombineOrder::ThrowNotCombinable(const RoutingSnapshot* routing, uint64_t epoch) const {
  const uint64_t combined_epoch = combined_epoch_;
  if (routing == nullptr) {
    MORI_THROW(InvalidStateError, "combine needs a successful dispatch not combined yet (last ",
               "dispatch epoch ", epoch, ", last combine epoch ", combined_epoch, ")");
  }
  MORI_THROW(InvalidStateError, "combine by a routing handle of dispatch epoch ",
             routing->host_epoch,
             ": combines follow the order of their dispatches, once each, and ",
             "the last combine was of epoch ", combined_epoch, " (last dispatch epoch ", epoch,
             "); replay the handle (dispatch(..., routing=handle)) to combine it again");
}

IntraNodeCpu::IntraNodeCpu(const EpShape& shape, void* block, std::chrono::milliseconds timeout)
    : shape_(shape),
      layout_(MakeLayout(shape)),
      block_(static_cast<char*>(block)),
      ctx_(shmem::GetDeviceContext()),
      timeout_(CheckedTimeout(timeout, "timeout")) {
  CheckHostBlock(shape, ctx_, block, layout_.total_bytes, "intra-node");
  std::memset(block_, 0, SignalBytes(layout_));
  shmem::BarrierAll();
}

void IntraNodeCpu::PostCounts(uint64_t epoch, const uint64_t* counts, uint32_t row_tag) {
  const int W = shape_.world_size, me = shape_.rank;
  uint64_t* row = At<uint64_t>(layout_.count_words) + static_cast<size_t>(me) * W;
  for (int pe = 0; pe < W; ++pe) {
    for (int d = 0; d < W; ++d)
      hs::SignalSet(ctx_, &row[d], CountWord(epoch, counts[d], row_tag), pe);
  }
}

int IntraNodeCpu::WaitCounts(uint64_t epoch) {
  const int W = shape_.world_size;
  const uint64_t* words = At<uint64_t>(layout_.count_words);
  int rejected_by = -1;
  for (int s = 0; s < W; ++s) {
    for (int d = 0; d < W; ++d) {
      const uint64_t w = WaitPeerWord(&words[s * W + d], EpochFloor(epoch), timeout_, shape_.rank,
                                      s, {"dispatch", epoch, "count words", kCountBits});
      MORI_CHECK(EpochOf(w) == (epoch & kEpochMask), "count word from pe ", s, " has epoch ",
                 EpochOf(w), ", expected ", epoch);
      if (CountOf(w) == kRejectedCount && rejected_by < 0) rejected_by = s;
    }
  }
  return rejected_by;
}

void IntraNodeCpu::FinishDispatchEpoch(uint64_t epoch) {
  const int W = shape_.world_size, me = shape_.rank;
  uint64_t* done = At<uint64_t>(layout_.dispatch_done);
  // Release: a pe that sees `epoch` in done[me] sees every row written before, and
  // knows this pe has read every count word of the epoch (so the next epoch's words
  // may overwrite them).
  for (int d = 0; d < W; ++d) hs::SignalSet(ctx_, &done[me], epoch, d);
  for (int s = 0; s < W; ++s) {
    WaitPeerWord(&done[s], epoch, timeout_, me, s, {"dispatch", epoch, "rows written", 0});
  }
}

void IntraNodeCpu::RejectDispatch(const std::string& reason) {
  const uint64_t epoch = ++epoch_;
  order_.Dispatched(false);
  std::vector<uint64_t> counts(shape_.world_size, kRejectedCount);
  PostCounts(epoch, counts.data(), 0);
  WaitCounts(epoch);
  FinishDispatchEpoch(epoch);
  throw InvalidArgumentError(reason);
}

int64_t IntraNodeCpu::Dispatch(const DispatchArgs& a) {
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int64_t M = shape_.max_tokens;
  // Counting pass (also the expert id check; a replay takes the sets as given):
  // nothing has been written yet.
  uint8_t* token_ranks = At<uint8_t>(layout_.token_ranks);
  std::vector<uint64_t> counts(W, 0);
  RouteTokens(shape_, a, token_ranks, counts.data(),
              [this](const std::string& reason) { RejectDispatch(reason); });

  const uint64_t epoch = ++epoch_;
  order_.Dispatched(false);
  PostCounts(epoch, counts.data(), a.row_tag);
  // Every pe's row for this epoch: the routing matrix, and the proof that each
  // destination has entered this call (so its receive buffers are free to write).
  const uint64_t* words = At<uint64_t>(layout_.count_words);
  CheckCountExchange(WaitCounts(epoch), words, W, [&] { FinishDispatchEpoch(epoch); });
  std::vector<int64_t> next_row(W);  // where my next row lands on pe d
  int64_t total_recv = 0;
  for (int d = 0; d < W; ++d) {
    int64_t base = 0;
    for (int s = 0; s < me; ++s) base += CountOf(words[s * W + d]);
    next_row[d] = base;
  }
  for (int s = 0; s < W; ++s) total_recv += CountOf(words[s * W + me]);
  // Every pe sees the same count matrix, so every pe finds the same overflow and
  // fails the call before a row moves.
  const int64_t capacity = RecvCapacity(shape_);
  for (int d = 0; d < W; ++d) {
    int64_t rows = 0;
    for (int s = 0; s < W; ++s) rows += CountOf(words[s * W + d]);
    if (rows > capacity) {
      FinishDispatchEpoch(epoch);
      MORI_THROW(InvalidArgumentError, "dispatch would deliver ", rows, " tokens to rank ", d,
                 ", more than the receive capacity of ", capacity,
                 " rows (max_total_recv_tokens); no data moved");
    }
  }

  // Data: rows in token order, each to every destination it routes to.
  const int64_t H = shape_.hidden_bytes, Sb = shape_.scale_bytes;
  char* recv_tokens = At<char>(layout_.recv_tokens);
  float* recv_weights = At<float>(layout_.recv_weights);
  char* recv_scales = At<char>(layout_.recv_scales);
  int32_t* recv_indices = At<int32_t>(layout_.recv_indices);
  int32_t* recv_src_pos = At<int32_t>(layout_.recv_src_pos);
  const char* tokens = static_cast<const char*>(a.tokens);
  const char* scales = static_cast<const char*>(a.scales);
  int32_t* recv_group_row = At<int32_t>(layout_.recv_group_row);
  int32_t* token_self_row = At<int32_t>(layout_.token_self_row);
  const int64_t G = CombineGroups(M);
  // Where the rows of my token group g start on pe d: the next row there when the
  // group's first token comes up (entries past my tokens, and entry G: the end).
  auto post_group_row = [&](int64_t g) {
    for (int d = 0; d < W; ++d) {
      const int32_t row = static_cast<int32_t>(next_row[d]);
      hs::PutNbi(ctx_, recv_group_row + me * (G + 1) + g, &row, sizeof(row), d);
    }
  };
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const uint8_t* ranks = token_ranks + t * W;
    const int32_t src_pos = EncodeSrcPos(me, t, M);
    if (t % kCombineGroupTokens == 0) post_group_row(t / kCombineGroupTokens);
    token_self_row[t] = ranks[me] ? static_cast<int32_t>(next_row[me]) : -1;
    for (int d = 0; d < W; ++d) {
      if (!ranks[d]) continue;
      const int64_t r = next_row[d]++;
      hs::PutNbi(ctx_, recv_tokens + r * H, tokens + t * a.token_row_bytes, a.token_row_bytes, d);
      hs::PutNbi(ctx_, recv_weights + r * K, a.weights + t * K, K * sizeof(float), d);
      if (Sb > 0) hs::PutNbi(ctx_, recv_scales + r * Sb, scales + t * Sb, Sb, d);
      hs::PutNbi(ctx_, recv_indices + r * K, a.indices + t * K, K * sizeof(int32_t), d);
      hs::PutNbi(ctx_, recv_src_pos + r, &src_pos, sizeof(int32_t), d);
    }
  }
  for (int64_t g = (a.num_tokens + kCombineGroupTokens - 1) / kCombineGroupTokens; g <= G; ++g) {
    post_group_row(g);
  }
  FinishDispatchEpoch(epoch);

  *At<int32_t>(layout_.total_recv) = static_cast<int32_t>(total_recv);
  total_recv_ = total_recv;
  num_tokens_ = a.num_tokens;
  order_.Dispatched(true);
  return total_recv;
}

RoutingSnapshot IntraNodeCpu::LastRouting() const {
  return RoutingSnapshot{At<int32_t>(layout_.recv_src_pos),
                         At<int32_t>(layout_.recv_group_row),
                         At<uint8_t>(layout_.token_ranks),
                         At<int32_t>(layout_.token_self_row),
                         At<int32_t>(layout_.total_recv),
                         &epoch_,
                         epoch_,
                         num_tokens_};
}

void IntraNodeCpu::FinishCombine(uint64_t epoch, bool rejected, uint32_t tag, bool weights) {
  const int W = shape_.world_size, me = shape_.rank;
  const int64_t G = CombineGroups(shape_.max_tokens);
  uint64_t* done = At<uint64_t>(layout_.combine_done);
  // Every group's word, as the CUDA kernels post them group by group. The weights bit:
  // a pe returns weights only when it combines them, so a pe that asks for them beside
  // one that does not would reduce an earlier call's; both fail here instead.
  const uint64_t mine = CombineWord(epoch, rejected ? 0 : tag, rejected, weights && !rejected);
  for (int s = 0; s < W; ++s) {
    for (int64_t g = 0; g < G; ++g) hs::SignalSet(ctx_, &done[me * G + g], mine, s);
  }
  CombineVote vote(tag, weights);
  for (int d = 0; d < W; ++d) {
    for (int64_t g = 0; g < G; ++g) {
      vote.Add(d, WaitPeerWord(&done[d * G + g], CombineFloor(epoch), timeout_, me, d,
                               {"combine", epoch, "combine rows", kCombineEpochShift}));
    }
  }
  if (!rejected) vote.ThrowIfFailed();
}

void IntraNodeCpu::RejectCombine(const std::string& reason, const RoutingSnapshot* routing) {
  const RoutingSnapshot last = LastRouting();
  if (const RoutingSnapshot* r = order_.Pick(routing, last)) {
    if (order_.Enter(r->host_epoch)) shmem::BarrierAll();
    FinishCombine(r->host_epoch, true, 0, false);
  }
  throw InvalidArgumentError(reason);
}

void IntraNodeCpu::Combine(const CombineArgs& a) {
  const RoutingSnapshot last = LastRouting();
  const RoutingSnapshot* r = order_.Pick(a.routing, last);
  if (r == nullptr) order_.ThrowNotCombinable(a.routing, epoch_);
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int64_t M = shape_.max_tokens;
  const int64_t row_bytes = shape_.hidden_dim * CombineElementBytes(a.dtype);
  if (row_bytes > shape_.combine_row_bytes) {
    RejectCombine(StrCat("combine rows of ", row_bytes, " bytes exceed the combine buffer's ",
                         shape_.combine_row_bytes, " (hidden_dim * max(max_token_type_size, 2))"),
                  a.routing);
  }
  if (a.fp8_cast && a.dtype != CombineDtype::kBFloat16) {
    RejectCombine("fp8_direct_cast combines bf16 input only", a.routing);
  }
  const int S = a.fp8_block_scale_dim;
  if (S > 0 && a.dtype != CombineDtype::kBFloat16) {
    RejectCombine("fp8_blockwise combines bf16 input only", a.routing);
  }
  const int64_t wire_bytes = S > 0 ? BlockwiseRowBytes(shape_.hidden_dim, S) : row_bytes;
  if (wire_bytes > shape_.combine_row_bytes) {
    RejectCombine(StrCat("fp8_blockwise rows of ", wire_bytes, " bytes (", shape_.hidden_dim,
                         " fp8 values and ", S, " fp32 scales) exceed the combine buffer's ",
                         shape_.combine_row_bytes),
                  a.routing);
  }
  const int64_t total_recv = *r->total_recv, num_tokens = r->num_tokens;
  if (a.input_rows < total_recv) {
    RejectCombine(
        StrCat("combine input has ", a.input_rows, " rows, fewer than total_recv ", total_recv),
        a.routing);
  }
  const uint64_t epoch = r->host_epoch;
  if (order_.Enter(epoch)) shmem::BarrierAll();  // CombineOrder
  // out_weights says whether weights are combined; `weights` may be null only when
  // it has no rows (total_recv == 0: an empty tensor's address).
  const bool with_weights = a.out_weights != nullptr;
  const int64_t Hc = shape_.combine_row_bytes;
  char* comb_tokens = At<char>(layout_.comb_tokens);
  float* comb_weights = At<float>(layout_.comb_weights);
  const int32_t* src_pos = r->src_pos;
  const char* input = static_cast<const char*>(a.input);
  // Row i goes back to its source pe s, into slot [me][t] there; my own rows stay in
  // the input (token_self_row). No pe writes these slots of s again before s has
  // finished reducing them: the next combine follows a dispatch, whose count exchange
  // waits for s to enter it, or a combine, and then the barrier above.
  // fp8_blockwise: every row quantized once, here (the peers' rows to send and my own
  // rows, which stay here), into `wire` at the row's index.
  std::vector<char> wire(S > 0 ? static_cast<size_t>(total_recv) * wire_bytes : 0);
  for (int64_t i = 0; S > 0 && i < total_recv; ++i) {
    QuantizeRowFp8Blockwise(reinterpret_cast<const uint16_t*>(input + i * a.input_row_stride),
                            shape_.hidden_dim, S, wire.data() + i * wire_bytes);
  }
  for (int64_t i = 0; i < total_recv; ++i) {
    const int s = static_cast<int>(src_pos[i] / M);
    if (s == me) continue;
    const int64_t t = src_pos[i] % M;
    const size_t slot = static_cast<size_t>(me) * M + t;
    const char* row = S > 0 ? wire.data() + i * wire_bytes : input + i * a.input_row_stride;
    hs::PutNbi(ctx_, comb_tokens + slot * Hc, row, wire_bytes, s);
    if (with_weights) hs::PutNbi(ctx_, comb_weights + slot * K, a.weights + i * K, K * 4, s);
  }
  FinishCombine(epoch, false, S > 0 ? kCombineTagFp8Blockwise : CombineDtypeTag(a.dtype),
                with_weights);

  // Reduce: for each of my tokens, the rows of the pes it went to, in ascending pe
  // order, accumulated in fp32 and rounded once.
  const uint8_t* token_ranks = r->token_ranks;
  const int32_t* token_self_row = r->token_self_row;
  const int64_t hidden = shape_.hidden_dim;
  std::vector<float> acc(hidden);
  std::vector<int> pes(W);  // the pes of a token's parts, ascending
  for (int64_t t = 0; t < num_tokens; ++t) {
    const uint8_t* ranks = token_ranks + t * W;
    const int64_t self_row = token_self_row[t];
    int parts = 0;
    for (int d = 0; d < W; ++d) {
      if (ranks[d]) pes[parts++] = d;
    }
    auto row_of = [&](int i) -> const char* {
      const int d = pes[i];
      if (d == me) {
        return S > 0 ? wire.data() + self_row * wire_bytes : input + self_row * a.input_row_stride;
      }
      return comb_tokens + (static_cast<size_t>(d) * M + t) * Hc;
    };
    if (S > 0) {
      CombineTokenRowFp8Blockwise(
          parts, row_of, hidden, S, acc.data(),
          reinterpret_cast<uint16_t*>(static_cast<char*>(a.out) + t * row_bytes));
    } else {
      CombineTokenRow(parts, row_of, a.dtype, a.fp8_cast, hidden, acc.data(),
                      static_cast<char*>(a.out) + t * row_bytes);
    }
    if (with_weights) {
      auto weights_of = [&](int i) -> const float* {
        const int d = pes[i];
        if (d == me) return a.weights + self_row * K;
        return comb_weights + (static_cast<size_t>(d) * M + t) * K;
      };
      CombineTokenWeights(parts, weights_of, K, a.out_weights + t * K);
    }
  }
}

}  // namespace mori::ep
