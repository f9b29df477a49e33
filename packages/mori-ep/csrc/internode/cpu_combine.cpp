// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The combine half of the inter-node CPU implementation (internode/cpu.hpp): the entry
// vote, the return of rows (flat: to their sources; V1: to this node's gateways, which
// send one partial per (token, node)) and the reductions in the protocol's order.
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/call_checks.hpp"
#include "common/numeric.hpp"
#include "internode/cpu.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/host_ops.hpp"

namespace mori::ep {

namespace hs = mori::shmem::host;

namespace {

// bf16 rows without the fp8 cast, two parts or more: CombineTokenRow's sum (the same
// fp32 additions in the same order from kSumStart, the same rounding), one pass per part
// over blocks of the row that stay in L1, compiled also for AVX-512 and AVX2 (the clone
// is picked when the library loads). About 1.3x CombineTokenRow's time at 1024 tokens x
// 2 parts x 7168 on the 2-core VM, bit for bit equal (NaN, inf, subnormals included).
__attribute__((target_clones("avx512f", "avx2", "default"))) void SumBf16Rows(
    int parts, const uint16_t* const* rows, int64_t hidden, uint16_t* out) {
  constexpr int64_t kBlock = 1024;
  float acc[kBlock];
  for (int64_t h0 = 0; h0 < hidden; h0 += kBlock) {
    const int64_t n = std::min(kBlock, hidden - h0);
    const uint16_t* r0 = rows[0] + h0;
    for (int64_t h = 0; h < n; ++h) acc[h] = kSumStart + Bf16BitsToFloat(r0[h]);
    for (int i = 1; i < parts; ++i) {
      const uint16_t* r = rows[i] + h0;
      for (int64_t h = 0; h < n; ++h) acc[h] += Bf16BitsToFloat(r[h]);
    }
    for (int64_t h = 0; h < n; ++h) out[h0 + h] = FloatToBf16Bits(acc[h]);
  }
}

// CombineTokenRow, through SumBf16Rows where it applies.
template <typename RowOf>
void ReduceRow(int parts, RowOf row_of, CombineDtype dtype, bool fp8_cast, int64_t hidden,
               float* acc, void* out) {
  constexpr int kMaxParts = 64;
  if (dtype != CombineDtype::kBFloat16 || fp8_cast || parts < 2 || parts > kMaxParts) {
    CombineTokenRow(parts, row_of, dtype, fp8_cast, hidden, acc, out);
    return;
  }
  const uint16_t* rows[kMaxParts];
  for (int i = 0; i < parts; ++i) rows[i] = reinterpret_cast<const uint16_t*>(row_of(i));
  SumBf16Rows(parts, rows, hidden, static_cast<uint16_t*>(out));
}

}  // namespace

void InterNodeCpu::Vote(uint64_t epoch, uint32_t tag, bool weights, bool rejected) {
  const int W = shape_.world_size, me = shape_.rank;
  const uint64_t mine = CombineWord(epoch, rejected ? 0 : tag, rejected, weights && !rejected);
  for (int d = 0; d < W; ++d) PutSignal(d, layout_.comb_vote + me * 8, mine, combine_bytes_);
  CombineVote vote(tag, weights);
  for (int d = 0; d < W; ++d) {
    vote.Add(d, Wait(layout_.comb_vote + d * 8, CombineFloor(epoch), d,
                     {"combine", epoch, "combine entry", kCombineEpochShift}));
  }
  if (!rejected) vote.ThrowIfFailed();
}

RoutingSnapshot InterNodeCpu::LastRouting() const {
  return RoutingSnapshot{At<int32_t>(layout_.recv_src_pos),
                         nullptr,
                         At<uint8_t>(layout_.token_ranks),
                         nullptr,
                         At<int32_t>(layout_.total_recv),
                         &epoch_,
                         epoch_,
                         num_tokens_};
}

void InterNodeCpu::RejectCombine(const std::string& reason, const RoutingSnapshot* routing) {
  const RoutingSnapshot last = LastRouting();
  if (order_.Pick(routing, last) != nullptr) {
    order_.Enter(routing != nullptr ? routing->host_epoch : epoch_);
    last_call_dispatch_ = false;
    combine_bytes_ = InterNodeBytes{};
    combine_link_ops_.clear();
    Vote(++combine_calls_, 0, false, true);
  }
  throw InvalidArgumentError(reason);
}

void InterNodeCpu::Combine(const CombineArgs& a) {
  const RoutingSnapshot last = LastRouting();
  const RoutingSnapshot* r = order_.Pick(a.routing, last);
  if (r == nullptr) order_.ThrowNotCombinable(a.routing, epoch_);
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int L = nodes_.local_size, N = nodes_.nodes(), my_node = nodes_.NodeOf(me);
  const int64_t M = shape_.max_tokens, Hc = shape_.combine_row_bytes;
  const int64_t row_bytes = shape_.hidden_dim * CombineElementBytes(a.dtype);
  if (a.fp8_block_scale_dim > 0) {
    RejectCombine(StrCat(InterNodeKindName(kind_), " combine only supports quant_type none and ",
                         "fp8_direct_cast (fp8_blockwise: IntraNode, IntraNodeLL, AsyncLL)"),
                  a.routing);
  }
  if (row_bytes > Hc) {
    RejectCombine(StrCat("combine rows of ", row_bytes, " bytes exceed the combine buffer's ", Hc,
                         " (hidden_dim * max(max_token_type_size, 2))"),
                  a.routing);
  }
  if (a.fp8_cast && a.dtype != CombineDtype::kBFloat16) {
    RejectCombine("fp8_direct_cast combines bf16 input only", a.routing);
  }
  const int64_t total_recv = *r->total_recv, num_tokens = r->num_tokens;
  if (a.input_rows < total_recv) {
    RejectCombine(
        StrCat("combine input has ", a.input_rows, " rows, fewer than total_recv ", total_recv),
        a.routing);
  }
  order_.Enter(r->host_epoch);
  last_call_dispatch_ = false;
  combine_bytes_ = InterNodeBytes{};
  combine_link_ops_.clear();
  const uint64_t moved_before = link_->moved_bytes();
  // Combine words carry the combine's own call number (every pe combines the same
  // sequence), so a routing handle's combine after later dispatches still raises them.
  const uint64_t epoch = ++combine_calls_;
  // Whether this pe combines weights is in its vote: a gateway forms partial weights
  // only for its own call's, so ranks that differ fail here, before any row moves.
  const bool with_weights = a.out_weights != nullptr;
  Vote(epoch, CombineDtypeTag(a.dtype), with_weights, false);

  const bool hier = kind_ != InterNodeKind::kFlat;
  const int32_t* src_pos = r->src_pos;
  const char* input = static_cast<const char*>(a.input);
  InterNodeBytes& bytes = combine_bytes_;
  // Return every received row: flat, to its source's slot [me][t]; V1, to the source's
  // slot when it is on this node, else to the gateway of its node on this node. My own
  // rows are not copied: the reduction reads them from the input (own_row[t]).
  std::vector<int64_t> own_row(static_cast<size_t>(M), -1);
  for (int64_t i = 0; i < total_recv; ++i) {
    const int s = static_cast<int>(src_pos[i] / M);
    const int64_t t = src_pos[i] % M;
    const char* row = input + i * a.input_row_stride;
    if (s == me) {
      own_row[t] = i;
      bytes.algo_token += hier ? 0 : row_bytes;
      continue;
    }
    if (!hier || SameNode(s)) {
      const size_t slot = static_cast<size_t>(me) * M + t;
      Put(s, layout_.comb_tokens + slot * Hc, row, row_bytes, LinkPayload::kToken, bytes);
      if (with_weights) {
        Put(s, layout_.comb_weights + slot * K * 4, a.weights + i * K, K * 4, LinkPayload::kMeta,
            bytes);
      }
      if (!SameNode(s)) {
        bytes.physical_token += row_bytes;
        ++bytes.physical_rows;
      }
      bytes.algo_token += hier ? 0 : row_bytes;
      continue;
    }
    const int g = my_node * L + nodes_.LocalOf(s);
    const size_t slot = (static_cast<size_t>(nodes_.NodeOf(s)) * L + nodes_.LocalOf(me)) * M +
                        static_cast<size_t>(t);
    hs::PutNbi(ctx_, block_ + layout_.stage_tokens + slot * Hc, row, row_bytes, g);
    if (with_weights) {
      hs::PutNbi(ctx_, block_ + layout_.stage_weights + slot * K * 4, a.weights + i * K, K * 4, g);
    }
    hs::PutNbi(ctx_, block_ + layout_.stage_mark + slot * 8, &epoch, 8, g);
  }
  if (!hier) {
    for (int s = 0; s < W; ++s) PutSignal(s, layout_.comb_done + me * 8, epoch, bytes);
  } else {
    for (int l = 0; l < L; ++l) {
      const int d = my_node * L + l;
      PutSignal(d, layout_.comb_done + me * 8, epoch, bytes);
      for (int n = 0; n < N; ++n) {
        if (n != my_node) {
          PutSignal(d, layout_.stage_done + (n * L + nodes_.LocalOf(me)) * 8, epoch, bytes);
        }
      }
    }
  }

  const int64_t hidden = shape_.hidden_dim;
  std::vector<float> acc(hidden);
  std::vector<char> partial(row_bytes);
  std::vector<float> partial_w(K);
  std::vector<int> parts(std::max(W, N));
  if (hier) {
    // As the gateway of every other node n on this node: each forwarded token's rows,
    // summed over this node's pes (ascending), sent once to its source.
    for (int n = 0; n < N; ++n) {
      if (n == my_node) continue;
      const int s = nodes_.Gateway(me, n);
      for (int l = 0; l < L; ++l) {
        Wait(layout_.stage_done + (n * L + l) * 8, epoch, my_node * L + l,
             {"combine", epoch, "rows staged at the gateway", 0});
      }
      // The tokens staged here in this call, and by which of this node's pes.
      for (int64_t t = 0; t < M; ++t) {
        uint32_t mask = 0;
        for (int l = 0; l < L; ++l) {
          const size_t slot = (static_cast<size_t>(n) * L + l) * M + static_cast<size_t>(t);
          if (*At<uint64_t>(layout_.stage_mark + slot * 8) == epoch) mask |= 1u << l;
        }
        if (mask == 0) continue;
        int np = 0;
        for (int l = 0; l < L; ++l) {
          if ((mask >> l) & 1u) parts[np++] = l;
        }
        auto row_of = [&](int i) -> const char* {
          const size_t slot = (static_cast<size_t>(n) * L + parts[i]) * M + t;
          return At<char>(layout_.stage_tokens + slot * Hc);
        };
        ReduceRow(np, row_of, a.dtype, a.fp8_cast, hidden, acc.data(), partial.data());
        const size_t dst = static_cast<size_t>(my_node) * M + t;
        Put(s, layout_.partial_tokens + dst * Hc, partial.data(), row_bytes, LinkPayload::kToken,
            bytes);
        bytes.physical_token += row_bytes;
        ++bytes.physical_rows;
        if (with_weights) {
          auto weights_of = [&](int i) -> const float* {
            const size_t slot = (static_cast<size_t>(n) * L + parts[i]) * M + t;
            return At<float>(layout_.stage_weights + slot * K * 4);
          };
          CombineTokenWeights(np, weights_of, K, partial_w.data());
          Put(s, layout_.partial_weights + dst * K * 4, partial_w.data(), K * 4, LinkPayload::kMeta,
              bytes);
        }
      }
      PutSignal(s, layout_.partial_done + my_node * 8, epoch, bytes);
    }
    for (int l = 0; l < L; ++l) {
      const int d = my_node * L + l;
      Wait(layout_.comb_done + d * 8, epoch, d, {"combine", epoch, "combine rows", 0});
    }
    for (int n = 0; n < N; ++n) {
      if (n != my_node) {
        Wait(layout_.partial_done + n * 8, epoch, nodes_.Gateway(me, n),
             {"combine", epoch, "node partials", 0});
      }
    }
  } else {
    for (int d = 0; d < W; ++d) {
      Wait(layout_.comb_done + d * 8, epoch, d, {"combine", epoch, "combine rows", 0});
    }
  }

  // Reduce my tokens.
  const uint8_t* token_ranks = r->token_ranks;
  std::vector<char> node_rows(static_cast<size_t>(N) * row_bytes);
  std::vector<float> node_w(static_cast<size_t>(N) * K);
  std::vector<int> node_of_part(N);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const uint8_t* ranks = token_ranks + t * W;
    char* out = static_cast<char*>(a.out) + t * row_bytes;
    // Pe d's row of token t (and its weights): mine from the input, the others' from
    // the slots they wrote.
    auto row_of = [&](int i) -> const char* {
      if (parts[i] == me) return input + own_row[t] * a.input_row_stride;
      return At<char>(layout_.comb_tokens + (static_cast<size_t>(parts[i]) * M + t) * Hc);
    };
    auto weights_of = [&](int i) -> const float* {
      if (parts[i] == me) return a.weights + own_row[t] * K;
      return At<float>(layout_.comb_weights + (static_cast<size_t>(parts[i]) * M + t) * K * 4);
    };
    if (!hier) {
      int np = 0;
      for (int d = 0; d < W; ++d) {
        if (ranks[d]) parts[np++] = d;
      }
      ReduceRow(np, row_of, a.dtype, a.fp8_cast, hidden, acc.data(), out);
      if (with_weights) CombineTokenWeights(np, weights_of, K, a.out_weights + t * K);
      continue;
    }
    int nn = 0;
    for (int n = 0; n < N; ++n) {
      bool any = false;
      for (int l = 0; l < L; ++l) any = any || ranks[n * L + l];
      if (!any) continue;
      bytes.algo_token += row_bytes;
      node_of_part[nn] = n;
      char* dst = node_rows.data() + static_cast<size_t>(nn) * row_bytes;
      float* dst_w = node_w.data() + static_cast<size_t>(nn) * K;
      if (n == my_node) {
        int np = 0;
        for (int l = 0; l < L; ++l) {
          if (ranks[n * L + l]) parts[np++] = n * L + l;
        }
        ReduceRow(np, row_of, a.dtype, a.fp8_cast, hidden, acc.data(), dst);
        if (with_weights) CombineTokenWeights(np, weights_of, K, dst_w);
      } else {
        const size_t slot = static_cast<size_t>(n) * M + t;
        std::memcpy(dst, At<char>(layout_.partial_tokens + slot * Hc), row_bytes);
        if (with_weights)
          std::memcpy(dst_w, At<char>(layout_.partial_weights + slot * K * 4), K * 4);
      }
      ++nn;
    }
    auto partial_of = [&](int i) -> const char* {
      return node_rows.data() + static_cast<size_t>(i) * row_bytes;
    };
    ReduceRow(nn, partial_of, a.dtype, false, hidden, acc.data(), out);
    if (with_weights) {
      auto weights_of = [&](int i) -> const float* {
        return node_w.data() + static_cast<size_t>(i) * K;
      };
      CombineTokenWeights(nn, weights_of, K, a.out_weights + t * K);
    }
  }
  link_->Quiet();
  combine_bytes_.moved = link_->moved_bytes() - moved_before;
}

}  // namespace mori::ep
