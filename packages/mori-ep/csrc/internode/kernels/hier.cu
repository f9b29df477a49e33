// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CUDA kernels of InterNodeV1 (hierarchical; internode/protocol.hpp): the steps of
// InterNodeCpu (SendRows, ForwardStaged, Combine) in the same order, so the rows land at
// the same places and every sum runs in the same order, bit for bit. A token crosses to
// each destination node once, to the gateway g(s, n) = n * L + s % L, which forwards it
// to the masked pes of its node by load/store; combine returns rows of other nodes'
// tokens to this node's gateway for their source, which sums them into one partial per
// (token, node) and sends it back once. One block per call (kernels/common.cuh: how pes
// of this node and of other nodes are reached).
#include <algorithm>

#include "internode/kernels/common.cuh"

namespace mori::ep::internode {

namespace {

// ------------------------------------------------------------------ dispatch

// V1LL's entry (InterNodeCpu::Dispatch and DispatchLowLatency before the rows): the
// previous call's done words when it was a dispatch, the routing, the slots per source
// (a pe over them rejects the call), and on a rejection its words: a rejected flag to
// this node's pes and a rejected staging word to every gateway. True: this pe rejects.
__device__ bool LowLatencyEntry(const Params& p, DispatchShared& sh) {
  const int tid = threadIdx.x;
  const int W = p.world_size, me = p.rank;
  const int L = p.nodes.local_size, N = p.nodes.nodes(), my_node = p.nodes.NodeOf(me);
  if (p.finish_previous) {  // not counted: the previous call's words (Route zeroes cnt)
    if (tid < W) {
      PostSignal(p, tid, p.l.dispatch_done + static_cast<size_t>(me) * 8, p.call - 1, sh.cnt);
      WaitWord(p, p.l.dispatch_done + static_cast<size_t>(tid) * 8, p.call - 1, tid, "dispatch",
               "rows written", 0);
    }
    __syncthreads();
  }
  bool rejecting = Route(p, sh);
  const int64_t P = p.recv_capacity / W;
  if (tid == 0) {
    sh.over = -1;
    for (int d = 0; d < W && !rejecting; ++d) {
      if (sh.counts[d] > P) {
        sh.over = d;
        break;
      }
    }
  }
  __syncthreads();
  rejecting = rejecting || sh.over >= 0;
  if (rejecting) {
    const uint64_t w = CountWord(p.call, kRejectedCount);
    if (tid < L)
      PostSignal(p, my_node * L + tid, p.l.ll_flags + static_cast<size_t>(me) * 8, w, sh.cnt);
    if (tid < N && tid != my_node) {
      PostSignal(p, p.nodes.Gateway(me, tid), p.l.fwd_done + static_cast<size_t>(my_node) * 8, w,
                 sh.cnt);
    }
  }
  return rejecting;
}

// V1LL's end (the rest of DispatchLowLatency): a host rejection returns once its words
// are out (and forwarded); this pe's bad input traps naming it; else every source's
// flag (a rejection or a dtype difference traps on every pe) and the slots compacted
// into the receive rows, source by source.
__device__ void LowLatencyFinish(const Params& p, DispatchShared& sh, bool rejecting,
                                 int64_t* first_row, int64_t* total_rows) {
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, me = p.rank, K = p.top_k;
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, P = p.recv_capacity / W;
  __syncthreads();
  if (rejecting) {
    if (tid == 0) {
      pdev::Quiet(p.queue);  // the rejection reached every pe
      StoreCounters(p, 0, sh.cnt);
    }
    if (p.reject) return;
    __syncthreads();
    if (sh.over >= 0 && tid == 0) {
      MORI_INTERNODE_TRAP(p, "dispatch",
                          "rank %d routes %d tokens to rank %d, more than the %lld receive slots "
                          "per source rank (max_total_recv_tokens)",
                          me, sh.counts[sh.over], sh.over, static_cast<long long>(P));
    }
    if (sh.over >= 0) dev::TrapAfterReport();
    TrapBadInput(p, sh);
  }
  uint64_t* flags = reinterpret_cast<uint64_t*>(p.block + p.l.ll_flags);
  if (tid < W) {
    WaitWord(p, p.l.ll_flags + static_cast<size_t>(tid) * 8, EpochFloor(p.call), tid, "dispatch",
             "low-latency dispatch flag", kCountBits);
  }
  __syncthreads();
  if (tid == 0) {
    int rejected_by = -1, first_tag_pe = -1, other_tag_pe = -1;
    uint32_t first_tag = 0, other_tag = 0;
    int64_t r = 0;
    for (int s = 0; s < W; ++s) {
      const uint64_t w = dev::LoadAcquire(flags + s);
      if (EpochOf(w) != (p.call & kEpochMask)) {
        MORI_INTERNODE_TRAP(p, "dispatch", "dispatch flag of pe %d has epoch %llu, expected %llu",
                            s, static_cast<unsigned long long>(EpochOf(w)),
                            static_cast<unsigned long long>(p.call));
      }
      first_row[s] = r;
      if (CountOf(w) == kRejectedCount) {
        if (rejected_by < 0) rejected_by = s;
        continue;
      }
      r += static_cast<int64_t>(CountOf(w)) - 1;
      if (first_tag_pe < 0) {
        first_tag_pe = s, first_tag = RowTagOf(w);
      } else if (RowTagOf(w) != first_tag && other_tag_pe < 0) {
        other_tag_pe = s, other_tag = RowTagOf(w);
      }
    }
    // A call every pe fails: this pe's commands still in the proxy's queue (its staging
    // word to a rejecting gateway, which waits for it before its own trap) land before
    // the trap ends this context and with it the proxy's copies into it.
    if (rejected_by >= 0 || other_tag_pe >= 0) pdev::Quiet(p.queue);
    if (rejected_by >= 0) {
      MORI_INTERNODE_TRAP(p, "dispatch",
                          "dispatch rejected by rank %d (its inputs failed validation; see its "
                          "error)",
                          rejected_by);
    }
    if (other_tag_pe >= 0) {
      MORI_INTERNODE_TRAP(p, "dispatch",
                          "dispatch token dtype differs between ranks: rank %d passes %s and rank "
                          "%d passes %s (every rank must pass the same dtype)",
                          first_tag_pe, DtypeTagName(first_tag), other_tag_pe,
                          DtypeTagName(other_tag));
    }
    *total_rows = r;
    *reinterpret_cast<int32_t*>(p.block + p.l.total_recv) = static_cast<int32_t>(r);
  }
  __syncthreads();
  // Compact: receive row i is slot [s][i - first_row[s]] of the source s it falls in.
  char* b = p.block;
  for (int64_t i = warp; i < *total_rows; i += nwarps) {
    int s = 0;
    while (s + 1 < W && first_row[s + 1] <= i) ++s;
    const int64_t slot = static_cast<int64_t>(s) * P + (i - first_row[s]);
    CopyBytes(b + p.l.recv_tokens + i * H, b + p.l.ll_tokens + slot * H, H, lane, 32);
    CopyBytes(b + p.l.recv_weights + i * K * 4, b + p.l.ll_weights + slot * K * 4, K * 4, lane, 32);
    if (Sb > 0)
      CopyBytes(b + p.l.recv_scales + i * Sb, b + p.l.ll_scales + slot * Sb, Sb, lane, 32);
    CopyBytes(b + p.l.recv_indices + i * K * 4, b + p.l.ll_indices + slot * K * 4, K * 4, lane, 32);
    if (lane == 0) {
      reinterpret_cast<int32_t*>(b + p.l.recv_src_pos)[i] =
          reinterpret_cast<const int32_t*>(b + p.l.ll_src_pos)[slot];
    }
  }
  __syncthreads();
  if (tid == 0) {
    pdev::Quiet(p.queue);  // the staging may be rewritten by the next call
    StoreCounters(p, 0, sh.cnt);
  }
}

template <bool kLL>
__global__ void HierDispatchKernel(Params p) {
  BeginCall(p, /*dispatch=*/true);
  __shared__ DispatchShared sh;
  __shared__ int64_t staged[kMaxInterNodeWorld];      // my tokens staged at node n's gateway
  __shared__ uint64_t fwd_words[kMaxInterNodeWorld];  // node n's staging word, as its gateway
  __shared__ int64_t first_row[kMaxInterNodeWorld];   // V1LL: pe s's first receive row
  __shared__ int64_t total_rows;
  bool rejecting = false;  // V1LL: this pe rejects (it still forwards, as a gateway)
  if constexpr (kLL) {
    rejecting = LowLatencyEntry(p, sh);
  } else {
    if (!RouteAndExchange(p, sh)) return;
  }
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, me = p.rank, K = p.top_k;
  const int L = p.nodes.local_size, N = p.nodes.nodes(), my_node = p.nodes.NodeOf(me);
  const int64_t M = p.max_tokens, n = rejecting ? 0 : p.num_tokens;
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, trb = p.token_row_bytes;
  const int64_t P = p.recv_capacity / W;
  const uint8_t* token_ranks = reinterpret_cast<const uint8_t*>(p.block + p.l.token_ranks);
  const int32_t* dest_row = reinterpret_cast<const int32_t*>(p.block + p.l.dest_row);
  uint32_t* stage_mask = reinterpret_cast<uint32_t*>(p.block + p.l.dstage_mask);
  int32_t* node_row = reinterpret_cast<int32_t*>(p.block + p.l.node_row);
  const uint64_t* words = reinterpret_cast<const uint64_t*>(p.block + p.l.count_words);
  char* b = p.block;
  // Where this node's rows land: V1 at their final receive rows, V1LL in the fixed
  // slots [s][j] (compacted at the end).
  const size_t to_tokens = kLL ? p.l.ll_tokens : p.l.recv_tokens;
  const size_t to_weights = kLL ? p.l.ll_weights : p.l.recv_weights;
  const size_t to_scales = kLL ? p.l.ll_scales : p.l.recv_scales;
  const size_t to_indices = kLL ? p.l.ll_indices : p.l.recv_indices;
  const size_t to_src_pos = kLL ? p.l.ll_src_pos : p.l.recv_src_pos;

  // Each token's local-rank mask on every other node and its slot among my tokens
  // staged at that node's gateway (token order): a warp per node.
  for (int nn = warp; nn < N; nn += nwarps) {
    int64_t j = 0;
    for (int64_t t0 = 0; t0 < n && nn != my_node; t0 += 32) {
      const int64_t t = t0 + lane;
      uint32_t mask = 0;
      for (int l = 0; l < L && t < n; ++l) {
        mask |= static_cast<uint32_t>(token_ranks[t * W + nn * L + l] != 0) << l;
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, mask != 0);
      if (t < n) {
        node_row[t * N + nn] =
            mask ? static_cast<int32_t>(j + __popc(ballot & ((1u << lane) - 1u))) : -1;
        stage_mask[t * N + nn] = mask;
      }
      j += __popc(ballot);
    }
    if (lane == 0) staged[nn] = j;
  }
  __threadfence_system();
  __syncthreads();

  // The rows: a warp per token; this node's destinations directly at their final
  // rows, the token staged once and written once to each other destination node's
  // gateway (fwd slot [my node][its index there]) with its local-rank mask.
  for (int64_t t = warp; t < n; t += nwarps) {
    const uint8_t* ranks = token_ranks + t * W;
    const int32_t pos = EncodeSrcPos(me, t, M);
    bool remote = false;
    for (int nn = 0; nn < N; ++nn) {
      uint32_t mask = 0;
      for (int l = 0; l < L; ++l) mask |= static_cast<uint32_t>(ranks[nn * L + l] != 0) << l;
      if (mask == 0) continue;
      if (lane == 0) atomicAdd(&sh.cnt[kAlgoToken], static_cast<unsigned long long>(trb));
      if (nn != my_node) {
        remote = true;
        continue;
      }
      for (int l = 0; l < L; ++l) {
        if (!((mask >> l) & 1u)) continue;
        const int d = nn * L + l;
        const int64_t r = (kLL ? static_cast<int64_t>(me) * P : sh.base[d]) + dest_row[t * W + d];
        CopyBytes(dev::Ptr(p.ctx, b + to_tokens + r * H, d), p.tokens + t * trb, trb, lane, 32);
        CopyBytes(dev::Ptr(p.ctx, b + to_weights + r * K * 4, d), p.weights + t * K, K * 4, lane,
                  32);
        if (Sb > 0) {
          CopyBytes(dev::Ptr(p.ctx, b + to_scales + r * Sb, d), p.scales + t * Sb, Sb, lane, 32);
        }
        CopyBytes(dev::Ptr(p.ctx, b + to_indices + r * K * 4, d), p.indices + t * K, K * 4, lane,
                  32);
        if (lane == 0) *dev::Ptr(p.ctx, reinterpret_cast<int32_t*>(b + to_src_pos) + r, d) = pos;
      }
    }
    if (!remote) continue;
    CopyBytes(b + p.l.dstage_tokens + t * H, p.tokens + t * trb, trb, lane, 32);
    CopyBytes(b + p.l.dstage_weights + t * K * 4, p.weights + t * K, K * 4, lane, 32);
    if (Sb > 0) CopyBytes(b + p.l.dstage_scales + t * Sb, p.scales + t * Sb, Sb, lane, 32);
    CopyBytes(b + p.l.dstage_indices + t * K * 4, p.indices + t * K, K * 4, lane, 32);
    if (lane == 0) reinterpret_cast<int32_t*>(b + p.l.dstage_src_pos)[t] = static_cast<int32_t>(t);
    __threadfence_system();
    __syncwarp();
    for (int nn = 0; nn < N && lane == 0; ++nn) {
      if (nn == my_node || stage_mask[t * N + nn] == 0) continue;
      const int g = p.nodes.Gateway(me, nn);
      const int64_t slot = static_cast<int64_t>(my_node) * M + node_row[t * N + nn];
      auto& c = sh.cnt;
      PushRemote(p, g, p.l.fwd_tokens + slot * H, p.l.dstage_tokens + t * H, trb, kLinkToken, c);
      PushRemote(p, g, p.l.fwd_weights + slot * K * 4, p.l.dstage_weights + t * K * 4, K * 4,
                 kLinkMeta, c);
      PushRemote(p, g, p.l.fwd_scales + slot * Sb, p.l.dstage_scales + t * Sb, Sb, kLinkMeta, c);
      PushRemote(p, g, p.l.fwd_indices + slot * K * 4, p.l.dstage_indices + t * K * 4, K * 4,
                 kLinkMeta, c);
      PushRemote(p, g, p.l.fwd_src_pos + slot * 4, p.l.dstage_src_pos + t * 4, 4, kLinkMeta, c);
      PushRemote(p, g, p.l.fwd_mask + slot * 4, p.l.dstage_mask + (t * N + nn) * 4, 4, kLinkMeta,
                 c);
      atomicAdd(&c[kPhysicalToken], static_cast<unsigned long long>(trb));
      atomicAdd(&c[kPhysicalRows], 1ull);
    }
    __syncwarp();
  }
  __threadfence_system();
  __syncthreads();

  // Each gateway hears how many rows I staged there (count + 1, after the rows); V1LL:
  // this node's pes how many rows of mine are in their slots (a rejection posted both).
  if (!rejecting && tid < N && tid != my_node) {
    PostSignal(p, p.nodes.Gateway(me, tid), p.l.fwd_done + static_cast<size_t>(my_node) * 8,
               CountWord(p.call, staged[tid] + 1, p.row_tag), sh.cnt);
  }
  if (kLL && !rejecting && tid < L) {
    const int d = my_node * L + tid;
    PostSignal(p, d, p.l.ll_flags + static_cast<size_t>(me) * 8,
               CountWord(p.call, static_cast<uint64_t>(sh.counts[d]) + 1, p.row_tag), sh.cnt);
  }
  // As the gateway of the pe with my local index on every other node: its staged rows.
  if (tid < N && tid != my_node) {
    const int s = p.nodes.Gateway(me, tid);
    const uint64_t w = WaitWord(p, p.l.fwd_done + static_cast<size_t>(tid) * 8, EpochFloor(p.call),
                                s, "dispatch", "staged rows at the gateway", kCountBits);
    if (EpochOf(w) != (p.call & kEpochMask)) {
      MORI_INTERNODE_TRAP(p, "dispatch", "staging word from pe %d has epoch %llu, expected %llu", s,
                          static_cast<unsigned long long>(EpochOf(w)),
                          static_cast<unsigned long long>(p.call));
    }
    fwd_words[tid] = w;
  }
  __syncthreads();

  // Forward them (a warp per node): slot j's row to every masked pe l of this node, at
  // row base[s][d] (V1LL: slot s * P) + its index among s's forwarded rows to l, in slot
  // order; V1LL: then s's flag to each of them (a rejection passed on as it came).
  const uint32_t* fwd_mask = reinterpret_cast<const uint32_t*>(b + p.l.fwd_mask);
  const int32_t* fwd_src = reinterpret_cast<const int32_t*>(b + p.l.fwd_src_pos);
  for (int nn = warp; nn < N; nn += nwarps) {
    if (nn == my_node) continue;
    const int s = p.nodes.Gateway(me, nn);
    if (kLL && CountOf(fwd_words[nn]) == kRejectedCount) {
      if (lane < L) {
        PostSignal(p, my_node * L + lane, p.l.ll_flags + static_cast<size_t>(s) * 8, fwd_words[nn],
                   sh.cnt);
      }
      continue;
    }
    const int64_t c = static_cast<int64_t>(CountOf(fwd_words[nn])) - 1;
    // Lane l: the next row of s's at pe my_node * L + l.
    int64_t next = kLL ? static_cast<int64_t>(s) * P : 0;
    if (!kLL && lane < L) {
      const int d = my_node * L + lane;
      for (int s2 = 0; s2 < s; ++s2) next += static_cast<int64_t>(CountOf(words[s2 * W + d]));
    }
    const int64_t start = next;
    for (int64_t j0 = 0; j0 < c; j0 += 32) {
      const int64_t j = j0 + lane;
      const uint32_t mask = j < c ? fwd_mask[nn * M + j] : 0u;
      for (int l = 0; l < L; ++l) {
        const unsigned ballot = __ballot_sync(0xffffffffu, (mask >> l) & 1u);
        const int64_t first = __shfl_sync(0xffffffffu, next, l);
        const int d = my_node * L + l;
        for (unsigned bits = ballot; bits != 0; bits &= bits - 1) {
          const int k = __ffs(bits) - 1;
          const int64_t slot = nn * M + j0 + k;
          const int64_t r = first + __popc(ballot & ((1u << k) - 1u));
          CopyBytes(dev::Ptr(p.ctx, b + to_tokens + r * H, d), b + p.l.fwd_tokens + slot * H, H,
                    lane, 32);
          CopyBytes(dev::Ptr(p.ctx, b + to_weights + r * K * 4, d),
                    b + p.l.fwd_weights + slot * K * 4, K * 4, lane, 32);
          if (Sb > 0) {
            CopyBytes(dev::Ptr(p.ctx, b + to_scales + r * Sb, d), b + p.l.fwd_scales + slot * Sb,
                      Sb, lane, 32);
          }
          CopyBytes(dev::Ptr(p.ctx, b + to_indices + r * K * 4, d),
                    b + p.l.fwd_indices + slot * K * 4, K * 4, lane, 32);
          if (lane == 0) {
            *dev::Ptr(p.ctx, reinterpret_cast<int32_t*>(b + to_src_pos) + r, d) =
                EncodeSrcPos(s, fwd_src[slot], M);
            atomicAdd(&sh.cnt[kForwardedRows], 1ull);
          }
        }
        if (lane == l) next += __popc(ballot);
      }
    }
    if (kLL) {
      __threadfence_system();
      __syncwarp();
      if (lane < L) {
        PostSignal(
            p, my_node * L + lane, p.l.ll_flags + static_cast<size_t>(s) * 8,
            CountWord(p.call, static_cast<uint64_t>(next - start) + 1, RowTagOf(fwd_words[nn])),
            sh.cnt);
      }
    }
  }
  if constexpr (kLL) {
    LowLatencyFinish(p, sh, rejecting, first_row, &total_rows);
    return;
  }

  // Done words: a pe leaves once every pe has written (and forwarded) every row.
  FinishDispatch(p, sh);
}

// ------------------------------------------------------------------- combine

__global__ void HierCombineKernel(Params p) {
  BeginCall(p, /*dispatch=*/false);
  __shared__ CombineShared sh;
  if (!CombineEntry(p, sh)) return;
  unsigned long long* cnt = sh.cnt;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, me = p.rank, K = p.top_k;
  const int L = p.nodes.local_size, N = p.nodes.nodes(), my_node = p.nodes.NodeOf(me);
  const int my_local = p.nodes.LocalOf(me);
  const int64_t M = p.max_tokens, Hc = p.combine_row_bytes, row_bytes = p.row_bytes;
  const int64_t total = *p.total_recv;
  const bool with_weights = p.out_weights != nullptr;
  const CombineDtype dtype = static_cast<CombineDtype>(p.dtype);
  const int elem = static_cast<int>(CombineElementBytes(dtype));
  char* b = p.block;

  // Every received row: to its source's slot [me][t] when the source is on this node,
  // else to this node's gateway for that source, slot [its node][my local index][t],
  // marked with this call.
  for (int64_t i = warp; i < total; i += nwarps) {
    const int s = static_cast<int>(p.src_pos[i] / M);
    const int64_t t = p.src_pos[i] % M;
    const char* row = p.input + i * p.input_row_stride;
    const float* w = p.combine_weights + i * K;
    if (SameNode(p, s)) {
      const size_t slot = static_cast<size_t>(me) * M + t;
      CopyBytes(dev::Ptr(p.ctx, b + p.l.comb_tokens + slot * Hc, s), row, row_bytes, lane, 32);
      if (with_weights) {
        CopyBytes(dev::Ptr(p.ctx, b + p.l.comb_weights + slot * K * 4, s), w, K * 4, lane, 32);
      }
      continue;
    }
    const int g = my_node * L + p.nodes.LocalOf(s);
    const size_t slot = (static_cast<size_t>(p.nodes.NodeOf(s)) * L + my_local) * M + t;
    CopyBytes(dev::Ptr(p.ctx, b + p.l.stage_tokens + slot * Hc, g), row, row_bytes, lane, 32);
    if (with_weights) {
      CopyBytes(dev::Ptr(p.ctx, b + p.l.stage_weights + slot * K * 4, g), w, K * 4, lane, 32);
    }
    if (lane == 0) {
      *dev::Ptr(p.ctx, reinterpret_cast<uint64_t*>(b + p.l.stage_mark) + slot, g) = p.call;
    }
  }
  __threadfence_system();
  __syncthreads();
  if (tid < L) {
    const int d = my_node * L + tid;
    PostSignal(p, d, p.l.comb_done + static_cast<size_t>(me) * 8, p.call, cnt);
    for (int nn = 0; nn < N; ++nn) {
      if (nn == my_node) continue;
      PostSignal(p, d, p.l.stage_done + (static_cast<size_t>(nn) * L + my_local) * 8, p.call, cnt);
    }
  }
  // As the gateway of every other node's pe with my local index: this node's rows of
  // its tokens, staged.
  for (int idx = tid; idx < N * L; idx += nthreads) {
    const int nn = idx / L, l = idx % L;
    if (nn == my_node) continue;
    WaitWord(p, p.l.stage_done + static_cast<size_t>(idx) * 8, p.call, my_node * L + l, "combine",
             "rows staged at the gateway", 0);
  }
  __syncthreads();

  // One partial per (node, token) staged this call: the rows of this node's pes in
  // ascending order (CombineTokenRow), sent back once. A warp per (node, token).
  const uint64_t* mark = reinterpret_cast<const uint64_t*>(b + p.l.stage_mark);
  for (int64_t it = warp; it < static_cast<int64_t>(N) * M; it += nwarps) {
    const int nn = static_cast<int>(it / M);
    const int64_t t = it % M;
    if (nn == my_node) continue;
    uint32_t mask = 0;
    for (int l = 0; l < L; ++l) {
      mask |= static_cast<uint32_t>(mark[(static_cast<int64_t>(nn) * L + l) * M + t] == p.call)
              << l;
    }
    if (mask == 0) continue;
    const int parts = __popc(mask);
    auto row_of = [&](int l) -> const char* {
      return b + p.l.stage_tokens + ((static_cast<int64_t>(nn) * L + l) * M + t) * Hc;
    };
    char* partial = b + p.l.pstage_tokens + it * Hc;
    for (int64_t h = lane; h < p.hidden_dim; h += 32) {
      uint32_t bits;
      if (CopiesSinglePart(parts, p.fp8_cast)) {
        bits = LoadBits(row_of(__ffs(mask) - 1), h, elem);
      } else {
        float acc = kSumStart;
        for (uint32_t m = mask; m != 0; m &= m - 1) {
          acc += CombineElementValue(row_of(__ffs(m) - 1), h, dtype, p.fp8_cast);
        }
        bits = RoundBits(acc, dtype);
      }
      StoreBits(partial, h, elem, bits);
    }
    float* partial_w = reinterpret_cast<float*>(b + p.l.pstage_weights) + it * K;
    for (int j = lane; with_weights && j < K; j += 32) {
      auto wt = [&](int l) {
        return reinterpret_cast<const float*>(
            b + p.l.stage_weights)[((static_cast<int64_t>(nn) * L + l) * M + t) * K + j];
      };
      float acc = parts == 1 ? wt(__ffs(mask) - 1) : kSumStart;
      for (uint32_t m = parts > 1 ? mask : 0u; m != 0; m &= m - 1) acc += wt(__ffs(m) - 1);
      partial_w[j] = acc;
    }
    __threadfence_system();
    __syncwarp();
    if (lane == 0) {
      const int s = p.nodes.Gateway(me, nn);
      const size_t dst = static_cast<size_t>(my_node) * M + t;
      PushRemote(p, s, p.l.partial_tokens + dst * Hc, p.l.pstage_tokens + it * Hc, row_bytes,
                 kLinkToken, cnt);
      if (with_weights) {
        PushRemote(p, s, p.l.partial_weights + dst * K * 4, p.l.pstage_weights + it * K * 4, K * 4,
                   kLinkMeta, cnt);
      }
      atomicAdd(&cnt[kPhysicalToken], static_cast<unsigned long long>(row_bytes));
      atomicAdd(&cnt[kPhysicalRows], 1ull);
    }
    __syncwarp();
  }
  __threadfence_system();
  __syncthreads();
  if (tid < N && tid != my_node) {
    PostSignal(p, p.nodes.Gateway(me, tid), p.l.partial_done + static_cast<size_t>(my_node) * 8,
               p.call, cnt);
  }
  if (tid < L) {
    const int d = my_node * L + tid;
    WaitWord(p, p.l.comb_done + static_cast<size_t>(d) * 8, p.call, d, "combine", "combine rows",
             0);
  }
  if (tid < N && tid != my_node) {
    WaitWord(p, p.l.partial_done + static_cast<size_t>(tid) * 8, p.call, p.nodes.Gateway(me, tid),
             "combine", "node partials", 0);
  }
  __syncthreads();

  // My tokens: per destination node (ascending) its partial (this node's formed here
  // as the gateways form theirs), then their sum, one rounding.
  for (int64_t t = warp; t < p.num_tokens; t += nwarps) {
    const uint8_t* ranks = p.token_ranks + t * W;
    uint32_t nodes = 0, mine = 0;
    for (int nn = 0; nn < N; ++nn) {
      for (int l = 0; l < L; ++l) {
        if (!ranks[nn * L + l]) continue;
        nodes |= 1u << nn;
        if (nn == my_node) mine |= 1u << l;
      }
    }
    const int nparts = __popc(nodes), mparts = __popc(mine);
    if (lane == 0) {
      atomicAdd(&cnt[kAlgoToken], static_cast<unsigned long long>(row_bytes) * nparts);
    }
    auto own_row = [&](int l) -> const char* {
      return b + p.l.comb_tokens + ((static_cast<int64_t>(my_node) * L + l) * M + t) * Hc;
    };
    auto partial_row = [&](int nn) -> const char* {
      return b + p.l.partial_tokens + (static_cast<int64_t>(nn) * M + t) * Hc;
    };
    // Node nn's partial at element h, as bits of the dtype.
    auto partial_bits = [&](int nn, int64_t h) -> uint32_t {
      if (nn != my_node) return LoadBits(partial_row(nn), h, elem);
      if (CopiesSinglePart(mparts, p.fp8_cast)) return LoadBits(own_row(__ffs(mine) - 1), h, elem);
      float acc = kSumStart;
      for (uint32_t m = mine; m != 0; m &= m - 1) {
        acc += CombineElementValue(own_row(__ffs(m) - 1), h, dtype, p.fp8_cast);
      }
      return RoundBits(acc, dtype);
    };
    char* out = p.out + t * row_bytes;
    for (int64_t h = lane; h < p.hidden_dim; h += 32) {
      uint32_t bits = 0;
      if (nparts == 1) {
        bits = partial_bits(__ffs(nodes) - 1, h);
      } else if (nparts > 1) {
        float acc = kSumStart;
        for (uint32_t m = nodes; m != 0; m &= m - 1) {
          acc += BitsValue(partial_bits(__ffs(m) - 1, h), dtype);
        }
        bits = RoundBits(acc, dtype);
      }
      StoreBits(out, h, elem, bits);
    }
    if (!with_weights) continue;
    auto own_w = [&](int l, int j) {
      return reinterpret_cast<const float*>(
          b + p.l.comb_weights)[((static_cast<int64_t>(my_node) * L + l) * M + t) * K + j];
    };
    auto partial_w = [&](int nn, int j) -> float {
      if (nn != my_node) {
        return reinterpret_cast<const float*>(
            b + p.l.partial_weights)[(static_cast<int64_t>(nn) * M + t) * K + j];
      }
      float acc = mparts == 1 ? own_w(__ffs(mine) - 1, j) : kSumStart;
      for (uint32_t m = mparts > 1 ? mine : 0u; m != 0; m &= m - 1) acc += own_w(__ffs(m) - 1, j);
      return acc;
    };
    for (int j = lane; j < K; j += 32) {
      float acc = nparts == 0 ? 0.0f : nparts == 1 ? partial_w(__ffs(nodes) - 1, j) : kSumStart;
      for (uint32_t m = nparts > 1 ? nodes : 0u; m != 0; m &= m - 1) {
        acc += partial_w(__ffs(m) - 1, j);
      }
      p.out_weights[t * K + j] = acc;
    }
  }
  __syncthreads();
  if (tid == 0) {
    pdev::Quiet(p.queue);  // the staging may be rewritten by the next call
    StoreCounters(p, 1, cnt);
  }
}

}  // namespace

void LaunchHierDispatch(const Params& p, int threads, uintptr_t stream) {
  static const int most = MostThreads(HierDispatchKernel<false>);
  HierDispatchKernel<false>
      <<<1, std::min(threads, most), 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchHierLowLatencyDispatch(const Params& p, int threads, uintptr_t stream) {
  static const int most = MostThreads(HierDispatchKernel<true>);
  HierDispatchKernel<true>
      <<<1, std::min(threads, most), 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchHierCombine(const Params& p, int threads, uintptr_t stream) {
  static const int most = MostThreads(HierCombineKernel);
  HierCombineKernel<<<1, std::min(threads, most), 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LoadHierKernels() {
  cudaFuncAttributes attr;
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, HierDispatchKernel<false>));
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, HierDispatchKernel<true>));
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, HierCombineKernel));
}

}  // namespace mori::ep::internode
