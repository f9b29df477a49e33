// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The balanced mode on a host symmetric heap (balanced/cpu.hpp), written with the host
// counterparts of the device API (mori/shmem/host_ops.hpp).
#include "balanced/cpu.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/host_block.hpp"
#include "common/numeric.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/host_ops.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep::balanced {

namespace hs = mori::shmem::host;

namespace {

size_t Align(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

BlockLayout MakeBlockLayout(const PlanShape& s, int64_t hidden) {
  CheckPlanShape(s);
  MORI_CHECK_ARG(hidden >= 1, "H ", hidden, " must be >= 1");
  const size_t nvs = static_cast<size_t>(s.nvs()), R = s.ranks;
  BlockLayout l{};
  l.hidden = 0;
  l.weights = Align(l.hidden + nvs * hidden * 2);
  l.dup_src = Align(l.weights + nvs * 4);
  l.counts = Align(l.dup_src + nvs * 4);
  l.reasons = Align(l.counts + R * s.experts * 4);
  l.entry = Align(l.reasons + 2 * R * kReasonBytes);
  l.phase = Align(l.entry + 2 * R * 8);
  l.total_bytes = Align(l.phase + R * 8);
  return l;
}

BalancedCpu::BalancedCpu(const PlanShape& shape, int64_t hidden, int rank, void* block,
                         std::chrono::milliseconds timeout)
    : shape_(shape),
      hidden_(hidden),
      rank_(rank),
      layout_(MakeBlockLayout(shape, hidden)),
      block_(static_cast<char*>(block)),
      ctx_(shmem::GetDeviceContext()),
      timeout_(CheckedTimeout(timeout, "timeout")) {
  EpShape ep{};
  ep.world_size = shape.ranks;
  ep.rank = rank;
  CheckHostBlock(ep, ctx_, block, layout_.total_bytes, "balanced");
  std::memset(block_ + layout_.entry, 0, layout_.total_bytes - layout_.entry);
  std::fill(At<int32_t>(layout_.dup_src), At<int32_t>(layout_.dup_src) + shape.nvs(), -1);
  shmem::BarrierAll();
}

void BalancedCpu::CheckUsable(const char* op) const {
  if (broken_) {
    MORI_THROW(InvalidStateError, "balanced ", op, " refused: an earlier call failed (",
               broken_reason_, "); create a new Buffer");
  }
}

void BalancedCpu::Enter(const char* op, uint32_t kind, const std::string& reason) {
  CheckUsable(op);
  const int R = shape_.ranks;
  const uint64_t call = ++calls_;
  const size_t parity = call & 1;
  const bool refused = !reason.empty();
  if (refused) {
    char text[kReasonBytes] = {};
    std::snprintf(text, sizeof(text), "%s", reason.c_str());
    char* slot = At<char>(layout_.reasons) + (parity * R + rank_) * kReasonBytes;
    for (int pe = 0; pe < R; ++pe) hs::Put(ctx_, slot, text, kReasonBytes, pe);
  }
  uint64_t* words = At<uint64_t>(layout_.entry) + parity * R;
  const uint32_t mine = refused ? kAny : kind;
  for (int pe = 0; pe < R; ++pe) {
    hs::SignalSet(ctx_, &words[rank_], VerdictWord(call, mine, refused), pe);
  }
  int first = -1, other = -1;
  uint32_t other_kind = 0;
  for (int s = 0; s < R; ++s) {
    uint64_t w;
    try {
      w = WaitPeerWord(&words[s], VerdictWord(call, 0, false), timeout_, rank_, s,
                       {op, call, "entry", 4});
    } catch (const TimeoutError& e) {
      broken_ = true;
      broken_reason_ = e.what();
      throw;
    }
    if ((w & 1) && first < 0) first = s;
    const uint32_t k = static_cast<uint32_t>((w >> 1) & 7);
    if (!(w & 1) && k != mine && other < 0) {
      other = s;
      other_kind = k;
    }
  }
  if (first < 0 && other >= 0 && !refused) {
    MORI_THROW(InvalidArgumentError, "balanced call ", call, " refused on every rank: rank ", rank_,
               " called ", CallKindName(mine), " but rank ", other, " called ",
               CallKindName(other_kind));
  }
  if (first < 0) return;
  if (first == rank_) throw InvalidArgumentError(reason);
  const char* text = At<char>(layout_.reasons) + (parity * R + first) * kReasonBytes;
  MORI_THROW(InvalidArgumentError, "balanced ", op, " refused on every rank: rank ", first,
             " refused its inputs: ", std::string(text, strnlen(text, kReasonBytes)));
}

void BalancedCpu::Barrier(const char* op, const char* stage) {
  const int R = shape_.ranks;
  const uint64_t n = ++phases_;
  uint64_t* words = At<uint64_t>(layout_.phase);
  for (int pe = 0; pe < R; ++pe) hs::SignalSet(ctx_, &words[rank_], n, pe);
  for (int s = 0; s < R; ++s) {
    try {
      WaitPeerWord(&words[s], n, timeout_, rank_, s, {op, calls_, stage, 0});
    } catch (const TimeoutError& e) {
      broken_ = true;
      broken_reason_ = e.what();
      throw;
    }
  }
}

void BalancedCpu::Refuse(const char* op, const std::string& reason) {
  MORI_CHECK(!reason.empty(), "Refuse needs a reason");
  Enter(op, kAny, reason);
  throw InternalError("unreachable: a refused call returned");
}

void BalancedCpu::Plan(const int32_t* tpe, const int32_t* topk, std::string reason,
                       const PlanTables& tables, int32_t* dst) {
  CheckUsable("dispatch");
  const int R = shape_.ranks, E = shape_.experts;
  const int64_t pairs = shape_.capacity();
  if (reason.empty()) {
    // This rank's inputs alone: ids in range, counts equal to tpe, tpe summing to S*K.
    std::vector<int64_t> seen(E, 0);
    for (int64_t i = 0; i < pairs && reason.empty(); ++i) {
      if (topk[i] < 0 || topk[i] >= E) {
        reason = StrCat("expert id ", topk[i], " out of range [0, ", E, ") at token ",
                        i / shape_.top_k, ", k ", i % shape_.top_k, " on rank ", rank_);
      } else {
        ++seen[topk[i]];
      }
    }
    for (int e = 0; e < E && reason.empty(); ++e) {
      if (seen[e] != tpe[e]) {
        reason = StrCat("tokens_per_expert[", e, "] is ", tpe[e], " but topk_experts_sk routes ",
                        seen[e], " tokens to expert ", e, " on rank ", rank_);
      }
    }
  }
  // Senders write dup_src only after the entry exchange: clear it now.
  std::fill(At<int32_t>(layout_.dup_src), At<int32_t>(layout_.dup_src) + shape_.nvs(), -1);
  int32_t* counts = At<int32_t>(layout_.counts);
  if (reason.empty()) {
    for (int pe = 0; pe < R; ++pe)
      hs::Put(ctx_, counts + static_cast<int64_t>(rank_) * E, tpe, sizeof(int32_t) * E, pe);
  }
  Enter("dispatch", kPlanned, reason);
  PlanTablesCpu(shape_, counts, tables);
  PlanDestinationsCpu(shape_, counts, tables, rank_, topk, dst);
}

void BalancedCpu::Dispatch(const RankPlan& plan, const uint16_t* hidden, int64_t row_stride,
                           const float* weights, bool fresh, const std::string& reason) {
  if (!fresh) Enter("dispatch", kReplayed, reason);
  const int K = shape_.top_k;
  const int64_t S = shape_.tokens, nvs = shape_.nvs(), H = hidden_;
  char* shard = At<char>(layout_.hidden);
  float* wslots = At<float>(layout_.weights);
  int32_t* dup_src = At<int32_t>(layout_.dup_src);
  for (int64_t t = 0; t < S; ++t) {
    const int32_t* row = plan.dst + t * K;
    for (int k = 0; k < K; ++k) {
      const bool duplicate = row[k] < 0;
      const int64_t raw = duplicate ? -static_cast<int64_t>(row[k]) - 1 : row[k];
      const int d = static_cast<int>(raw / nvs);
      const int64_t slot = raw % nvs;
      if (!duplicate) {
        hs::Put(ctx_, shard + slot * H * 2, hidden + t * row_stride, H * 2, d);
      } else if (fresh) {
        // The token's first k to d holds the row this duplicate copies.
        int64_t primary = -1;
        for (int j = 0; j < k && primary < 0; ++j) {
          if (row[j] >= 0 && row[j] / nvs == d) primary = row[j] % nvs;
        }
        const int32_t p = static_cast<int32_t>(primary);
        hs::Put(ctx_, dup_src + slot, &p, sizeof(p), d);
      }
      if (weights != nullptr) hs::Put(ctx_, wslots + slot, weights + t * K + k, sizeof(float), d);
    }
  }
  Barrier("dispatch", "rows written");
  if (fresh) {
    DuplicateGroupsCpu(nvs, dup_src, plan.dup_groups, plan.dup_loffs, plan.dup_counts);
  }
  ExpandAndZero(plan);
}

void BalancedCpu::ExpandAndZero(const RankPlan& plan) {
  const int64_t H = hidden_, epn = shape_.epn();
  char* shard = At<char>(layout_.hidden);
  for (int32_t g = 0; g < plan.dup_counts[0]; ++g) {
    const int32_t* grp = plan.dup_groups + 3 * g;
    for (int32_t j = 0; j < grp[2]; ++j) {
      std::memcpy(shard + plan.dup_loffs[grp[1] + j] * H * 2, shard + grp[0] * H * 2, H * 2);
    }
  }
  for (int64_t g = 0; g < 2 * epn; ++g) {
    const int64_t first = plan.zero_fill[2 * g], rows = plan.zero_fill[2 * g + 1];
    if (rows > 0) std::memset(shard + first * H * 2, 0, rows * H * 2);
  }
}

void BalancedCpu::Combine(const RankPlan& plan, const uint16_t* hidden_nvsh,
                          const float* weights_nvs, uint16_t* out, float* out_weights,
                          const std::string& reason) {
  Enter("combine", kCombineCall, reason);
  const int K = shape_.top_k;
  const int64_t S = shape_.tokens, nvs = shape_.nvs(), H = hidden_;
  uint16_t* shard = At<uint16_t>(layout_.hidden);
  float* wslots = At<float>(layout_.weights);
  if (hidden_nvsh != shard) std::memcpy(shard, hidden_nvsh, nvs * H * 2);
  if (weights_nvs != nullptr && weights_nvs != wslots) std::memcpy(wslots, weights_nvs, nvs * 4);
  // Duplicate groups: primary row plus its duplicates in ascending slot, fp32 from
  // kSumStart, rounded once into the primary.
  std::vector<float> acc(H);
  for (int32_t g = 0; g < plan.dup_counts[0]; ++g) {
    const int32_t* grp = plan.dup_groups + 3 * g;
    uint16_t* primary = shard + static_cast<int64_t>(grp[0]) * H;
    for (int64_t h = 0; h < H; ++h) acc[h] = kSumStart + Bf16BitsToFloat(primary[h]);
    for (int32_t j = 0; j < grp[2]; ++j) {
      const uint16_t* dup = shard + static_cast<int64_t>(plan.dup_loffs[grp[1] + j]) * H;
      for (int64_t h = 0; h < H; ++h) acc[h] += Bf16BitsToFloat(dup[h]);
    }
    for (int64_t h = 0; h < H; ++h) primary[h] = FloatToBf16Bits(acc[h]);
  }
  Barrier("combine", "duplicates summed");
  std::vector<const char*> parts(K);
  for (int64_t t = 0; t < S; ++t) {
    const int32_t* row = plan.dst + t * K;
    int n = 0;
    for (int k = 0; k < K; ++k) {
      const bool duplicate = row[k] < 0;
      const int64_t raw = duplicate ? -static_cast<int64_t>(row[k]) - 1 : row[k];
      const int d = static_cast<int>(raw / nvs);
      const int64_t slot = raw % nvs;
      if (!duplicate) {
        parts[n++] = reinterpret_cast<const char*>(hs::Ptr(ctx_, shard + slot * H, d));
      }
      if (out_weights != nullptr) out_weights[t * K + k] = *hs::Ptr(ctx_, wslots + slot, d);
    }
    CombineTokenRow(
        n, [&](int i) { return parts[i]; }, CombineDtype::kBFloat16, false, H, acc.data(),
        out + t * H);
  }
}

void BalancedCpu::Prefetch(const int32_t* experts_to_copy, const std::vector<const char*>& locals,
                           const std::vector<char*>& pools, const std::vector<int64_t>& bytes,
                           const std::string& reason) {
  std::string why = reason;
  const int R = shape_.ranks, epn = shape_.epn();
  for (size_t i = 0; i < pools.size() && why.empty(); ++i) {
    const size_t pool_bytes = static_cast<size_t>(R) * epn * bytes[i];
    if (!shmem::IsSymmetric(pools[i], pool_bytes)) {
      why = StrCat("prefetch buffer ", i, " is not a symmetric tensor of ", pool_bytes,
                   " bytes (allocate it with mori.core.shmem.empty)");
    }
  }
  Enter("prefetch_weight", kPrefetchCall, why);
  for (int d = 0; d < R; ++d) {
    for (int b = 0; b < epn; ++b) {
      const int32_t e = experts_to_copy[d * epn + b];
      if (e < 0 || e / epn != rank_) continue;
      for (size_t i = 0; i < pools.size(); ++i) {
        char* slot = pools[i] + (static_cast<int64_t>(d) * epn + b) * bytes[i];
        hs::Put(ctx_, slot, locals[i] + static_cast<int64_t>(e % epn) * bytes[i], bytes[i], d);
      }
    }
  }
  Barrier("prefetch_weight", "weights written");
}

void BalancedCpu::ReduceGrad(const int32_t* experts_to_copy, const std::vector<float*>& locals,
                             const std::vector<float*>& pools, const std::vector<int64_t>& elems,
                             const std::string& reason) {
  std::string why = reason;
  const int R = shape_.ranks, epn = shape_.epn();
  for (size_t i = 0; i < pools.size() && why.empty(); ++i) {
    const size_t pool_bytes = static_cast<size_t>(R) * epn * elems[i] * 4;
    if (!shmem::IsSymmetric(pools[i], pool_bytes)) {
      why = StrCat("reduce buffer ", i, " is not a symmetric tensor of ", pool_bytes,
                   " bytes (allocate it with mori.core.shmem.empty)");
    }
  }
  Enter("reduce_grad", kReduceGradCall, why);
  for (int le = 0; le < epn; ++le) {
    const int32_t e = rank_ * epn + le;
    for (int d = 0; d < R; ++d) {
      for (int b = 0; b < epn; ++b) {
        if (experts_to_copy[d * epn + b] != e) continue;
        for (size_t i = 0; i < pools.size(); ++i) {
          const float* slot =
              hs::Ptr(ctx_, pools[i] + (static_cast<int64_t>(d) * epn + b) * elems[i], d);
          float* grad = locals[i] + static_cast<int64_t>(le) * elems[i];
          for (int64_t x = 0; x < elems[i]; ++x) grad[x] += slot[x];
        }
      }
    }
  }
  Barrier("reduce_grad", "slots read");
  for (int b = 0; b < epn; ++b) {
    if (experts_to_copy[rank_ * epn + b] < 0) continue;
    for (size_t i = 0; i < pools.size(); ++i) {
      std::memset(pools[i] + (static_cast<int64_t>(rank_) * epn + b) * elems[i], 0, elems[i] * 4);
    }
  }
}

}  // namespace mori::ep::balanced
