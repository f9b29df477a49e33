// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CUDA kernels of the inter-node protocols (internode/protocol.hpp), InterNode
// (flat): the steps of InterNodeCpu (internode/cpu.cpp, cpu_combine.cpp) in the same
// order, so the rows land at the same places and combine sums in the same order, bit
// for bit. One block per call. Pes of this node: load/store through the heap's peer
// mappings, then a release store of the signal word. Pes of other nodes: the payload
// is staged in this pe's block and pushed to the proxy as a write command, and the
// signal word follows as an add on the same queue (the proxy applies it after the
// writes before it to that pe). Every wait is bounded and traps naming this rank and
// node, the peer and its node, and the stage; a failed proxy's error is printed with
// it (the transport's words: which pe and node it lost).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdio>

#include "common/numeric.hpp"
#include "common/shape.hpp"
#include "common/signal_words.hpp"
#include "internode/kernel_params.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/proxy/queue_device.cuh"
#include "mori/shmem/device.cuh"

namespace mori::ep::internode {

namespace {

namespace dev = mori::shmem::device;
namespace pdev = mori::proxy::device;
using mori::shmem::device::detail::CopyBytes;

__device__ __forceinline__ const char* KindName(int kind) {
  return kind == 1 ? "InterNode" : kind == 2 ? "InterNodeV1" : "InterNodeV1LL";
}

__device__ __forceinline__ bool SameNode(const Params& p, int pe) {
  return p.nodes.NodeOf(pe) == p.nodes.NodeOf(p.rank);
}

// The first thread of this module to report prints; every reporting thread traps.
__device__ unsigned g_reported = 0;

__device__ __forceinline__ bool FirstReport() { return atomicExch(&g_reported, 1u) == 0u; }

// A peer's word did not come: the CPU implementation's message (InterNodeCpu::Wait).
__device__ __noinline__ void TrapLost(int kind, const char* op, uint64_t call, int me, int my_node,
                                      int peer, int peer_node, const char* stage,
                                      uint64_t timeout_ns, uint64_t last_call) {
  if (FirstReport()) {
    printf(
        "mori.ep %s %s (call %llu) on rank %d (node %d): rank %d (node %d) did not arrive (%s) "
        "within %llu ms (its last signal is from call %llu) [block %d thread %d]\n",
        KindName(kind), op, static_cast<unsigned long long>(call), me, my_node, peer, peer_node,
        stage, static_cast<unsigned long long>(timeout_ns / 1000000),
        static_cast<unsigned long long>(last_call), static_cast<int>(blockIdx.x),
        static_cast<int>(threadIdx.x));
    dev::TrapReported();
  }
  dev::TrapAfterReport();
}

// The proxy failed while this rank waited for a peer: its error names the lost pe.
__device__ __noinline__ void TrapLink(int kind, const char* op, uint64_t call, int me, int my_node,
                                      int peer, int peer_node, const char* stage,
                                      const proxy::QueueControl* control) {
  if (FirstReport()) {
    const uint32_t health = control->health;
    printf(
        "mori.ep %s %s (call %llu) on rank %d (node %d), waiting for rank %d (node %d) (%s): "
        "the inter-node link failed: %s\n",
        KindName(kind), op, static_cast<unsigned long long>(call), me, my_node, peer, peer_node,
        stage, health == proxy::kFailed ? control->error : "the proxy was closed");
    dev::TrapReported();
  }
  dev::TrapAfterReport();
}

// A call every pe fails the same way (a rejection, a dtype or capacity disagreement):
// the message of InterNodeCpu's error, after "mori.ep <kind> <op> (call c) on rank r: ".
#define MORI_INTERNODE_TRAP(p, op, fmt, ...)                                                 \
  do {                                                                                       \
    if (FirstReport()) {                                                                     \
      printf("mori.ep %s %s (call %llu) on rank %d: " fmt " [block %d thread %d]\n",         \
             KindName((p).kind), op, static_cast<unsigned long long>((p).call), (p).rank,    \
             __VA_ARGS__, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));      \
      dev::TrapReported();                                                                   \
    }                                                                                        \
    dev::TrapAfterReport();                                                                  \
  } while (0)

// Waits until this pe's word at `offset` >= floor (posted by `peer`); traps on the
// op's timeout or a failed proxy.
__device__ uint64_t WaitWord(const Params& p, size_t offset, uint64_t floor, int peer,
                             const char* op, const char* stage, int call_shift) {
  const uint64_t* word = reinterpret_cast<const uint64_t*>(p.block + offset);
  uint64_t seen = dev::LoadAcquire(word);
  if (seen >= floor) return seen;
  const uint64_t start = dev::GlobalTimerNs();
  for (uint32_t spin = 1;; ++spin) {
    seen = dev::LoadAcquire(word);
    if (seen >= floor) return seen;
    if ((spin & 255u) == 0) {
      if (p.queue.control->health != proxy::kHealthy) {
        TrapLink(p.kind, op, p.call, p.rank, p.nodes.NodeOf(p.rank), peer, p.nodes.NodeOf(peer),
                 stage, p.queue.control);
      }
      if (p.timeout_ns && dev::GlobalTimerNs() - start > p.timeout_ns) {
        TrapLost(p.kind, op, p.call, p.rank, p.nodes.NodeOf(p.rank), peer, p.nodes.NodeOf(peer),
                 stage, p.timeout_ns, seen >> call_shift);
      }
    }
  }
}

// Sets pe's word at `offset` to `value` (one thread; after this pe's writes to pe:
// the caller fenced them and synchronised the block). This node: a release store;
// another node: an add of the difference to the value last set there, pushed after
// the writes it covers.
__device__ void PostSignal(const Params& p, int pe, size_t offset, uint64_t value,
                           unsigned long long* cnt) {
  if (SameNode(p, pe)) {
    dev::StoreRelease(dev::Ptr(p.ctx, reinterpret_cast<uint64_t*>(p.block + offset), pe), value);
    return;
  }
  uint64_t* last = reinterpret_cast<uint64_t*>(p.block + p.l.last_set) +
                   static_cast<size_t>(pe) * (p.l.stage_mark / 8) + offset / 8;
  const uint64_t delta = value - *last;  // modulo 2^64: the word ends at `value`
  *last = value;
  pdev::PushAtomicAdd(p.queue, pe, p.block_offset + offset, delta);
  atomicAdd(&cnt[kLinkSignal], 8ull);
  atomicAdd(&cnt[kLinkSignals], 1ull);
}

// A write of `bytes` from this pe's block at `src` to pe's at `dst` (another node).
__device__ void PushRemote(const Params& p, int pe, size_t dst, size_t src, uint64_t bytes,
                           Counter what, unsigned long long* cnt) {
  if (bytes == 0) return;
  pdev::PushWrite(p.queue, pe, p.block_offset + dst, p.block_offset + src, bytes);
  atomicAdd(&cnt[what], static_cast<unsigned long long>(bytes));
  atomicAdd(&cnt[kLinkWrites], 1ull);
}

__device__ void StoreCounters(const Params& p, int which, const unsigned long long* cnt) {
  uint64_t* out = reinterpret_cast<uint64_t*>(p.block + p.l.counters) + which * kCounterStride;
  for (int i = 0; i < kCounters; ++i) out[i] = cnt[i];
}

// ------------------------------------------------------------------ dispatch

__global__ void FlatDispatchKernel(const Params p) {
  __shared__ unsigned long long cnt[kCounters];
  __shared__ int64_t base[kMaxInterNodeWorld];
  __shared__ int32_t counts[kMaxInterNodeWorld];
  __shared__ int bad;  // first bad (token * K + slot), INT_MAX: none
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, me = p.rank, K = p.top_k;
  const int64_t M = p.max_tokens, n = p.reject ? 0 : p.num_tokens;
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, trb = p.token_row_bytes;
  const int num_experts = p.num_experts_per_rank * W;
  if (tid < kCounters) cnt[tid] = 0;
  if (tid == 0) bad = INT_MAX;
  __syncthreads();
  uint8_t* token_ranks = reinterpret_cast<uint8_t*>(p.block + p.l.token_ranks);
  int32_t* dest_row = reinterpret_cast<int32_t*>(p.block + p.l.dest_row);

  // Every token's destination pes (RouteTokens), expert ids checked.
  for (int64_t t = tid; t < n; t += nthreads) {
    uint32_t mask = 0;
    if (p.rank_masks != nullptr) {
      mask = p.rank_masks[t];
      if (W < 32 && (mask >> W)) atomicMin(&bad, static_cast<int>(t * (K + 1) + K));
    } else {
      for (int j = 0; j < K; ++j) {
        const int32_t e = p.indices[t * K + j];
        if (e == -1) continue;
        if (e < 0 || e >= num_experts) {
          atomicMin(&bad, static_cast<int>(t * (K + 1) + j));
          continue;
        }
        mask |= 1u << ExpertRank(e, p.num_experts_per_rank);
      }
    }
    for (int d = 0; d < W; ++d) token_ranks[t * W + d] = (mask >> d) & 1u;
  }
  __syncthreads();
  const bool rejecting = p.reject || bad != INT_MAX;
  // Each token's row index among my rows to d (token order), and my count to d.
  for (int d = warp; d < W; d += nwarps) {
    int64_t j = 0;
    for (int64_t t0 = 0; t0 < n && !rejecting; t0 += 32) {
      const int64_t t = t0 + lane;
      const bool to_d = t < n && token_ranks[t * W + d] != 0;
      const unsigned ballot = __ballot_sync(0xffffffffu, to_d);
      if (t < n) dest_row[t * W + d] = to_d ? static_cast<int32_t>(j + __popc(ballot & ((1u << lane) - 1u))) : -1;
      j += __popc(ballot);
    }
    if (lane == 0) counts[d] = static_cast<int32_t>(j);
  }
  __syncthreads();

  // The count exchange: my row of count words in my block, then to every pe (this
  // node: a release per word; another node: one write and the last word's signal).
  uint64_t* words = reinterpret_cast<uint64_t*>(p.block + p.l.count_words);
  const size_t my_row = p.l.count_words + static_cast<size_t>(me) * W * 8;
  if (tid < W) {
    const uint64_t c = rejecting ? kRejectedCount : static_cast<uint64_t>(counts[tid]);
    words[static_cast<size_t>(me) * W + tid] = CountWord(p.call, c, rejecting ? 0 : p.row_tag);
  }
  __threadfence_system();
  __syncthreads();
  if (tid < W) {
    const int pe = tid;
    const uint64_t* row = words + static_cast<size_t>(me) * W;
    if (SameNode(p, pe)) {
      for (int d = 0; d < W; ++d) {
        dev::StoreRelease(dev::Ptr(p.ctx, reinterpret_cast<uint64_t*>(p.block + my_row) + d, pe),
                          row[d]);
      }
    } else {
      PushRemote(p, pe, my_row, my_row, static_cast<uint64_t>(W - 1) * 8, kLinkMeta, cnt);
      PostSignal(p, pe, my_row + (W - 1) * 8, row[W - 1], cnt);
    }
  }
  __syncthreads();
  if (rejecting) {
    if (tid == 0) {
      pdev::Quiet(p.queue);  // the rejection reached every pe
      StoreCounters(p, 0, cnt);
    }
    if (p.reject) return;
    __syncthreads();
    if (tid == 0) {
      const int t = bad / (K + 1), j = bad % (K + 1);
      if (j == K) {
        MORI_INTERNODE_TRAP(p, "dispatch",
                            "routing handle sends token %d to rank mask %u, beyond world_size %d",
                            t, p.rank_masks[t], W);
      }
      MORI_INTERNODE_TRAP(p, "dispatch", "expert id %d out of range [-1, %d) at token %d slot %d",
                          p.indices[t * K + j], num_experts, t, j);
    }
    dev::TrapAfterReport();
  }

  if (tid < W) {
    WaitWord(p, p.l.count_words + (static_cast<size_t>(tid) * W + W - 1) * 8, EpochFloor(p.call),
             tid, "dispatch", "count words", kCountBits);
  }
  __syncthreads();
  if (tid == 0) {
    int rejected_by = -1;
    for (int s = 0; s < W; ++s) {
      for (int d = 0; d < W; ++d) {
        const uint64_t w = dev::LoadAcquire(words + static_cast<size_t>(s) * W + d);
        if (EpochOf(w) != (p.call & kEpochMask)) {
          MORI_INTERNODE_TRAP(p, "dispatch", "count word from pe %d has epoch %llu, expected %llu", s,
                              static_cast<unsigned long long>(EpochOf(w)),
                              static_cast<unsigned long long>(p.call));
        }
        if (CountOf(w) == kRejectedCount && rejected_by < 0) rejected_by = s;
      }
    }
    if (rejected_by >= 0) {
      MORI_INTERNODE_TRAP(p, "dispatch",
                          "dispatch rejected by rank %d (its inputs failed validation; see its "
                          "error); no data moved",
                          rejected_by);
    }
    const uint32_t first = RowTagOf(words[0]);
    for (int s = 1; s < W; ++s) {
      const uint32_t tag = RowTagOf(words[static_cast<size_t>(s) * W]);
      if (tag != first) {
        MORI_INTERNODE_TRAP(p, "dispatch",
                            "dispatch token dtype differs between ranks: rank 0 passes %s and "
                            "rank %d passes %s (every rank must pass the same dtype); no data moved",
                            DtypeTagName(first), s, DtypeTagName(tag));
      }
    }
    int64_t total = 0;
    for (int d = 0; d < W; ++d) {
      int64_t rows = 0;
      for (int s = 0; s < W; ++s) {
        if (s == me) base[d] = rows;
        rows += static_cast<int64_t>(CountOf(words[static_cast<size_t>(s) * W + d]));
      }
      if (rows > p.recv_capacity) {
        MORI_INTERNODE_TRAP(p, "dispatch",
                            "dispatch would deliver %lld tokens to rank %d, more than the receive "
                            "capacity of %lld rows (max_total_recv_tokens); no data moved",
                            static_cast<long long>(rows), d,
                            static_cast<long long>(p.recv_capacity));
      }
      if (d == me) total = rows;
    }
    *reinterpret_cast<int32_t*>(p.block + p.l.total_recv) = static_cast<int32_t>(total);
  }
  __syncthreads();

  // The rows: a warp per token; every destination of this node directly at its final
  // row, the token staged once for the writes to the other nodes' destinations.
  for (int64_t t = warp; t < n; t += nwarps) {
    const uint8_t* ranks = token_ranks + t * W;
    const int32_t pos = EncodeSrcPos(me, t, M);
    bool remote = false;
    for (int d = 0; d < W; ++d) {
      if (!ranks[d]) continue;
      if (lane == 0) atomicAdd(&cnt[kAlgoToken], static_cast<unsigned long long>(trb));
      if (!SameNode(p, d)) {
        remote = true;
        continue;
      }
      const int64_t r = base[d] + dest_row[t * W + d];
      char* b = p.block;
      CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_tokens + r * H, d), p.tokens + t * trb, trb, lane, 32);
      CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_weights + r * K * 4, d), p.weights + t * K, K * 4,
                lane, 32);
      if (Sb > 0) {
        CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_scales + r * Sb, d), p.scales + t * Sb, Sb, lane,
                  32);
      }
      CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_indices + r * K * 4, d), p.indices + t * K, K * 4,
                lane, 32);
      if (lane == 0) *dev::Ptr(p.ctx, reinterpret_cast<int32_t*>(b + p.l.recv_src_pos) + r, d) = pos;
    }
    if (!remote) continue;
    char* b = p.block;
    CopyBytes(b + p.l.dstage_tokens + t * H, p.tokens + t * trb, trb, lane, 32);
    CopyBytes(b + p.l.dstage_weights + t * K * 4, p.weights + t * K, K * 4, lane, 32);
    if (Sb > 0) CopyBytes(b + p.l.dstage_scales + t * Sb, p.scales + t * Sb, Sb, lane, 32);
    CopyBytes(b + p.l.dstage_indices + t * K * 4, p.indices + t * K, K * 4, lane, 32);
    if (lane == 0) reinterpret_cast<int32_t*>(b + p.l.dstage_src_pos)[t] = pos;
    __threadfence_system();
    __syncwarp();
    for (int d = 0; d < W && lane == 0; ++d) {
      if (!ranks[d] || SameNode(p, d)) continue;
      const int64_t r = base[d] + dest_row[t * W + d];
      PushRemote(p, d, p.l.recv_tokens + r * H, p.l.dstage_tokens + t * H, trb, kLinkToken, cnt);
      PushRemote(p, d, p.l.recv_weights + r * K * 4, p.l.dstage_weights + t * K * 4, K * 4,
                 kLinkMeta, cnt);
      PushRemote(p, d, p.l.recv_scales + r * Sb, p.l.dstage_scales + t * Sb, Sb, kLinkMeta, cnt);
      PushRemote(p, d, p.l.recv_indices + r * K * 4, p.l.dstage_indices + t * K * 4, K * 4,
                 kLinkMeta, cnt);
      PushRemote(p, d, p.l.recv_src_pos + r * 4, p.l.dstage_src_pos + t * 4, 4, kLinkMeta, cnt);
      atomicAdd(&cnt[kPhysicalToken], static_cast<unsigned long long>(trb));
      atomicAdd(&cnt[kPhysicalRows], 1ull);
    }
    __syncwarp();
  }

  // Done words: a pe leaves once every pe has written every row of the call.
  __threadfence_system();
  __syncthreads();
  if (tid < W) PostSignal(p, tid, p.l.dispatch_done + static_cast<size_t>(me) * 8, p.call, cnt);
  if (tid < W) {
    WaitWord(p, p.l.dispatch_done + static_cast<size_t>(tid) * 8, p.call, tid, "dispatch",
             "rows written", 0);
  }
  __syncthreads();
  if (tid == 0) {
    pdev::Quiet(p.queue);  // the staging may be rewritten by the next call
    StoreCounters(p, 0, cnt);
  }
}

// ------------------------------------------------------------------- combine

// Element h of a combine row as stored (a single part is copied bitwise).
__device__ __forceinline__ void CopyElement(char* out, const char* row, int64_t h, int bytes) {
  if (bytes == 2) {
    reinterpret_cast<uint16_t*>(out)[h] = reinterpret_cast<const uint16_t*>(row)[h];
  } else if (bytes == 4) {
    reinterpret_cast<uint32_t*>(out)[h] = reinterpret_cast<const uint32_t*>(row)[h];
  } else {
    reinterpret_cast<uint8_t*>(out)[h] = reinterpret_cast<const uint8_t*>(row)[h];
  }
}

__device__ __forceinline__ void StoreElement(char* out, int64_t h, CombineDtype dtype, float v) {
  switch (dtype) {
    case CombineDtype::kBFloat16:
      reinterpret_cast<uint16_t*>(out)[h] = FloatToBf16Bits(v);
      break;
    case CombineDtype::kFloat8E4M3:
      reinterpret_cast<uint8_t*>(out)[h] = FloatToFloat8E4M3(v);
      break;
    case CombineDtype::kFloat32:
      reinterpret_cast<float*>(out)[h] = v;
      break;
  }
}

__global__ void FlatCombineKernel(const Params p) {
  __shared__ unsigned long long cnt[kCounters];
  __shared__ uint64_t votes[kMaxInterNodeWorld];
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, me = p.rank, K = p.top_k;
  const int64_t M = p.max_tokens, Hc = p.combine_row_bytes, row_bytes = p.row_bytes;
  if (tid < kCounters) cnt[tid] = 0;
  __syncthreads();

  // The entry vote: every pe's combine word (rejection, dtype) before any row moves.
  if (tid < W) {
    PostSignal(p, tid, p.l.comb_vote + static_cast<size_t>(me) * 8,
               CombineWord(p.call, p.reject ? 0 : p.combine_tag, p.reject), cnt);
  }
  __syncthreads();
  if (p.reject) {
    if (tid == 0) {
      pdev::Quiet(p.queue);
      StoreCounters(p, 1, cnt);
    }
    return;
  }
  if (tid < W) {
    votes[tid] = WaitWord(p, p.l.comb_vote + static_cast<size_t>(tid) * 8, CombineFloor(p.call),
                          tid, "combine", "combine entry", kCombineEpochShift);
  }
  __syncthreads();
  if (tid == 0) {
    for (int d = 0; d < W; ++d) {
      if (votes[d] & 1) {
        MORI_INTERNODE_TRAP(p, "combine",
                            "combine rejected by rank %d (its inputs failed validation; see its "
                            "error); outputs not written",
                            d);
      }
    }
    for (int d = 0; d < W; ++d) {
      if (CombineTagOf(votes[d]) != p.combine_tag) {
        MORI_INTERNODE_TRAP(p, "combine",
                            "combine input dtype differs between ranks: rank %d passes %s, this "
                            "rank %s (every rank must pass the same dtype); outputs not written",
                            d, CombineTagName(CombineTagOf(votes[d])),
                            CombineTagName(p.combine_tag));
      }
    }
  }
  const int64_t total = *p.total_recv;
  if (tid == 0 && total > p.input_rows) {
    MORI_INTERNODE_TRAP(p, "combine", "combine input has %lld rows, fewer than total_recv %lld",
                        static_cast<long long>(p.input_rows), static_cast<long long>(total));
  }
  __syncthreads();

  // Every received row back to its source's slot [me][t]: this node directly, other
  // nodes staged and written by the proxy.
  const bool with_weights = p.out_weights != nullptr;
  for (int64_t i = warp; i < total; i += nwarps) {
    const int s = static_cast<int>(p.src_pos[i] / M);
    const int64_t t = p.src_pos[i] % M;
    const char* row = p.input + i * p.input_row_stride;
    const size_t slot = static_cast<size_t>(me) * M + t;
    char* b = p.block;
    if (lane == 0) atomicAdd(&cnt[kAlgoToken], static_cast<unsigned long long>(row_bytes));
    if (SameNode(p, s)) {
      CopyBytes(dev::Ptr(p.ctx, b + p.l.comb_tokens + slot * Hc, s), row, row_bytes, lane, 32);
      if (with_weights) {
        CopyBytes(dev::Ptr(p.ctx, b + p.l.comb_weights + slot * K * 4, s),
                  p.combine_weights + i * K, K * 4, lane, 32);
      }
      continue;
    }
    CopyBytes(b + p.l.cstage_tokens + i * Hc, row, row_bytes, lane, 32);
    if (with_weights) {
      CopyBytes(b + p.l.cstage_weights + i * K * 4, p.combine_weights + i * K, K * 4, lane, 32);
    }
    __threadfence_system();
    __syncwarp();
    if (lane == 0) {
      PushRemote(p, s, p.l.comb_tokens + slot * Hc, p.l.cstage_tokens + i * Hc, row_bytes,
               kLinkToken, cnt);
      if (with_weights) {
        PushRemote(p, s, p.l.comb_weights + slot * K * 4, p.l.cstage_weights + i * K * 4, K * 4,
                   kLinkMeta, cnt);
      }
      atomicAdd(&cnt[kPhysicalToken], static_cast<unsigned long long>(row_bytes));
      atomicAdd(&cnt[kPhysicalRows], 1ull);
    }
    __syncwarp();
  }
  __threadfence_system();
  __syncthreads();
  if (tid < W) PostSignal(p, tid, p.l.comb_done + static_cast<size_t>(me) * 8, p.call, cnt);
  if (tid < W) {
    WaitWord(p, p.l.comb_done + static_cast<size_t>(tid) * 8, p.call, tid, "combine",
             "combine rows", 0);
  }
  __syncthreads();

  // My tokens: the rows of D(t) in ascending pe order, fp32, one rounding
  // (CombineTokenRow, CombineTokenWeights).
  const CombineDtype dtype = static_cast<CombineDtype>(p.dtype);
  const int elem = static_cast<int>(CombineElementBytes(dtype));
  for (int64_t t = warp; t < p.num_tokens; t += nwarps) {
    const uint8_t* ranks = p.token_ranks + t * W;
    uint32_t mask = 0;
    for (int d = 0; d < W; ++d) mask |= static_cast<uint32_t>(ranks[d] != 0) << d;
    const int parts = __popc(mask);
    char* out = p.out + t * row_bytes;
    auto row_of = [&](int d) -> const char* {
      return p.block + p.l.comb_tokens + (static_cast<size_t>(d) * M + t) * Hc;
    };
    if (parts == 0) {
      for (int64_t h = lane; h < row_bytes; h += 32) out[h] = 0;
    } else if (CopiesSinglePart(parts, p.fp8_cast)) {
      const char* row = row_of(__ffs(mask) - 1);
      for (int64_t h = lane; h < p.hidden_dim; h += 32) CopyElement(out, row, h, elem);
    } else {
      for (int64_t h = lane; h < p.hidden_dim; h += 32) {
        float acc = kSumStart;
        for (uint32_t m = mask; m != 0; m &= m - 1) {
          acc += CombineElementValue(row_of(__ffs(m) - 1), h, dtype, p.fp8_cast);
        }
        StoreElement(out, h, dtype, acc);
      }
    }
    if (!with_weights) continue;
    auto weights_of = [&](int d) -> const float* {
      return reinterpret_cast<const float*>(p.block + p.l.comb_weights) +
             (static_cast<size_t>(d) * M + t) * K;
    };
    for (int j = lane; j < K; j += 32) {
      float acc = parts == 0 ? 0.0f : parts == 1 ? weights_of(__ffs(mask) - 1)[j] : kSumStart;
      for (uint32_t m = parts > 1 ? mask : 0u; m != 0; m &= m - 1) acc += weights_of(__ffs(m) - 1)[j];
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

void LoadKernels() {
  cudaFuncAttributes attr;
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, FlatDispatchKernel));
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, FlatCombineKernel));
}

void LaunchFlatDispatch(const Params& p, int threads, uintptr_t stream) {
  FlatDispatchKernel<<<1, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchFlatCombine(const Params& p, int threads, uintptr_t stream) {
  FlatCombineKernel<<<1, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::internode
