// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CPU implementation of the inter-node protocols (internode/protocol.hpp), on a host
// heap: pes of this node are written through the heap (shmem host ops), pes of other
// nodes through the op's CrossNodeLink. Construction, the shared helpers and dispatch
// here; combine in cpu_combine.cpp.
#include "internode/cpu.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/call_checks.hpp"
#include "common/host_block.hpp"
#include "common/numeric.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/host_ops.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

namespace hs = mori::shmem::host;
using mori::shmem::Cmp;

void HeapCopyLink::Write(int pe, size_t offset, const void* src, size_t bytes) {
  hs::PutNbi(ctx_, block_ + offset, src, bytes, pe);
  moved_ += bytes;
}

void HeapCopyLink::Signal(int pe, size_t offset, uint64_t value) {
  hs::SignalSet(ctx_, reinterpret_cast<uint64_t*>(block_ + offset), value, pe);
}

InterNodeCpu::InterNodeCpu(const EpShape& shape, void* block, std::chrono::milliseconds timeout,
                           InterNodeKind kind, int local_size, bool use_proxy)
    : shape_(shape),
      nodes_{shape.world_size, local_size},
      kind_(kind),
      block_(static_cast<char*>(block)),
      ctx_(shmem::GetDeviceContext()),
      timeout_(CheckedTimeout(timeout, "timeout")) {
  const int W = shape.world_size;
  MORI_CHECK_ARG(local_size >= 1 && local_size <= 32 && W % local_size == 0, "pes per node ",
                 local_size, " must divide world_size ", W, " and be in [1, 32]");
  layout_ = MakeInterNodeLayout(shape, nodes_, kind);
  MORI_CHECK_ARG(ctx_.n_pes == W, "world_size ", W, " differs from the heap's n_pes ", ctx_.n_pes);
  MORI_CHECK_ARG(ctx_.my_pe == shape.rank, "rank ", shape.rank, " differs from the heap's my_pe ",
                 ctx_.my_pe);
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the op's buffer is not a symmetric block of ", layout_.total_bytes, " bytes");
  if (kind == InterNodeKind::kHierLL) {
    MORI_CHECK_ARG(RecvCapacity(shape) % W == 0, "receive capacity ", RecvCapacity(shape),
                   " is not a multiple of world_size ", W);
  }
  // This node's pes must be load/store reachable: the intra-node leg is the heap. Every
  // pe decides alike (the heap's local groups are symmetric), so all raise or none.
  const int node = nodes_.NodeOf(shape.rank);
  for (int pe = node * local_size; pe < (node + 1) * local_size; ++pe) {
    if (hs::Ptr(ctx_, block_, pe) == nullptr) {
      MORI_THROW(NotSupportedError, InterNodeKindName(kind), ": pe ", pe, " is on node ", node,
                 " (gpu_per_node ", local_size, ") but not load/store reachable from pe ",
                 shape.rank, " (the heap's local group is smaller: lower gpu_per_node)");
    }
  }
  if (!use_proxy) {
    for (int pe = 0; pe < W; ++pe) {
      if (hs::Ptr(ctx_, block_, pe) == nullptr) {
        MORI_THROW(NotSupportedError, InterNodeKindName(kind), ": pe ", pe,
                   " is on another host (not load/store reachable from pe ", shape.rank,
                   "): the heap-copy link needs every pe mapped; use the proxy");
      }
    }
  }
  std::memset(block_, 0, InterNodeSignalBytes(layout_));
  if (use_proxy) {
    auto link =
        std::make_unique<ProxyLink>(block_, layout_.send_ring, layout_.send_ring_bytes, timeout_);
    proxy_link_ = link.get();
    link_ = std::move(link);
  } else {
    link_ = std::make_unique<HeapCopyLink>(ctx_, block_);
  }
  shmem::BarrierAll();
}

void InterNodeCpu::Put(int pe, size_t offset, const void* src, size_t bytes, LinkPayload what,
                       InterNodeBytes& count) {
  if (bytes == 0) return;
  if (SameNode(pe)) {
    hs::PutNbi(ctx_, block_ + offset, src, bytes, pe);
    return;
  }
  link_->Write(pe, offset, src, bytes);
  (&count == &combine_bytes_ ? combine_link_ops_ : dispatch_link_ops_)
      .push_back(LinkOp{pe, offset, bytes, 0});
  (what == LinkPayload::kToken ? count.link.token : count.link.meta) += bytes;
  ++count.link.writes;
}

void InterNodeCpu::PutSignal(int pe, size_t offset, uint64_t value, InterNodeBytes& count) {
  if (SameNode(pe)) {
    hs::SignalSet(ctx_, reinterpret_cast<uint64_t*>(block_ + offset), value, pe);
    return;
  }
  link_->Signal(pe, offset, value);
  (&count == &combine_bytes_ ? combine_link_ops_ : dispatch_link_ops_)
      .push_back(LinkOp{pe, offset, 0, value});
  count.link.signal += 8;
  ++count.link.signals;
}

uint64_t InterNodeCpu::Wait(size_t offset, uint64_t floor, int peer, const PeerStage& at) const {
  const uint64_t* word = At<uint64_t>(offset);
  try {
    if (proxy_link_ == nullptr) return hs::WaitUntil(word, Cmp::kGe, floor, timeout_);
    // With the proxy, a lost peer also fails the proxy (naming it, its node and the
    // stage of the transport): checked between slices of the wait.
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      const auto left = deadline - std::chrono::steady_clock::now();
      const auto slice = std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(50));
      try {
        return hs::WaitUntil(word, Cmp::kGe, floor, std::max<std::chrono::nanoseconds>(slice, {}));
      } catch (const TimeoutError&) {
        if (std::chrono::steady_clock::now() >= deadline) throw;
      }
      try {
        proxy_link_->CheckHealth();
      } catch (const Error& e) {
        // The proxy names the lost pe and its node; say which wait of which call saw it.
        ThrowError(e.code(),
                   StrCat(InterNodeKindName(kind_), " ", at.op, " (call ", at.call, ") on rank ",
                          shape_.rank, " (node ", nodes_.NodeOf(shape_.rank),
                          "), waiting for rank ", peer, " (node ", nodes_.NodeOf(peer), ") (",
                          at.stage, "): the inter-node link failed: ", e.what()));
      }
    }
  } catch (const TimeoutError&) {
    const uint64_t last = __atomic_load_n(word, __ATOMIC_ACQUIRE) >> at.call_shift;
    char text[512];
    std::snprintf(text, sizeof(text),
                  "%s %s (call %llu) on rank %d (node %d): rank %d (node %d) did not arrive (%s) "
                  "within %llu ms (its last signal is from call %llu)",
                  InterNodeKindName(kind_), at.op, static_cast<unsigned long long>(at.call),
                  shape_.rank, nodes_.NodeOf(shape_.rank), peer, nodes_.NodeOf(peer), at.stage,
                  static_cast<unsigned long long>(timeout_.count()),
                  static_cast<unsigned long long>(last));
    throw TimeoutError(std::string(text));
  }
}

// ---------------------------------------------------------------------- dispatch

void InterNodeCpu::PostCounts(uint64_t epoch, const std::vector<uint64_t>& counts, uint32_t tag) {
  const int W = shape_.world_size, me = shape_.rank;
  std::vector<uint64_t> row(W);
  for (int d = 0; d < W; ++d) row[d] = CountWord(epoch, counts[d], tag);
  const size_t at = layout_.count_words + static_cast<size_t>(me) * W * 8;
  for (int pe = 0; pe < W; ++pe) {
    // One release per word on this node; over the link one write and one signal
    // (the last word), which lands after the write.
    if (SameNode(pe)) {
      for (int d = 0; d < W; ++d) PutSignal(pe, at + d * 8, row[d], dispatch_bytes_);
    } else {
      Put(pe, at, row.data(), (W - 1) * 8, LinkPayload::kMeta, dispatch_bytes_);
      PutSignal(pe, at + (W - 1) * 8, row[W - 1], dispatch_bytes_);
    }
  }
}

int InterNodeCpu::WaitCounts(uint64_t epoch) {
  const int W = shape_.world_size;
  int rejected_by = -1;
  for (int s = 0; s < W; ++s) {
    // The last word of a row is its signal; the others landed before it.
    const size_t row = layout_.count_words + static_cast<size_t>(s) * W * 8;
    Wait(row + (W - 1) * 8, EpochFloor(epoch), s, {"dispatch", epoch, "count words", kCountBits});
    const uint64_t* words = At<uint64_t>(row);
    for (int d = 0; d < W; ++d) {
      const uint64_t w = __atomic_load_n(&words[d], __ATOMIC_ACQUIRE);
      MORI_CHECK(EpochOf(w) == (epoch & kEpochMask), "count word from pe ", s, " has epoch ",
                 EpochOf(w), ", expected ", epoch);
      if (CountOf(w) == kRejectedCount && rejected_by < 0) rejected_by = s;
    }
  }
  return rejected_by;
}

void InterNodeCpu::FinishDispatchEpoch(uint64_t epoch) {
  const int W = shape_.world_size, me = shape_.rank;
  const size_t mine = layout_.dispatch_done + me * 8;
  for (int d = 0; d < W; ++d) PutSignal(d, mine, epoch, dispatch_bytes_);
  for (int s = 0; s < W; ++s) {
    Wait(layout_.dispatch_done + s * 8, epoch, s, {"dispatch", epoch, "rows written", 0});
  }
}

void InterNodeCpu::RejectDispatch(const std::string& reason) {
  if (kind_ == InterNodeKind::kHierLL && last_call_dispatch_) FinishDispatchEpoch(epoch_);
  const uint64_t epoch = ++epoch_;
  order_.Dispatched(false);
  last_call_dispatch_ = true;
  dispatch_bytes_ = InterNodeBytes{};
  dispatch_link_ops_.clear();
  std::vector<uint64_t> counts(shape_.world_size, kRejectedCount);
  if (kind_ == InterNodeKind::kHierLL) {
    DispatchLowLatency(epoch, DispatchArgs{}, counts, true);
  } else {
    PostCounts(epoch, counts, 0);
    WaitCounts(epoch);
    FinishDispatchEpoch(epoch);
  }
  throw InvalidArgumentError(reason);
}

void InterNodeCpu::SendRows(uint64_t epoch, const DispatchArgs& a,
                            const std::vector<int64_t>& base_of_me) {
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int L = nodes_.local_size, N = nodes_.nodes(), my_node = nodes_.NodeOf(me);
  const int64_t M = shape_.max_tokens, H = shape_.hidden_bytes, Sb = shape_.scale_bytes;
  const int64_t P = RecvCapacity(shape_) / W;
  const bool hier = kind_ != InterNodeKind::kFlat, ll = kind_ == InterNodeKind::kHierLL;
  const uint8_t* token_ranks = At<uint8_t>(layout_.token_ranks);
  const char* tokens = static_cast<const char*>(a.tokens);
  const char* scales = static_cast<const char*>(a.scales);
  InterNodeBytes& bytes = dispatch_bytes_;
  // One row's fields to `pe` at row `r` of the regions starting at `tokens_at`...
  struct Regions {
    size_t tokens, weights, scales, indices, src_pos;
  };
  const Regions recv{layout_.recv_tokens, layout_.recv_weights, layout_.recv_scales,
                     layout_.recv_indices, layout_.recv_src_pos};
  const Regions slots{layout_.ll_tokens, layout_.ll_weights, layout_.ll_scales, layout_.ll_indices,
                      layout_.ll_src_pos};
  const Regions fwd{layout_.fwd_tokens, layout_.fwd_weights, layout_.fwd_scales,
                    layout_.fwd_indices, layout_.fwd_src_pos};
  auto put_row = [&](int pe, const Regions& at, int64_t r, int64_t t, int32_t pos) {
    Put(pe, at.tokens + r * H, tokens + t * a.token_row_bytes, a.token_row_bytes,
        LinkPayload::kToken, bytes);
    Put(pe, at.weights + r * K * 4, a.weights + t * K, K * 4, LinkPayload::kMeta, bytes);
    if (Sb > 0) Put(pe, at.scales + r * Sb, scales + t * Sb, Sb, LinkPayload::kMeta, bytes);
    Put(pe, at.indices + r * K * 4, a.indices + t * K, K * 4, LinkPayload::kMeta, bytes);
    Put(pe, at.src_pos + r * 4, &pos, 4, LinkPayload::kMeta, bytes);
  };
  std::vector<int64_t> next(W, 0);    // my rows so far to each pe
  std::vector<int64_t> staged(N, 0);  // rows staged at each node's gateway
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const uint8_t* ranks = token_ranks + t * W;
    for (int n = 0; n < N; ++n) {
      uint32_t mask = 0;
      for (int l = 0; l < L; ++l) mask |= static_cast<uint32_t>(ranks[n * L + l]) << l;
      if (mask == 0) continue;
      if (hier) bytes.algo_token += a.token_row_bytes;
      if (!hier || n == my_node) {
        for (int l = 0; l < L; ++l) {
          if (!((mask >> l) & 1u)) continue;
          const int d = n * L + l;
          const int64_t j = next[d]++;
          if (!hier) bytes.algo_token += a.token_row_bytes;
          if (n != my_node) {
            bytes.physical_token += a.token_row_bytes;
            ++bytes.physical_rows;
          }
          if (ll) {
            put_row(d, slots, static_cast<int64_t>(me) * P + j, t, EncodeSrcPos(me, t, M));
          } else {
            put_row(d, recv, base_of_me[d] + j, t, EncodeSrcPos(me, t, M));
          }
        }
        continue;
      }
      // One copy to node n's gateway, with the mask of its destinations there.
      const int g = nodes_.Gateway(me, n);
      const int64_t slot = static_cast<int64_t>(my_node) * M + staged[n]++;
      put_row(g, fwd, slot, t, static_cast<int32_t>(t));
      Put(g, layout_.fwd_mask + slot * 4, &mask, 4, LinkPayload::kMeta, bytes);
      bytes.physical_token += a.token_row_bytes;
      ++bytes.physical_rows;
    }
  }
  if (!hier) return;
  for (int n = 0; n < N; ++n) {
    if (n == my_node) continue;
    PutSignal(nodes_.Gateway(me, n), layout_.fwd_done + my_node * 8,
              CountWord(epoch, staged[n] + 1, a.row_tag), bytes);
  }
  if (ll) {
    for (int l = 0; l < L; ++l) {
      const int d = my_node * L + l;
      PutSignal(d, layout_.ll_flags + me * 8, CountWord(epoch, next[d] + 1, a.row_tag), bytes);
    }
  }
}

void InterNodeCpu::ForwardStaged(uint64_t epoch, const std::vector<std::vector<int64_t>>* base) {
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int L = nodes_.local_size, N = nodes_.nodes(), my_node = nodes_.NodeOf(me);
  const int64_t M = shape_.max_tokens, H = shape_.hidden_bytes, Sb = shape_.scale_bytes;
  const int64_t P = RecvCapacity(shape_) / W;
  const bool ll = kind_ == InterNodeKind::kHierLL;
  InterNodeBytes& bytes = dispatch_bytes_;
  for (int n = 0; n < N; ++n) {
    if (n == my_node) continue;
    const int s = nodes_.Gateway(me, n);  // the source whose rows I forward
    const uint64_t w = Wait(layout_.fwd_done + n * 8, EpochFloor(epoch), s,
                            {"dispatch", epoch, "staged rows at the gateway", kCountBits});
    MORI_CHECK(EpochOf(w) == (epoch & kEpochMask), "staging word from pe ", s, " has epoch ",
               EpochOf(w), ", expected ", epoch);
    const uint64_t c = CountOf(w);
    if (c == kRejectedCount) {
      // A rejecting source (V1LL): every pe of this node hears of it from me.
      for (int l = 0; ll && l < L; ++l) {
        PutSignal(my_node * L + l, layout_.ll_flags + s * 8, w, bytes);
      }
      continue;
    }
    std::vector<int64_t> next(L, 0);
    for (int64_t j = 0; j + 1 < static_cast<int64_t>(c); ++j) {
      const int64_t slot = static_cast<int64_t>(n) * M + j;
      const int32_t t = *At<int32_t>(layout_.fwd_src_pos + slot * 4);
      const uint32_t mask = *At<uint32_t>(layout_.fwd_mask + slot * 4);
      const int32_t pos = EncodeSrcPos(s, t, M);
      for (int l = 0; l < L; ++l) {
        if (!((mask >> l) & 1u)) continue;
        const int d = my_node * L + l;
        const int64_t r = ll ? static_cast<int64_t>(s) * P + next[l]++ : (*base)[s][d] + next[l]++;
        const size_t tok = ll ? layout_.ll_tokens : layout_.recv_tokens;
        const size_t wts = ll ? layout_.ll_weights : layout_.recv_weights;
        const size_t scl = ll ? layout_.ll_scales : layout_.recv_scales;
        const size_t idx = ll ? layout_.ll_indices : layout_.recv_indices;
        const size_t sp = ll ? layout_.ll_src_pos : layout_.recv_src_pos;
        hs::PutNbi(ctx_, block_ + tok + r * H, At<char>(layout_.fwd_tokens + slot * H), H, d);
        hs::PutNbi(ctx_, block_ + wts + r * K * 4, At<char>(layout_.fwd_weights + slot * K * 4),
                   K * 4, d);
        if (Sb > 0) {
          hs::PutNbi(ctx_, block_ + scl + r * Sb, At<char>(layout_.fwd_scales + slot * Sb), Sb, d);
        }
        hs::PutNbi(ctx_, block_ + idx + r * K * 4, At<char>(layout_.fwd_indices + slot * K * 4),
                   K * 4, d);
        hs::PutNbi(ctx_, block_ + sp + r * 4, &pos, 4, d);
        ++bytes.forwarded_rows;
      }
    }
    if (ll) {
      for (int l = 0; l < L; ++l) {
        PutSignal(my_node * L + l, layout_.ll_flags + s * 8,
                  CountWord(epoch, next[l] + 1, RowTagOf(w)), bytes);
      }
    }
  }
}

int InterNodeCpu::DispatchLowLatency(uint64_t epoch, const DispatchArgs& a,
                                     const std::vector<uint64_t>& counts, bool rejected) {
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int L = nodes_.local_size, N = nodes_.nodes(), my_node = nodes_.NodeOf(me);
  const int64_t H = shape_.hidden_bytes, Sb = shape_.scale_bytes;
  const int64_t P = RecvCapacity(shape_) / W;
  if (rejected) {
    const uint64_t w = CountWord(epoch, kRejectedCount);
    for (int l = 0; l < L; ++l) {
      PutSignal(my_node * L + l, layout_.ll_flags + me * 8, w, dispatch_bytes_);
    }
    for (int n = 0; n < N; ++n) {
      if (n != my_node) {
        PutSignal(nodes_.Gateway(me, n), layout_.fwd_done + my_node * 8, w, dispatch_bytes_);
      }
    }
  } else {
    SendRows(epoch, a, {});
  }
  ForwardStaged(epoch, nullptr);
  // Every source's flag: its count of rows here, + 1 (or its rejection).
  int rejected_by = -1;
  uint32_t first_tag = 0;
  int first_tag_pe = -1, other_tag_pe = -1;
  uint32_t other_tag = 0;
  std::vector<int64_t> count(W);
  for (int s = 0; s < W; ++s) {
    const uint64_t w = Wait(layout_.ll_flags + s * 8, EpochFloor(epoch), s,
                            {"dispatch", epoch, "low-latency dispatch flag", kCountBits});
    MORI_CHECK(EpochOf(w) == (epoch & kEpochMask), "dispatch flag of pe ", s, " has epoch ",
               EpochOf(w), ", expected ", epoch);
    if (CountOf(w) == kRejectedCount) {
      if (rejected_by < 0) rejected_by = s;
      continue;
    }
    count[s] = static_cast<int64_t>(CountOf(w)) - 1;
    if (first_tag_pe < 0) {
      first_tag_pe = s, first_tag = RowTagOf(w);
    } else if (RowTagOf(w) != first_tag && other_tag_pe < 0) {
      other_tag_pe = s, other_tag = RowTagOf(w);
    }
  }
  if (rejected || rejected_by >= 0) return rejected_by;
  if (other_tag_pe >= 0) {
    MORI_THROW(InvalidArgumentError, "dispatch token dtype differs between ranks: rank ",
               first_tag_pe, " passes ", DtypeTagName(first_tag), " and rank ", other_tag_pe,
               " passes ", DtypeTagName(other_tag), " (every rank must pass the same dtype)");
  }
  // Compact the slots into the receive rows: source pe, then its token order.
  int64_t r = 0;
  for (int s = 0; s < W; ++s) {
    for (int64_t j = 0; j < count[s]; ++j, ++r) {
      const int64_t slot = static_cast<int64_t>(s) * P + j;
      std::memcpy(At<char>(layout_.recv_tokens + r * H), At<char>(layout_.ll_tokens + slot * H), H);
      std::memcpy(At<char>(layout_.recv_weights + r * K * 4),
                  At<char>(layout_.ll_weights + slot * K * 4), K * 4);
      if (Sb > 0) {
        std::memcpy(At<char>(layout_.recv_scales + r * Sb), At<char>(layout_.ll_scales + slot * Sb),
                    Sb);
      }
      std::memcpy(At<char>(layout_.recv_indices + r * K * 4),
                  At<char>(layout_.ll_indices + slot * K * 4), K * 4);
      std::memcpy(At<char>(layout_.recv_src_pos + r * 4), At<char>(layout_.ll_src_pos + slot * 4),
                  4);
    }
  }
  total_recv_ = r;
  return -1;
}

int64_t InterNodeCpu::Dispatch(const DispatchArgs& a) {
  const int W = shape_.world_size, me = shape_.rank;
  // Routing (and the expert id check) before anything moves.
  uint8_t* token_ranks = At<uint8_t>(layout_.token_ranks);
  std::vector<uint64_t> counts(W, 0);
  RouteTokens(shape_, a, token_ranks, counts.data(),
              [this](const std::string& reason) { RejectDispatch(reason); });
  if (kind_ == InterNodeKind::kHierLL) {
    const int64_t P = RecvCapacity(shape_) / W;
    for (int d = 0; d < W; ++d) {
      if (static_cast<int64_t>(counts[d]) > P) {
        RejectDispatch(StrCat("rank ", me, " routes ", counts[d], " tokens to rank ", d,
                              ", more than the ", P,
                              " receive slots per source rank (max_total_recv_tokens)"));
      }
    }
  }
  if (kind_ == InterNodeKind::kHierLL && last_call_dispatch_) FinishDispatchEpoch(epoch_);
  const uint64_t epoch = ++epoch_;
  order_.Dispatched(false);
  last_call_dispatch_ = true;
  dispatch_bytes_ = InterNodeBytes{};
  dispatch_link_ops_.clear();
  const uint64_t moved_before = link_->moved_bytes();

  if (kind_ == InterNodeKind::kHierLL) {
    const int rejected_by = DispatchLowLatency(epoch, a, counts, false);
    if (rejected_by >= 0) {
      MORI_THROW(InvalidArgumentError, "dispatch rejected by rank ", rejected_by,
                 " (its inputs failed validation; see its error)");
    }
  } else {
    PostCounts(epoch, counts, a.row_tag);
    const uint64_t* words = At<uint64_t>(layout_.count_words);
    CheckCountExchange(WaitCounts(epoch), words, W, [&] { FinishDispatchEpoch(epoch); });
    // base[s][d]: where pe s's rows start at pe d (the same matrix on every pe).
    std::vector<std::vector<int64_t>> base(W, std::vector<int64_t>(W, 0));
    const int64_t capacity = RecvCapacity(shape_);
    for (int d = 0; d < W; ++d) {
      int64_t rows = 0;
      for (int s = 0; s < W; ++s) {
        base[s][d] = rows;
        rows += CountOf(words[s * W + d]);
      }
      if (rows > capacity) {
        FinishDispatchEpoch(epoch);
        MORI_THROW(InvalidArgumentError, "dispatch would deliver ", rows, " tokens to rank ", d,
                   ", more than the receive capacity of ", capacity,
                   " rows (max_total_recv_tokens); no data moved");
      }
      if (d == me) total_recv_ = rows;
    }
    SendRows(epoch, a, base[me]);
    if (kind_ == InterNodeKind::kHier) ForwardStaged(epoch, &base);
    FinishDispatchEpoch(epoch);
  }
  *At<int32_t>(layout_.total_recv) = static_cast<int32_t>(total_recv_);
  num_tokens_ = a.num_tokens;
  link_->Quiet();  // every command of the call applied: the proxy's count is complete
  dispatch_bytes_.moved = link_->moved_bytes() - moved_before;
  order_.Dispatched(true);
  return total_recv_;
}

double InterNodeCpu::ReplayLink(bool combine) {
  const std::vector<LinkOp>& ops = combine ? combine_link_ops_ : dispatch_link_ops_;
  size_t total = 0;
  for (const LinkOp& op : ops) total += op.bytes;
  std::vector<char> src(std::max<size_t>(total, 1), 0x5a);  // pages touched before timing
  link_->Quiet();
  shmem::BarrierAll();
  const auto start = std::chrono::steady_clock::now();
  size_t at = 0;
  for (const LinkOp& op : ops) {
    if (op.bytes == 0) {
      link_->Signal(op.pe, op.offset, op.value);
    } else {
      link_->Write(op.pe, op.offset, src.data() + at, op.bytes);
      at += op.bytes;
    }
  }
  link_->Quiet();
  shmem::BarrierAll();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mori::ep
