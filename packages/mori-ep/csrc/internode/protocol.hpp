// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The inter-node dispatch/combine protocols (MORI's InterNode, InterNodeV1 and
// InterNodeV1LL kernel types) over mori's symmetric heap: the node map, the buffer
// layout and the signal words, shared by the CPU implementation (internode/cpu.cpp)
// and the CUDA kernels (internode/kernels/). No Python, no torch. The mori-ep README
// ("Inter-node") walks through each protocol; tests/workers/ep_internode_reference.py
// is the same protocol in Python, with its byte accounting.
//
// Nodes. W = world_size pes, L = pes per node (min(gpu_per_node, the heap's local group)),
// N = W / L nodes; pe r is on node r / L with local index r % L. A pe reaches the pes
// of its node through the heap (load/store: NVLink or host memory); every byte to
// another node goes through a CrossNodeLink (internode/link.hpp): a command (write,
// signal) that a transport moves and applies in order per peer.
//
// What crosses which leg, per kind (t a token of source pe s, D(t) its destination pes):
//   InterNode (flat)   s writes t's row to every d in D(t) at its final row; d on another
//                      node: over the link (one crossing per destination pe).
//   InterNodeV1        s writes t's row to every d in D(t) on its own node (heap); for
//                      every other node n with D(t) on n it writes one copy over the
//                      link to the gateway g(s, n) = n * L + s % L (the pe with s's local
//                      index on n), with the local-rank mask of D(t) on n; the gateway
//                      forwards it over the heap to each masked pe of n (itself too).
//                      One crossing per (token, destination node).
//   InterNodeV1LL      as V1, but no count exchange: rows land in fixed slots per source
//                      pe ([s][j], j the row's index among s's rows to d, j < P) and each
//                      source's rows are announced by one "count + 1" word per
//                      destination (posted by s on its node, by the gateway for the
//                      rows it forwards); the receiver compacts the slots into the
//                      output. Combine returns rows into fixed slots likewise.
//
// Row order (every kind): a destination's rows are ordered by source pe, then by source
// token: rows from s start at base(s, d) = sum_{s' < s} count(s' -> d). Flat and V1 get
// the count matrix from the count exchange (every pe posts its row of counts to every
// pe); LL compacts its slots in that order.
//
// Combine sums (fp32 accumulation; rows of a dtype, single parts copied bitwise as in
// common/numeric.hpp's CombineTokenRow):
//   InterNode  out(t) = round(sum over d in D(t), ascending d, of row_d(t)) (as IntraNode).
//   V1, V1LL   partial_n(t) = round(sum over d in D(t) on node n, ascending d, of
//              row_d(t)), rounded to the combine input's dtype (fp8_direct_cast: each
//              row rounded to fp8 e4m3 first; the partial stays in the input dtype);
//              out(t) = round(sum over the nodes n of D(t), ascending n, of partial_n(t)).
//              The partial of s's own node is formed the same way, at s; every other
//              node's is formed by the gateway g(s, n) and crosses once.
//   Weights: the same orders, fp32, no rounding between.
//
// Epochs and buffer reuse. Every signal word carries the call's epoch (count words and
// LL flags: common/signal_words.hpp's CountWord; the rest as raw epochs or CombineWord),
// so waits are ">= floor" comparisons on words nobody zeroes. Flat and V1 dispatch end
// with a done word from every pe (over the link for other nodes): a pe leaves a dispatch
// only when every pe has read its count words and every row to it has landed. Every
// combine starts with a vote: each pe posts CombineWord(epoch, dtype tag, rejected,
// weights) to every pe and waits for all, so a rejection, a dtype mismatch or ranks that
// differ in combining weights (a gateway forms partial weights only when its own call
// has them) fail the call on every pe before any row moves, and a pe's combine buffers
// are written only after it has entered the call (it has reduced the previous combine).
// Who counts the calls: the host implementation on the host; the CUDA kernels in the
// block's `state` (every kernel reads its call number there and advances it), so that a
// dispatch and combine captured in a CUDA graph take new numbers on every replay. V1LL's
// dispatch has no done words of its own: a dispatch right after a dispatch first
// exchanges the previous one's (combines start with their vote), which `state` also
// tells.
//
// One symmetric block per op, identical on every pe (offsets in bytes, 256-aligned).
// C = receive capacity, P = C / W (receive rows per source pe), H = hidden bytes, Hc =
// combine row bytes, S = scale bytes, K = top-k.
//   signals
//     count_words   u64 [W][W]   row s: pe s's counts (flat, V1), CountWord
//     dispatch_done u64 [W]      entry s = epoch once pe s has written (and forwarded)
//                                every row of the call
//     fwd_done      u64 [N]      entry n (gateway): CountWord(epoch, rows staged + 1) from
//                                the pe with this pe's local index on node n (V1, V1LL)
//     ll_flags      u64 [W]      entry s (V1LL): CountWord(epoch, rows from s + 1)
//     comb_vote     u64 [W]      entry d = CombineWord of pe d's combine
//     stage_done    u64 [N][L]   entry [n][l] (gateway): call once local pe l has staged
//                                its rows of node n's tokens (V1, V1LL)
//     partial_done  u64 [N]      entry n: call once node n's partials of this pe's tokens
//                                have landed here (V1, V1LL)
//     comb_done     u64 [W]      entry d (flat, and own-node rows in V1): call once pe d
//                                has returned its rows of this pe's tokens
//   (combine's words carry the combine's own call number, not the dispatch's epoch: a
//   routing handle's combine may follow later dispatches)
//   dispatch receive (rows [0, total_recv))
//     recv_tokens u8 [C][H], recv_weights f32 [C][K], recv_scales u8 [C][S],
//     recv_indices i32 [C][K], recv_src_pos i32 [C] (src_pe * M + token)
//   V1LL fixed slots (compacted into the receive rows): ll_* [W][P] of the same fields
//   gateway staging (V1, V1LL): fwd_* [N][M] of the same fields, fwd_mask u32 [N][M]
//     (local-rank mask of the row's destinations on this node), fwd_src_pos = token
//   combine
//     comb_tokens u8 [W][M][Hc], comb_weights f32 [W][M][K]: slot [d][t] pe d's row of
//       this pe's token t (flat: every d; V1: the pes of this node)
//     stage_tokens u8 [N][L][M][Hc], stage_weights f32 [N][L][M][K] (gateway): slot
//       [n][l][t] local pe l's row of token t of the pe with this pe's local index on n;
//       stage_mark u64 [N][L][M] (with the signals, zeroed with them): the combine call
//       that staged that slot (so the gateway finds a call's tokens and masks without
//       the dispatch's state: routing handles)
//     partial_tokens u8 [N][M][Hc], partial_weights f32 [N][M][K]: node n's partial of
//       this pe's token t
//   private: total_recv i32 [1], token_ranks u8 [M][W] (last dispatch's D(t)), send_ring
//     (the proxy link stages its payloads here: proxy writes copy from the heap)
//   private, CUDA kernels only (MakeInterNodeLayout's `device`; internode/cuda.hpp):
//     dstage_* [M] of the receive fields: each token's row staged once for the proxy's
//     writes to other nodes; cstage_tokens u8 [C][Hc], cstage_weights f32 [C][K]:
//     combine rows staged likewise (flat); dest_row i32 [M][W]: token t's row index
//     among this pe's rows to pe d (-1: none); V1, V1LL: dstage_mask u32 [M][N] (token
//     t's local-rank mask on node n), node_row i32 [M][N] (its slot among this pe's
//     tokens staged at node n's gateway, -1: none), pstage_tokens u8 [N][M][Hc] and
//     pstage_weights f32 [N][M][K] (the partials a gateway sends back); counters u64
//     [2][16]: the byte counts of the last dispatch and combine; state u64 [8]: the
//     calls' numbers (internode/kernel_params.hpp's DeviceState: dispatches and
//     combines run, whether the last call was a dispatch), read and advanced by the
//     kernels, so that CUDA-graph replays advance them; last_set u64
//     [W][stage_mark / 8]: the value this pe last set at each signal word of each pe
//     through the proxy (the proxy adds, so a "set" is an add of the difference, as
//     ProxyLink does on the host)
//
// The staging areas are sized for the worst case (every token to every node), as
// MORI's V1 buffers are; a chunked ring with credits (DeepEP) is what a GPU version
// with limited memory would use.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/shape.hpp"
#include "common/signal_words.hpp"

namespace mori::ep {

// MORI's EpDispatchCombineKernelType values of the kinds this folder implements.
enum class InterNodeKind : int { kFlat = 1, kHier = 2, kHierLL = 3 };

inline const char* InterNodeKindName(InterNodeKind k) {
  return k == InterNodeKind::kFlat   ? "InterNode"
         : k == InterNodeKind::kHier ? "InterNodeV1"
                                     : "InterNodeV1LL";
}

// Which pe is on which node: pes [n * L, (n + 1) * L) form node n.
struct NodeMap {
  int world_size;
  int local_size;  // L
  MORI_HOST_DEVICE int nodes() const { return world_size / local_size; }
  MORI_HOST_DEVICE int NodeOf(int pe) const { return pe / local_size; }
  MORI_HOST_DEVICE int LocalOf(int pe) const { return pe % local_size; }
  // The pe on node `node` with `pe`'s local index: where pe's tokens enter that node.
  MORI_HOST_DEVICE int Gateway(int pe, int node) const {
    return node * local_size + pe % local_size;
  }
};

struct InterNodeLayout {
  size_t count_words, dispatch_done, fwd_done, ll_flags, comb_vote, stage_done, partial_done,
      comb_done;
  size_t recv_tokens, recv_weights, recv_scales, recv_indices, recv_src_pos;
  size_t ll_tokens, ll_weights, ll_scales, ll_indices, ll_src_pos;
  size_t fwd_tokens, fwd_weights, fwd_scales, fwd_indices, fwd_src_pos, fwd_mask;
  size_t comb_tokens, comb_weights, stage_tokens, stage_weights, stage_mark, partial_tokens,
      partial_weights;
  size_t total_recv, token_ranks, send_ring, send_ring_bytes;
  size_t dstage_tokens, dstage_weights, dstage_scales, dstage_indices, dstage_src_pos;
  size_t cstage_tokens, cstage_weights, dest_row, dstage_mask, node_row, pstage_tokens,
      pstage_weights, counters, state, last_set;
  size_t total_bytes;
};

// `device`: the block of the CUDA kernels (internode/cuda.hpp), with their private
// staging regions; the host implementation's has none of them (sizes 0).
inline InterNodeLayout MakeInterNodeLayout(const EpShape& s, const NodeMap& nm, InterNodeKind kind,
                                           bool device = false) {
  const size_t W = s.world_size, M = s.max_tokens, C = RecvCapacity(s), K = s.top_k;
  const size_t N = nm.nodes(), L = nm.local_size, H = s.hidden_bytes, Hc = s.combine_row_bytes;
  const size_t Sb = s.scale_bytes;
  const bool hier = kind != InterNodeKind::kFlat, ll = kind == InterNodeKind::kHierLL;
  const size_t Nh = hier ? N : 0, Wl = ll ? W : 0, P = C / W;
  InterNodeLayout l{};
  RegionCursor region;
  l.count_words = region.Take(W * W * 8);
  l.dispatch_done = region.Take(W * 8);
  l.fwd_done = region.Take(N * 8);
  l.ll_flags = region.Take(W * 8);
  l.comb_vote = region.Take(W * 8);
  l.stage_done = region.Take(N * L * 8);
  l.partial_done = region.Take(N * 8);
  l.comb_done = region.Take(W * 8);
  // Read as call numbers like the signal words, so zeroed with them (a reused block
  // must not show an earlier op's calls).
  l.stage_mark = region.Take(Nh * L * M * 8);
  l.recv_tokens = region.Take(C * H);
  l.recv_weights = region.Take(C * K * 4);
  l.recv_scales = region.Take(C * Sb);
  l.recv_indices = region.Take(C * K * 4);
  l.recv_src_pos = region.Take(C * 4);
  l.ll_tokens = region.Take(Wl * P * H);
  l.ll_weights = region.Take(Wl * P * K * 4);
  l.ll_scales = region.Take(Wl * P * Sb);
  l.ll_indices = region.Take(Wl * P * K * 4);
  l.ll_src_pos = region.Take(Wl * P * 4);
  l.fwd_tokens = region.Take(Nh * M * H);
  l.fwd_weights = region.Take(Nh * M * K * 4);
  l.fwd_scales = region.Take(Nh * M * Sb);
  l.fwd_indices = region.Take(Nh * M * K * 4);
  l.fwd_src_pos = region.Take(Nh * M * 4);
  l.fwd_mask = region.Take(Nh * M * 4);
  l.comb_tokens = region.Take(W * M * Hc);
  l.comb_weights = region.Take(W * M * K * 4);
  l.stage_tokens = region.Take(Nh * L * M * Hc);
  l.stage_weights = region.Take(Nh * L * M * K * 4);
  l.partial_tokens = region.Take(Nh * M * Hc);
  l.partial_weights = region.Take(Nh * M * K * 4);
  l.total_recv = region.Take(8);
  l.token_ranks = region.Take(M * W);
  // The proxy link's send ring (internode/proxy_link.hpp): at least 8 of the largest
  // payloads (a token or combine row, a count row), and 1 MiB.
  l.send_ring_bytes = AlignUp(std::max<size_t>(size_t{1} << 20, 8 * std::max({H, Hc, W * 8})), 256);
  l.send_ring = region.Take(l.send_ring_bytes);
  const size_t Md = device ? M : 0, Cd = device && !hier ? C : 0;
  l.dstage_tokens = region.Take(Md * H);
  l.dstage_weights = region.Take(Md * K * 4);
  l.dstage_scales = region.Take(Md * Sb);
  l.dstage_indices = region.Take(Md * K * 4);
  l.dstage_src_pos = region.Take(Md * 4);
  l.cstage_tokens = region.Take(Cd * Hc);
  l.cstage_weights = region.Take(Cd * K * 4);
  l.dest_row = region.Take(Md * W * 4);
  const size_t Mh = device && hier ? M : 0;
  l.dstage_mask = region.Take(Mh * N * 4);
  l.node_row = region.Take(Mh * N * 4);
  l.pstage_tokens = region.Take(N * Mh * Hc);
  l.pstage_weights = region.Take(N * Mh * K * 4);
  l.counters = region.Take(device ? 2 * 16 * 8 : 0);
  l.state = region.Take(device ? 8 * 8 : 0);
  l.last_set = region.Take(device ? W * l.stage_mark : 0);
  l.total_bytes = region.end;
  return l;
}

// Bytes that must be zero before the first call (the signal words), from offset 0.
inline size_t InterNodeSignalBytes(const InterNodeLayout& l) { return l.recv_tokens; }

}  // namespace mori::ep
