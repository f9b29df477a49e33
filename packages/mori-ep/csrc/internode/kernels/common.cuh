// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// What the inter-node kernels (flat.cu: InterNode; hier.cu: InterNodeV1, V1LL) share: the
// bounded waits and their traps, signals and proxy writes, the byte counters, the
// routing and the count exchange (the steps of InterNodeCpu::Dispatch before the rows
// move). Internal linkage: each kernel file gets its own copy (no -rdc).
//
// Pes of this node: load/store through the heap's peer mappings, then a release store
// of the signal word. Pes of other nodes: the payload is staged in this pe's block and
// pushed to the proxy as a write command, and the signal word follows as an add on the
// same queue (the proxy applies it after the writes before it to that pe). Every wait
// is bounded and traps naming this rank and node, the peer and its node, and the
// stage; a failed proxy's error is printed with it (which pe and node it lost).
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

// The most threads one block of `kernel` takes, in whole warps: its registers decide
// (the V1LL dispatch uses ~240 per thread, so 8 warps), while a caller may ask for up
// to 32 warps. Each launch function keeps the value of its kernel in a static.
template <typename Kernel>
int MostThreads(Kernel kernel) {
  cudaFuncAttributes attr;
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return attr.maxThreadsPerBlock / 32 * 32;
}
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
#define MORI_INTERNODE_TRAP(p, op, fmt, ...)                                              \
  do {                                                                                    \
    if (FirstReport()) {                                                                  \
      printf("mori.ep %s %s (call %llu) on rank %d: " fmt " [block %d thread %d]\n",      \
             KindName((p).kind), op, static_cast<unsigned long long>((p).call), (p).rank, \
             __VA_ARGS__, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));   \
      dev::TrapReported();                                                                \
    }                                                                                     \
    dev::TrapAfterReport();                                                               \
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

// A kernel's first step: its call's number from the block's DeviceState, read by
// every thread before thread 0 advances it (one block per launch, the op's launches
// in stream order: the next kernel reads it advanced). A graph's replays so take new
// numbers, and V1LL's dispatch learns whether a dispatch came right before it.
__device__ void BeginCall(Params& p, bool dispatch) {
  DeviceState* st = reinterpret_cast<DeviceState*>(p.block + p.l.state);
  const uint64_t call = (dispatch ? st->dispatch_calls : st->combine_calls) + 1;
  const bool after_dispatch = st->last_dispatch != 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (dispatch) {
      st->dispatch_calls = call;
    } else {
      st->combine_calls = call;
    }
    st->last_dispatch = dispatch ? 1 : 0;
  }
  p.call = call;
  p.finish_previous =
      dispatch && p.kind == static_cast<int>(InterNodeKind::kHierLL) && after_dispatch;
}

__device__ void StoreCounters(const Params& p, int which, const unsigned long long* cnt) {
  uint64_t* out = reinterpret_cast<uint64_t*>(p.block + p.l.counters) + which * kCounterStride;
  for (int i = 0; i < kCounters; ++i) out[i] = cnt[i];
}

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

// Element h of a row of a combine dtype as bits, its value, and a value rounded to it
// (the CPU's CombineTokenRow, one element at a time).
__device__ __forceinline__ uint32_t LoadBits(const char* row, int64_t h, int bytes) {
  if (bytes == 2) return reinterpret_cast<const uint16_t*>(row)[h];
  if (bytes == 4) return reinterpret_cast<const uint32_t*>(row)[h];
  return reinterpret_cast<const uint8_t*>(row)[h];
}

__device__ __forceinline__ float BitsValue(uint32_t bits, CombineDtype dtype) {
  switch (dtype) {
    case CombineDtype::kBFloat16:
      return Bf16BitsToFloat(static_cast<uint16_t>(bits));
    case CombineDtype::kFloat8E4M3:
      return Float8E4M3ToFloat(static_cast<uint8_t>(bits));
    default:
      return BitsFloat(bits);
  }
}

__device__ __forceinline__ uint32_t RoundBits(float v, CombineDtype dtype) {
  switch (dtype) {
    case CombineDtype::kBFloat16:
      return FloatToBf16Bits(v);
    case CombineDtype::kFloat8E4M3:
      return FloatToFloat8E4M3(v);
    default:
      return FloatBits(v);
  }
}

__device__ __forceinline__ void StoreBits(char* out, int64_t h, int bytes, uint32_t bits) {
  if (bytes == 2) {
    reinterpret_cast<uint16_t*>(out)[h] = static_cast<uint16_t>(bits);
  } else if (bytes == 4) {
    reinterpret_cast<uint32_t*>(out)[h] = bits;
  } else {
    reinterpret_cast<uint8_t*>(out)[h] = static_cast<uint8_t>(bits);
  }
}

// ---------------------------------------------------------- routing and counts

// A dispatch kernel's shared state.
struct DispatchShared {
  unsigned long long cnt[kCounters];
  int64_t base[kMaxInterNodeWorld];    // my first row at pe d
  int32_t counts[kMaxInterNodeWorld];  // my rows to pe d
  int bad;                             // first bad (token * (K + 1) + slot), INT_MAX: none
  int over;                            // V1LL: the first pe past its slots, -1: none
};

// The end of a dispatch: every thread's stores released, this pe's done word posted to
// every pe, every pe's awaited (a pe leaves once every pe has written, and forwarded,
// every row of the call); then the proxy's queue drained (the staging may be rewritten
// by the next call) and the call's counters stored.
__device__ void FinishDispatch(const Params& p, DispatchShared& sh) {
  const int tid = threadIdx.x, W = p.world_size, me = p.rank;
  __threadfence_system();
  __syncthreads();
  if (tid < W) PostSignal(p, tid, p.l.dispatch_done + static_cast<size_t>(me) * 8, p.call, sh.cnt);
  if (tid < W) {
    WaitWord(p, p.l.dispatch_done + static_cast<size_t>(tid) * 8, p.call, tid, "dispatch",
             "rows written", 0);
  }
  __syncthreads();
  if (tid == 0) {
    pdev::Quiet(p.queue);
    StoreCounters(p, 0, sh.cnt);
  }
}

// Routing (RouteTokens): token_ranks, each token's row index among my rows to d in
// dest_row, my counts to each pe. True when this pe rejects the call (a host rejection,
// or a bad expert id / routing mask: sh.bad).
__device__ bool Route(const Params& p, DispatchShared& sh) {
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, K = p.top_k;
  const int64_t n = p.reject ? 0 : p.num_tokens;
  const int num_experts = p.num_experts_per_rank * W;
  if (tid < kCounters) sh.cnt[tid] = 0;
  if (tid == 0) sh.bad = INT_MAX;
  __syncthreads();
  uint8_t* token_ranks = reinterpret_cast<uint8_t*>(p.block + p.l.token_ranks);
  int32_t* dest_row = reinterpret_cast<int32_t*>(p.block + p.l.dest_row);

  // Every token's destination pes (RouteTokens), expert ids checked.
  for (int64_t t = tid; t < n; t += nthreads) {
    uint32_t mask = 0;
    if (p.rank_masks != nullptr) {
      mask = p.rank_masks[t];
      if (W < 32 && (mask >> W)) atomicMin(&sh.bad, static_cast<int>(t * (K + 1) + K));
    } else {
      for (int j = 0; j < K; ++j) {
        const int32_t e = p.indices[t * K + j];
        if (e == -1) continue;
        if (e < 0 || e >= num_experts) {
          atomicMin(&sh.bad, static_cast<int>(t * (K + 1) + j));
          continue;
        }
        mask |= 1u << ExpertRank(e, p.num_experts_per_rank);
      }
    }
    for (int d = 0; d < W; ++d) token_ranks[t * W + d] = (mask >> d) & 1u;
  }
  __syncthreads();
  const bool rejecting = p.reject || sh.bad != INT_MAX;
  // Each token's row index among my rows to d (token order), and my count to d.
  for (int d = warp; d < W; d += nwarps) {
    int64_t j = 0;
    for (int64_t t0 = 0; t0 < n && !rejecting; t0 += 32) {
      const int64_t t = t0 + lane;
      const bool to_d = t < n && token_ranks[t * W + d] != 0;
      const unsigned ballot = __ballot_sync(0xffffffffu, to_d);
      if (t < n)
        dest_row[t * W + d] =
            to_d ? static_cast<int32_t>(j + __popc(ballot & ((1u << lane) - 1u))) : -1;
      j += __popc(ballot);
    }
    if (lane == 0) sh.counts[d] = static_cast<int32_t>(j);
  }
  __syncthreads();
  return rejecting;
}

// A bad expert id or routing mask of this pe (sh.bad), after its rejection was posted:
// thread 0 prints it, every thread traps.
__device__ void TrapBadInput(const Params& p, DispatchShared& sh) {
  const int K = p.top_k, W = p.world_size;
  if (threadIdx.x == 0) {
    const int t = sh.bad / (K + 1), j = sh.bad % (K + 1);
    if (j == K) {
      MORI_INTERNODE_TRAP(p, "dispatch",
                          "routing handle sends token %d to rank mask %u, beyond world_size %d", t,
                          p.rank_masks[t], W);
    }
    MORI_INTERNODE_TRAP(p, "dispatch", "expert id %d out of range [-1, %d) at token %d slot %d",
                        p.indices[t * K + j], p.num_experts_per_rank * W, t, j);
  }
  dev::TrapAfterReport();
}

// The count exchange (PostCounts, WaitCounts and the checks of InterNodeCpu::Dispatch:
// a rejection, a dtype difference or a pe over its receive capacity traps on every pe;
// this pe's bad input posts a rejection, then traps). Fills sh.base and total_recv.
// False: a host rejection was posted; the call ends.
__device__ bool RouteAndExchange(const Params& p, DispatchShared& sh) {
  const bool rejecting = Route(p, sh);
  const int tid = threadIdx.x;
  const int W = p.world_size, me = p.rank;

  // The count exchange: my row of count words in my block, then to every pe (this
  // node: a release per word; another node: one write and the last word's signal).
  uint64_t* words = reinterpret_cast<uint64_t*>(p.block + p.l.count_words);
  const size_t my_row = p.l.count_words + static_cast<size_t>(me) * W * 8;
  if (tid < W) {
    const uint64_t c = rejecting ? kRejectedCount : static_cast<uint64_t>(sh.counts[tid]);
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
      PushRemote(p, pe, my_row, my_row, static_cast<uint64_t>(W - 1) * 8, kLinkMeta, sh.cnt);
      PostSignal(p, pe, my_row + (W - 1) * 8, row[W - 1], sh.cnt);
    }
  }
  __syncthreads();
  if (rejecting) {
    if (tid == 0) {
      pdev::Quiet(p.queue);  // the rejection reached every pe
      StoreCounters(p, 0, sh.cnt);
    }
    if (p.reject) return false;
    __syncthreads();
    TrapBadInput(p, sh);
  }

  if (tid < W) {
    WaitWord(p, p.l.count_words + (static_cast<size_t>(tid) * W + W - 1) * 8, EpochFloor(p.call),
             tid, "dispatch", "count words", kCountBits);
  }
  __syncthreads();
  if (tid == 0) {
    int rejected_by = -1;
    int64_t rows_to[kMaxInterNodeWorld] = {};  // rows to each pe
    for (int s = 0; s < W; ++s) {
      for (int d = 0; d < W; ++d) {
        const uint64_t w = dev::LoadAcquire(words + static_cast<size_t>(s) * W + d);
        if (EpochOf(w) != (p.call & kEpochMask)) {
          MORI_INTERNODE_TRAP(p, "dispatch", "count word from pe %d has epoch %llu, expected %llu",
                              s, static_cast<unsigned long long>(EpochOf(w)),
                              static_cast<unsigned long long>(p.call));
        }
        if (CountOf(w) == kRejectedCount && rejected_by < 0) rejected_by = s;
        rows_to[d] += static_cast<int64_t>(CountOf(w));
      }
    }
    bool over = false;  // a pe over its receive capacity
    for (int d = 0; d < W; ++d) over = over || rows_to[d] > p.recv_capacity;
    // A call every pe fails because of every pe's words (a dtype difference, a pe over
    // its receive capacity): this pe's count words still in the proxy's queue reach the
    // other pes before the trap ends this context (and soon the process whose thread
    // runs the proxy), so every pe fails naming the same cause, not a lost peer. Not
    // for a rejection: the rejecting pe waits for nobody's words (it may be gone).
    bool every = rejected_by < 0 && over;
    for (int s = 1; s < W && rejected_by < 0 && !every; ++s) {
      every = RowTagOf(words[static_cast<size_t>(s) * W]) != RowTagOf(words[0]);
    }
    if (every) pdev::Quiet(p.queue);
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
        MORI_INTERNODE_TRAP(
            p, "dispatch",
            "dispatch token dtype differs between ranks: rank 0 passes %s and "
            "rank %d passes %s (every rank must pass the same dtype); no data moved",
            DtypeTagName(first), s, DtypeTagName(tag));
      }
    }
    int64_t total = 0;
    for (int d = 0; d < W; ++d) {
      const int64_t rows = rows_to[d];
      int64_t before = 0;  // rows of lower pes to d: where mine start there
      for (int s = 0; s < me; ++s) {
        before += static_cast<int64_t>(CountOf(words[static_cast<size_t>(s) * W + d]));
      }
      sh.base[d] = before;
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

  return true;
}

// ------------------------------------------------------------- combine entry

// A combine kernel's shared state.
struct CombineShared {
  unsigned long long cnt[kCounters];
  uint64_t votes[kMaxInterNodeWorld];
};

// The entry vote (InterNodeCpu::Vote): this pe's combine word to every pe, then every
// pe's; a rejection, a dtype difference or a weights difference (one pe combines
// weights, another not: a gateway forms partial weights only for its own call's) traps
// on every pe before any row moves, as does a combine input shorter than total_recv.
// False: a host rejection was posted.
__device__ bool CombineEntry(const Params& p, CombineShared& sh) {
  const int tid = threadIdx.x;
  const int W = p.world_size, me = p.rank;
  unsigned long long* cnt = sh.cnt;
  uint64_t* votes = sh.votes;
  if (tid < kCounters) cnt[tid] = 0;
  __syncthreads();

  // The entry vote: every pe's combine word (rejection, dtype, weights) before any row
  // moves.
  const bool weights = !p.reject && p.out_weights != nullptr;
  if (tid < W) {
    PostSignal(p, tid, p.l.comb_vote + static_cast<size_t>(me) * 8,
               CombineWord(p.call, p.reject ? 0 : p.combine_tag, p.reject, weights), cnt);
  }
  __syncthreads();
  if (p.reject) {
    if (tid == 0) {
      pdev::Quiet(p.queue);
      StoreCounters(p, 1, cnt);
    }
    return false;
  }
  if (tid < W) {
    votes[tid] = WaitWord(p, p.l.comb_vote + static_cast<size_t>(tid) * 8, CombineFloor(p.call),
                          tid, "combine", "combine entry", kCombineEpochShift);
  }
  __syncthreads();
  if (tid == 0) {
    // A combine every pe fails because of every pe's vote (a dtype or weights
    // difference, no rejection): this pe's vote still in the proxy's queue reaches the
    // other pes before the trap (RouteAndExchange says why).
    bool rejected = false, every = false;
    for (int d = 0; d < W; ++d) {
      rejected = rejected || (votes[d] & 1);
      every =
          every || CombineTagOf(votes[d]) != p.combine_tag || CombineWeightsOf(votes[d]) != weights;
    }
    if (every && !rejected) pdev::Quiet(p.queue);
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
    for (int d = 0; d < W; ++d) {
      if (CombineWeightsOf(votes[d]) != weights) {
        MORI_INTERNODE_TRAP(p, "combine",
                            "combine weights differ between ranks: rank %d passes %s, this rank "
                            "passes %s (every rank must pass weights, or every rank None); "
                            "outputs not written",
                            d, CombineWeightsName(!weights), CombineWeightsName(weights));
      }
    }
  }
  const int64_t total = *p.total_recv;
  if (tid == 0 && total > p.input_rows) {
    MORI_INTERNODE_TRAP(p, "combine", "combine input has %lld rows, fewer than total_recv %lld",
                        static_cast<long long>(p.input_rows), static_cast<long long>(total));
  }
  __syncthreads();
  return true;
}

}  // namespace

}  // namespace mori::ep::internode
