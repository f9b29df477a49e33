// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The agreement checks the host implementations make on the words of a call's
// exchange (common/signal_words.hpp): every pe reads the same words, so every pe
// finds the same disagreement and fails the same call with the same message.
// Host only (they throw).

#include <cstdint>
#include <cstring>
#include <string>

#include "common/args.hpp"
#include "common/shape.hpp"
#include "common/signal_words.hpp"
#include "mori/core/error.hpp"

namespace mori::ep {

// A dispatch's argument checks (every mode, host and CUDA): the token count within the
// op's maximum, the rows within hidden_dim * max_token_type_size. `reject(reason)`
// does not return (the mode's RejectDispatch: every pe fails the call).
template <typename Reject>
void CheckDispatchArgs(const EpShape& s, const DispatchArgs& a, Reject&& reject) {
  if (a.num_tokens < 0 || a.num_tokens > s.max_tokens) {
    reject(
        StrCat("num_tokens ", a.num_tokens, " exceeds max_num_inp_token_per_rank ", s.max_tokens));
  }
  if (a.token_row_bytes > s.hidden_bytes) {
    reject(StrCat("token rows of ", a.token_row_bytes, " bytes exceed hidden_dim * ",
                  "max_token_type_size = ", s.hidden_bytes, " bytes"));
  }
}

// A dispatch's first pass on the host, before anything moves: the argument checks,
// then every token's destination pes (a replay takes the routing handle's sets as
// given; otherwise the pes of its valid experts, each id checked), as 0/1 in
// token_ranks[t][d] ([num_tokens][W]) and per pe in counts[d] (W, zeroed by the
// caller). `reject(reason)` does not return (the mode's RejectDispatch: every pe
// fails the call).
template <typename Reject>
void RouteTokens(const EpShape& s, const DispatchArgs& a, uint8_t* token_ranks, uint64_t* counts,
                 Reject&& reject) {
  const int W = s.world_size, K = s.top_k;
  const int num_experts = s.num_experts_per_rank * W;
  CheckDispatchArgs(s, a, reject);
  std::memset(token_ranks, 0, static_cast<size_t>(a.num_tokens) * W);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    uint8_t* ranks = token_ranks + t * W;
    if (a.rank_masks != nullptr) {
      const uint32_t mask = a.rank_masks[t];
      if (W < 32 && (mask >> W)) {
        reject(StrCat("routing handle sends token ", t, " to rank mask ", mask,
                      ", beyond world_size ", W));
      }
      for (int d = 0; d < W; ++d) {
        ranks[d] = (mask >> d) & 1u;
        counts[d] += ranks[d];
      }
      continue;
    }
    for (int j = 0; j < K; ++j) {
      const int32_t e = a.indices[t * K + j];
      if (e == -1) continue;
      if (e < 0 || e >= num_experts) {
        reject(StrCat("expert id ", e, " out of range [-1, ", num_experts, ") at token ", t,
                      " slot ", j));
      }
      const int d = ExpertRank(e, s.num_experts_per_rank);
      if (!ranks[d]) {
        ranks[d] = 1;
        ++counts[d];
      }
    }
  }
}

// The dispatch's count matrix `words` ([W][W], row s = pe s's words): every pe's row
// tag (its token dtype) must be pe 0's. On a difference, `before_throw()` (the caller
// finishes its epoch), then InvalidArgumentError naming both pes' dtypes.
template <typename BeforeThrow>
void CheckRowTagsAgree(const uint64_t* words, int W, BeforeThrow&& before_throw) {
  const uint32_t first = RowTagOf(words[0]);
  for (int s = 1; s < W; ++s) {
    const uint32_t tag = RowTagOf(words[static_cast<int64_t>(s) * W]);
    if (tag != first) {
      before_throw();
      MORI_THROW(InvalidArgumentError, "dispatch token dtype differs between ranks: rank 0 ",
                 "passes ", DtypeTagName(first), " and rank ", s, " passes ", DtypeTagName(tag),
                 " (every rank must pass the same dtype); no data moved");
    }
  }
}

// The count exchange's outcome, the same on every pe: `rejected_by` (the first pe whose
// words mark a rejection, -1: none) fails the call, then the row tags must agree
// (CheckRowTagsAgree). `before_throw()` runs before either error.
template <typename BeforeThrow>
void CheckCountExchange(int rejected_by, const uint64_t* words, int W, BeforeThrow&& before_throw) {
  if (rejected_by >= 0) {
    before_throw();
    MORI_THROW(InvalidArgumentError, "dispatch rejected by rank ", rejected_by,
               " (its inputs failed validation; see its error); no data moved");
  }
  CheckRowTagsAgree(words, W, before_throw);
}

// A combine in which pe `other` combines weights and this pe not, or the reverse
// (`weights`: this pe's): a pe returns weights only when it combines them, so a pe that
// asked for them would read an earlier call's. The words of every mode (CombineVote,
// the low-latency flags; the CUDA traps print them too).
[[noreturn]] inline void ThrowCombineWeightsDiffer(int other, bool weights) {
  MORI_THROW(InvalidArgumentError, "combine weights differ between ranks: rank ", other, " passes ",
             CombineWeightsName(!weights), ", this rank passes ", CombineWeightsName(weights),
             " (every rank must pass weights, or every rank None); outputs not written");
}

// The combine words (CombineWord) a pe reads from every pe in a combine: the first
// pe that rejected its inputs, the first that passes another dtype than `tag`, the first
// whose weights bit differs from `weights`.
struct CombineVote {
  uint32_t tag;
  bool weights;
  int rejected_by = -1;
  int other = -1;
  uint32_t other_tag = 0;
  int other_weights = -1;

  CombineVote(uint32_t my_tag, bool my_weights) : tag(my_tag), weights(my_weights) {}

  void Add(int pe, uint64_t word) {
    if ((word & 1) && rejected_by < 0) rejected_by = pe;
    if (!(word & 1) && CombineTagOf(word) != tag && other < 0) {
      other = pe;
      other_tag = CombineTagOf(word);
    }
    if (!(word & 1) && CombineWeightsOf(word) != weights && other_weights < 0) {
      other_weights = pe;
    }
  }

  // InvalidArgumentError when a pe rejected, passes another dtype or differs in
  // weights. Every pe with a peer of another dtype (weights) finds one (if any two
  // differ, each pe differs from some pe), so every pe fails the call.
  void ThrowIfFailed() const {
    if (rejected_by >= 0) {
      MORI_THROW(InvalidArgumentError, "combine rejected by rank ", rejected_by,
                 " (its inputs failed validation; see its error); outputs not written");
    }
    if (other >= 0) {
      MORI_THROW(InvalidArgumentError, "combine input dtype differs between ranks: rank ", other,
                 " passes ", CombineTagName(other_tag), ", this rank ", CombineTagName(tag),
                 " (every rank must pass the same dtype); outputs not written");
    }
    if (other_weights >= 0) ThrowCombineWeightsDiffer(other_weights, weights);
  }
};

}  // namespace mori::ep
