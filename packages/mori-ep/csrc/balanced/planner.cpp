// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The planner on the host (balanced/planner.hpp states the algorithm). Counts are
// summed in int64 so that no intermediate wraps whatever the inputs; the checks on
// the inputs make every table value fit int32.
#include "balanced/planner.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "mori/core/error.hpp"

namespace mori::ep::balanced {

namespace {

// First index of the largest (argmax) or smallest (argmin) of v[0, n).
int64_t ArgMax(const int64_t* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

int64_t ArgMin(const int64_t* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] < v[best]) best = i;
  return best;
}

int64_t PaddedRows(int64_t rows, int padding) {
  return rows == 0 ? 0 : (rows + padding - 1) / padding * padding;
}

}  // namespace

void CheckPlanShape(const PlanShape& s) {
  MORI_CHECK_ARG(s.ranks >= 1, "num_ep_ranks ", s.ranks, " must be >= 1");
  MORI_CHECK_ARG(s.experts >= s.ranks && s.experts % s.ranks == 0, "E ", s.experts,
                 " must be a positive multiple of num_ep_ranks ", s.ranks);
  MORI_CHECK_ARG(s.tokens >= 1, "S ", s.tokens, " must be >= 1");
  MORI_CHECK_ARG(s.top_k >= 1, "K ", s.top_k, " must be >= 1");
  MORI_CHECK_ARG(s.token_padding >= 1, "token_padding ", s.token_padding, " must be >= 1");
  MORI_CHECK_ARG(s.tokens <= (int64_t{1} << 31) / s.top_k, "S*K = ", s.tokens, "*", s.top_k,
                 " exceeds 2^31");
  const int64_t nvs = s.nvs();
  MORI_CHECK_ARG(nvs * s.ranks < (int64_t{1} << 31), "num_ep_ranks * NvS = ", s.ranks, " * ", nvs,
                 " does not fit int32 dst (S ", s.tokens, ", K ", s.top_k, ", token_padding ",
                 s.token_padding, ")");
}

void PlanTablesCpu(const PlanShape& s, const int32_t* tpe, const PlanTables& out) {
  CheckPlanShape(s);
  const int R = s.ranks, E = s.experts, epn = s.epn();
  const int64_t cap = s.capacity(), nvs = s.nvs();
  std::vector<int64_t> count(E, 0);
  for (int r = 0; r < R; ++r) {
    int64_t row = 0;
    for (int e = 0; e < E; ++e) {
      const int32_t c = tpe[static_cast<int64_t>(r) * E + e];
      MORI_CHECK_ARG(c >= 0, "tokens_per_expert of rank ", r, " is ", c, " for expert ", e,
                     " (negative)");
      count[e] += c;
      row += c;
    }
    MORI_CHECK_ARG(row == cap, "tokens_per_expert of rank ", r, " sums to ", row,
                   ", expected S*K = ", cap);
  }

  // Step 1: receivers and their quotas z[h][u].
  std::vector<int64_t> balance(R, 0), z(static_cast<size_t>(R) * R, 0);
  for (int h = 0; h < R; ++h) {
    for (int i = 0; i < epn; ++i) balance[h] += count[h * epn + i];
    balance[h] -= cap;
  }
  for (;;) {
    const int64_t h = ArgMax(balance.data(), R), u = ArgMin(balance.data(), R);
    if (balance[h] <= 0) break;
    const int64_t move = -balance[u];
    z[h * R + u] = move;
    balance[h] -= move;
    balance[u] = 0;
  }

  // Step 2: alloc[d][e], starting with every token at its home.
  int32_t* alloc = out.alloc;
  std::memset(alloc, 0, sizeof(int32_t) * R * E);
  for (int e = 0; e < E; ++e) alloc[static_cast<int64_t>(e / epn) * E + e] = count[e];
  std::vector<int64_t> remaining(epn), quota(R);
  for (int h = 0; h < R; ++h) {
    std::copy(count.begin() + h * epn, count.begin() + (h + 1) * epn, remaining.begin());
    std::copy(z.begin() + h * R, z.begin() + (h + 1) * R, quota.begin());
    for (;;) {
      const int64_t d = ArgMax(quota.data(), R);
      if (quota[d] <= 0) break;
      const int64_t i = ArgMax(remaining.data(), epn), e = h * epn + i;
      const int64_t take = std::min(remaining[i], quota[d]);
      MORI_CHECK(take > 0, "home group ", h, " has no tokens left for a quota of ", quota[d]);
      alloc[d * E + e] += take;
      alloc[static_cast<int64_t>(h) * E + e] -= take;
      remaining[i] -= take;
      quota[d] -= take;
    }
  }

  // Step 3: per destination rank, its prefetch slots and its slot layout.
  std::memset(out.remote_stats, 0, sizeof(int32_t) * R * 2);
  for (int d = 0; d < R; ++d) {
    int32_t* copy = out.experts_to_copy + static_cast<int64_t>(d) * epn;
    std::fill(copy, copy + epn, -1);
    int held = 0;
    for (int e = 0; e < E; ++e) {
      if (e / epn == d || alloc[static_cast<int64_t>(d) * E + e] == 0) continue;
      MORI_CHECK(held < epn, "rank ", d, " holds more than epn ", epn, " remote experts");
      copy[held++] = e;
      out.remote_stats[(e / epn) * 2 + 1] += 1;
    }
    out.remote_stats[d * 2] = held;
    int32_t* offs = out.expert_offsets + static_cast<int64_t>(d) * E;
    std::fill(offs, offs + E, 0);
    int32_t* cu = out.cu_seqlens + static_cast<int64_t>(d) * 2 * epn;
    int32_t* fill = out.zero_fill + static_cast<int64_t>(d) * 4 * epn;
    int64_t start = 0;
    for (int g = 0; g < 2 * epn; ++g) {
      const int e = g < epn ? d * epn + g : copy[g - epn];
      const int64_t rows = e < 0 ? 0 : alloc[static_cast<int64_t>(d) * E + e];
      const int64_t padded = PaddedRows(rows, s.token_padding);
      fill[2 * g] = 0;
      fill[2 * g + 1] = 0;
      if (rows > 0) {
        offs[e] = static_cast<int32_t>(start);
        if (padded > rows) {
          fill[2 * g] = static_cast<int32_t>(start + rows);
          fill[2 * g + 1] = static_cast<int32_t>(padded - rows);
        }
      }
      start += padded;
      cu[g] = static_cast<int32_t>(start);
    }
    MORI_CHECK(start <= nvs, "rank ", d, " needs ", start, " slots, more than NvS ", nvs);
  }
}

void PlanDestinationsCpu(const PlanShape& s, const int32_t* tpe, const PlanTables& t, int rank,
                         const int32_t* topk, int32_t* dst) {
  const int R = s.ranks, E = s.experts, K = s.top_k;
  const int64_t S = s.tokens, nvs = s.nvs();
  MORI_CHECK_ARG(rank >= 0 && rank < R, "rank ", rank, " out of range [0, ", R, ")");
  // The expert ids first, and their counts against tpe[rank]: nothing is written to
  // dst before the whole input is known good.
  std::vector<int64_t> seen(E, 0);
  for (int64_t i = 0; i < S * K; ++i) {
    const int32_t e = topk[i];
    MORI_CHECK_ARG(e >= 0 && e < E, "expert id ", e, " out of range [0, ", E, ") at token ", i / K,
                   ", k ", i % K);
    ++seen[e];
  }
  for (int e = 0; e < E; ++e) {
    const int32_t told = tpe[static_cast<int64_t>(rank) * E + e];
    MORI_CHECK_ARG(seen[e] == told, "tokens_per_expert[", e, "] is ", told, " but topk_experts ",
                   "routes ", seen[e], " tokens to expert ", e, " on rank ", rank);
  }
  // next[e]: expert e's global index of this rank's next pair.
  std::vector<int64_t> next(E, 0);
  for (int r = 0; r < rank; ++r)
    for (int e = 0; e < E; ++e) next[e] += tpe[static_cast<int64_t>(r) * E + e];
  std::vector<int> dest_of(K);
  for (int64_t tok = 0; tok < S; ++tok) {
    for (int k = 0; k < K; ++k) {
      const int64_t i = tok * K + k;
      const int e = topk[i];
      int64_t g = next[e]++;
      int d = 0;
      for (; d < R; ++d) {
        const int64_t here = t.alloc[static_cast<int64_t>(d) * E + e];
        if (g < here) break;
        g -= here;
      }
      MORI_CHECK(d < R, "expert ", e, " has no destination for its pair ", next[e] - 1);
      dest_of[k] = d;
      const int64_t raw = d * nvs + t.expert_offsets[static_cast<int64_t>(d) * E + e] + g;
      bool duplicate = false;
      for (int j = 0; j < k && !duplicate; ++j) duplicate = dest_of[j] == d;
      dst[i] = static_cast<int32_t>(duplicate ? -raw - 1 : raw);
    }
  }
}

void DuplicateSourcesCpu(const PlanShape& s, const int32_t* dst_all, int dest, int32_t* dup_src) {
  const int R = s.ranks, K = s.top_k;
  const int64_t S = s.tokens, nvs = s.nvs();
  std::fill(dup_src, dup_src + nvs, -1);
  for (int r = 0; r < R; ++r) {
    for (int64_t tok = 0; tok < S; ++tok) {
      const int32_t* row = dst_all + (static_cast<int64_t>(r) * S + tok) * K;
      int64_t primary = -1;
      for (int k = 0; k < K; ++k) {
        const int64_t v = row[k] >= 0 ? row[k] : -static_cast<int64_t>(row[k]) - 1;
        if (v / nvs != dest) continue;
        if (primary < 0) {
          primary = v % nvs;
        } else {
          dup_src[v % nvs] = static_cast<int32_t>(primary);
        }
      }
    }
  }
}

void DuplicateGroupsCpu(int64_t nvs, const int32_t* dup_src, int32_t* groups, int32_t* loffs,
                        int32_t* counts) {
  std::vector<int32_t> per_primary(nvs, 0), first(nvs, 0);
  int64_t dups = 0;
  for (int64_t slot = 0; slot < nvs; ++slot) {
    if (dup_src[slot] >= 0) {
      ++per_primary[dup_src[slot]];
      ++dups;
    }
  }
  int32_t n_groups = 0, start = 0;
  for (int64_t p = 0; p < nvs; ++p) {
    if (per_primary[p] == 0) continue;
    groups[3 * n_groups] = static_cast<int32_t>(p);
    groups[3 * n_groups + 1] = start;
    groups[3 * n_groups + 2] = per_primary[p];
    first[p] = start;
    start += per_primary[p];
    ++n_groups;
  }
  for (int64_t slot = 0; slot < nvs; ++slot) {
    if (dup_src[slot] >= 0) loffs[first[dup_src[slot]]++] = static_cast<int32_t>(slot);
  }
  counts[0] = n_groups;
  counts[1] = static_cast<int32_t>(dups);
}

}  // namespace mori::ep::balanced
