// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The dispatch kernels of the intra-node protocol (intranode/protocol.hpp, README "The
// intra-node protocol"), step for step IntraNodeCpu::Dispatch (intranode/cpu.cpp):
//
// dispatch (one kernel, every block co-resident; static below
// MORI_EP_DISPATCH_DYNAMIC_TOKENS tokens, dynamic from there up):
//   1. static: every block routes all tokens (rank masks, expert id check) and counts,
//      per destination, all tokens and those before its own chunk of tokens;
//      dynamic: every block routes its own chunk and publishes its counts (scratch);
//   2. warp 0 of block 0 posts this pe's count row (dynamic: the sum of the blocks'
//      counts), tagged with the epoch, into every pe (SignalSet, release.sys); warp 0
//      of every block waits for all W x W words of the epoch (WaitUntil,
//      acquire.sys) and checks for rejections (dynamic: warp 1 sums the counts of
//      the blocks before its own);
//   3. each block scans its chunk tile by tile (ballots per destination) to give
//      every (token, destination) its row base(me, d) + prefix and posts the first
//      row of every token group to each pe (recv_group_row); static: then its warps
//      move the chunk's rows; dynamic: it publishes the rows (scratch token_rows),
//      and once every chunk is published each warp takes (token, segment) items from
//      a grid-wide counter. Rows move in 4 KiB segments: one load of each segment
//      from the input, a store to every destination (16-byte words),
//      weights/indices/scales/src_pos staged together;
//   4. Quiet + a grid-completion counter: the last block signals dispatch_done to
//      every pe, waits for every pe's, resets the item counter, advances the epoch.

#include "intranode/kernels/device.cuh"

namespace mori::ep::intranode {

namespace {

__device__ __forceinline__ unsigned LaneMaskLt() {
  unsigned m;
  asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// Posts a rejected count row for `epoch` to every pe (lanes of the calling
// threads share the W x W stores); used by the id check and by RejectDispatch.
__device__ void PostRejectedCounts(const Common& c, uint64_t epoch, unsigned tid,
                                   unsigned nthreads) {
  uint64_t* row = At<uint64_t>(c, c.layout.count_words) + static_cast<size_t>(c.me) * c.world;
  for (unsigned i = tid; i < static_cast<unsigned>(c.world * c.world); i += nthreads) {
    dev::SignalSet(c.ctx, &row[i % c.world], CountWord(epoch, kRejectedCount),
                   static_cast<int>(i / c.world));
  }
}

// The cold branch of RankMask: names the first bad id of token t, rejects the epoch on every
// pe (so peers fail fast instead of timing out) and traps.
__device__ __forceinline__ void ReportBadExpert(const DispatchParams& p, int64_t t,
                                                uint64_t epoch) {
  const int32_t* row = p.indices + t * p.c.top_k;
  for (int j = 0; j < p.c.top_k; ++j) {
    const int32_t e = row[j];
    if (e < -1 || e >= p.num_experts) {
      printf(
          "mori.ep dispatch on rank %d: expert id %d out of range [-1, %d) at token %lld slot "
          "%d\n",
          p.c.me, e, p.num_experts, static_cast<long long>(t), j);
      dev::TrapReported();
      PostRejectedCounts(p.c, epoch, 0, 1);
      dev::Trap();
    }
  }
}

// The set of pes token t goes to, as a bit mask (a replay's, or from its ids); any id
// outside [-1, num_experts) reports and traps. The ids load without a branch per id (int4 when
// aligned).
__device__ __forceinline__ uint32_t RankMask(const DispatchParams& p, int64_t t, uint64_t epoch) {
  if (p.rank_masks != nullptr) return __ldg(p.rank_masks + t);  // a replay: bits < W (host)
  const int K = p.c.top_k;
  const int32_t* row = p.indices + t * K;
  uint32_t mask = 0;
  bool bad = false;
  auto add = [&](int32_t e) {
    const bool ok = e >= 0 && e < p.num_experts;
    bad |= !ok && e != -1;
    mask |= ok ? 1u << ExpertRank(e, p.experts_per_rank) : 0u;
  };
  if (p.indices_vec) {
    const int4* v = reinterpret_cast<const int4*>(row);
    for (int j = 0; j < K / 4; ++j) {
      const int4 q = __ldg(v + j);
      add(q.x);
      add(q.y);
      add(q.z);
      add(q.w);
    }
  } else {
    for (int j = 0; j < K; ++j) add(__ldg(row + j));
  }
  if (bad) ReportBadExpert(p, t, epoch);
  return mask;
}

// Every rank ends its launch on a dispatch whose ranks pass different token dtypes
// (count words whose row tags differ from this pe's `mine`): every pe sees every pe's
// words, so every pe finds it; pe 0 traps at once, the others after TrapRejectedBy's
// pause; the first detecting thread prints. Not inlined, and given scalars only, so
// that the kernels' hot paths keep their registers (a `const Common&` would put the
// kernel parameters in local memory).
__device__ __noinline__ void TrapRowTags(int me, int from, uint32_t theirs, uint32_t mine,
                                         uint64_t timeout_ns) {
  if (FirstTrapReport()) {
    printf(
        "mori.ep dispatch on rank %d: rank %d passes %s tokens, this rank %s (every rank must "
        "pass the same dtype)\n",
        me, from, DtypeTagName(theirs), DtypeTagName(mine));
    dev::TrapReported();
  }
  if (me != 0) PauseBeforePeerTrap(timeout_ns);
  dev::TrapAfterReport();
}

// Warp 0: waits for every count word of `epoch` and stores the counts in
// `counts` (W x W). A rejection, an unexpected epoch or a row tag other than `tag`
// traps with a message.
__device__ void WaitCountWords(const Common& c, uint64_t epoch, unsigned lane, uint32_t* counts,
                               uint32_t tag) {
  const uint64_t* words = At<uint64_t>(c, c.layout.count_words);
  for (unsigned i = lane; i < static_cast<unsigned>(c.world * c.world); i += 32) {
    const uint64_t w =
        WaitPeerWord(&words[i], EpochFloor(epoch), c.timeout_ns, c.me,
                     static_cast<int>(i / c.world), "dispatch", epoch, "count words", kCountBits);
    if (EpochOf(w) != (epoch & kEpochMask)) {
      printf(
          "mori.ep dispatch on rank %d: count word from rank %u has epoch %llu, expected "
          "%llu\n",
          c.me, i / c.world, static_cast<unsigned long long>(EpochOf(w)),
          static_cast<unsigned long long>(epoch));
      dev::TrapReported();
      dev::Trap();
    }
    if (CountOf(w) == kRejectedCount) TrapRejectedBy(c, static_cast<int>(i / c.world), "dispatch");
    if (RowTagOf(w) != tag) {
      // First this pe's count words under its own tag, into every pe (block 0 may not
      // have posted them yet), so that no peer times out instead of naming the
      // dtypes; a peer traps on the tag before it uses the counts.
      uint64_t* mine = At<uint64_t>(c, c.layout.count_words) + c.me * c.world;
      for (int pe = 0; pe < c.world; ++pe) {
        for (int d = 0; d < c.world; ++d)
          dev::SignalSet(c.ctx, &mine[d], CountWord(epoch, 0, tag), pe);
      }
      __threadfence_system();
      TrapRowTags(c.me, static_cast<int>(i / c.world), RowTagOf(w), tag, c.timeout_ns);
    }
    counts[i] = static_cast<uint32_t>(CountOf(w));
  }
}

// A receive cap (MORI's max_total_recv_tokens) that the count matrix exceeds at pe
// d: every pe sees the same matrix, so every pe ends its launch here, before any row
// moves (IntraNodeCpu fails the same call); pe d at once, the others after
// TrapRejectedBy's pause (two processes trapping together on one GPU left a launch
// hanging). Not inlined, and given scalars only, so that the kernels' hot paths keep
// their registers.
__device__ __noinline__ void TrapOverCapacity(int me, int world, int d, const uint32_t* counts,
                                              int64_t capacity, uint64_t timeout_ns) {
  if (FirstTrapReport()) {
    int64_t rows = 0;
    for (int s = 0; s < world; ++s) rows += counts[s * world + d];
    printf(
        "mori.ep dispatch on rank %d: dispatch would deliver %lld tokens to rank %d, more than "
        "the receive capacity of %lld rows (max_total_recv_tokens)\n",
        me, static_cast<long long>(rows), d, static_cast<long long>(capacity));
    dev::TrapReported();
  }
  if (d != me) PauseBeforePeerTrap(timeout_ns);
  dev::TrapAfterReport();
}

// Row of the current token at destination d, held by lane d (< 0: not sent there).
__device__ __forceinline__ int32_t RowAt(int32_t lane_row, int d) {
  return __shfl_sync(kFull, lane_row, d);
}

// Weights, indices, scales and src_pos of token `tok` into its row at every
// destination d (lane d holds that row in lane_row; < 0: not sent there). Staged:
// every lane loads its words of all four arrays first, then stores them to each
// destination.
__device__ __forceinline__ void PutTokenMeta(const DispatchParams& p, int64_t tok, int32_t lane_row,
                                             unsigned lane) {
  const Common& c = p.c;
  const int W = c.world, K = c.top_k;
  const int64_t Sb = p.scale_bytes;
  const int32_t src_pos = EncodeSrcPos(c.me, tok, c.max_tokens);
  if (!p.meta_staged) {
    for (int d = 0; d < W; ++d) {
      const int32_t r = RowAt(lane_row, d);
      if (r < 0) continue;
      dev::PutWarp_nbi(c.ctx, At<float>(c, c.layout.recv_weights) + static_cast<int64_t>(r) * K,
                       p.weights + tok * K, K * sizeof(float), d);
      if (Sb > 0) {
        dev::PutWarp_nbi(c.ctx, At<char>(c, c.layout.recv_scales) + r * Sb, p.scales + tok * Sb, Sb,
                         d);
      }
      dev::PutWarp_nbi(c.ctx, At<int32_t>(c, c.layout.recv_indices) + static_cast<int64_t>(r) * K,
                       p.indices + tok * K, K * sizeof(int32_t), d);
      if (lane == 0) *PeerAt<int32_t>(c, c.layout.recv_src_pos + r * 4, d) = src_pos;
    }
    return;
  }
  const int sw = static_cast<int>(Sb / 4);
  uint32_t v[kMetaWords];
#pragma unroll
  for (int k = 0; k < kMetaWords; ++k) {
    const int w = static_cast<int>(lane) + 32 * k;
    uint32_t x = 0;
    if (w < K) {
      x = __float_as_uint(__ldg(p.weights + tok * K + w));
    } else if (w < 2 * K) {
      x = static_cast<uint32_t>(__ldg(p.indices + tok * K + (w - K)));
    } else if (w < 2 * K + sw) {
      x = __ldg(reinterpret_cast<const uint32_t*>(p.scales + tok * Sb) + (w - 2 * K));
    } else {
      x = static_cast<uint32_t>(src_pos);
    }
    v[k] = x;
  }
  for (int d = 0; d < W; ++d) {
    const int64_t r = RowAt(lane_row, d);
    if (r < 0) continue;
#pragma unroll
    for (int k = 0; k < kMetaWords; ++k) {
      const int w = static_cast<int>(lane) + 32 * k;
      size_t off;
      if (w < K) {
        off = c.layout.recv_weights + (r * K + w) * 4;
      } else if (w < 2 * K) {
        off = c.layout.recv_indices + (r * K + (w - K)) * 4;
      } else if (w < 2 * K + sw) {
        off = c.layout.recv_scales + r * Sb + (w - 2 * K) * 4;
      } else if (w == 2 * K + sw) {
        off = c.layout.recv_src_pos + r * 4;
      } else {
        continue;
      }
      *PeerAt<uint32_t>(c, off, d) = v[k];
    }
  }
}

// Segment `seg` of token `tok`'s row (and, with segment 0, its metadata) into its
// row at every destination (lane d holds the row at d, as for PutTokenMeta).
template <int kSeg>
__device__ __forceinline__ void PutTokenSegment(const DispatchParams& p, int64_t tok, int seg,
                                                int32_t lane_row, unsigned lane) {
  const Common& c = p.c;
  const int W = c.world;
  if (p.vec) {
    const int64_t nwords = p.row_bytes / 16;
    const int4* src = reinterpret_cast<const int4*>(p.tokens + tok * p.row_bytes);
    const int64_t w0 = static_cast<int64_t>(seg) * kSeg * 32 + lane;
    int4 v[kSeg];
#pragma unroll
    for (int k = 0; k < kSeg; ++k) {
      const int64_t w = w0 + k * 32;
      v[k] = w < nwords ? __ldg(src + w) : make_int4(0, 0, 0, 0);
    }
    for (int d = 0; d < W; ++d) {
      const int64_t r = RowAt(lane_row, d);
      if (r < 0) continue;
      int4* dst = PeerAt<int4>(c, c.layout.recv_tokens + r * p.hidden_bytes, d);
#pragma unroll
      for (int k = 0; k < kSeg; ++k) {
        const int64_t w = w0 + k * 32;
        if (w < nwords) dst[w] = v[k];
      }
    }
  } else {
    char* recv_tokens = At<char>(c, c.layout.recv_tokens);
    for (int d = 0; d < W; ++d) {
      const int64_t r = RowAt(lane_row, d);
      if (r < 0) continue;
      dev::PutWarp_nbi(c.ctx, recv_tokens + r * p.hidden_bytes, p.tokens + tok * p.row_bytes,
                       p.row_bytes, d);
    }
  }
  if (seg == 0) PutTokenMeta(p, tok, lane_row, lane);
}

// Block 0, warp 0: posts this pe's count row (totals[d] tokens to pe d, under the
// rows' dtype `tag`) into every pe.
__device__ __forceinline__ void PostCountRow(const Common& c, uint64_t epoch, unsigned lane,
                                             const uint32_t* totals, uint32_t tag) {
  uint64_t* count_words = At<uint64_t>(c, c.layout.count_words);
  const int W = c.world;
  for (unsigned i = lane; i < static_cast<unsigned>(W * W); i += 32) {
    const int pe = static_cast<int>(i / W), d = static_cast<int>(i % W);
    dev::SignalSet(c.ctx, &count_words[c.me * W + d], CountWord(epoch, totals[d], tag), pe);
  }
}

// Once every pe's counts are in `counts`: base[d] = where my rows start at pe d,
// run[d] = where the rows of this block's chunk start (before[d] earlier rows of
// mine), and (block 0) total_recv.
__device__ __forceinline__ void SetRowBases(const Common& c, const uint32_t* counts,
                                            const uint32_t* before, uint32_t* base, uint32_t* run) {
  const unsigned tid = threadIdx.x;
  const int W = c.world;
  if (tid < static_cast<unsigned>(W)) {
    uint32_t b = 0;
    for (int s = 0; s < c.me; ++s) b += counts[s * W + tid];
    base[tid] = b;
    run[tid] = b + before[tid];
  }
  if (blockIdx.x == 0 && tid == 0) {
    int32_t recv = 0;
    for (int s = 0; s < W; ++s) recv += static_cast<int32_t>(counts[s * W + c.me]);
    *At<int32_t>(c, c.layout.total_recv) = recv;
  }
}

// With a receive cap: *over = the lowest pe that would receive more rows than
// p.recv_capacity (left as it was, kW, when none would); read it after a block barrier.
__device__ __forceinline__ void MarkOverCapacity(const DispatchParams& p, const uint32_t* counts,
                                                 int* over) {
  const unsigned tid = threadIdx.x;
  const int W = p.c.world;
  if (tid < static_cast<unsigned>(W)) {
    int64_t rows = 0;
    for (int s = 0; s < W; ++s) rows += counts[s * W + tid];
    if (rows > p.recv_capacity) atomicMin_block(over, static_cast<int>(tid));
  }
}

// recv_group_row[me][g] on every pe, block 0: groups past my n tokens (and the end
// entry) start at the end of my rows there; the others are posted by the scan.
__device__ __forceinline__ void PostTailGroupRows(const Common& c, int64_t n, const uint32_t* base,
                                                  const uint32_t* counts) {
  if (blockIdx.x != 0) return;
  const int W = c.world;
  const int64_t G = CombineGroups(c.max_tokens);
  const size_t group_row = c.layout.recv_group_row + static_cast<size_t>(c.me) * (G + 1) * 4;
  const int64_t g_lo = (n + kGroupTokens - 1) / kGroupTokens;
  for (int64_t i = threadIdx.x; i < (G + 1 - g_lo) * W; i += blockDim.x) {
    const int d = static_cast<int>(i % W);
    *PeerAt<int32_t>(c, group_row + (g_lo + i / W) * 4, d) =
        static_cast<int32_t>(base[d] + counts[c.me * W + d]);
  }
}

// One tile of the scan: thread i holds token t = tile + i (mask = its pes, 0 past the
// chunk's end hi). Gives every (token, pe) its row run[pe] + the tokens before it in
// the tile, stores it at rows_out[0..W) (-1: not sent), records token_ranks /
// token_self_row, posts the first row of every token group to each pe, then advances
// run past the tile. Two block barriers; s_warp is [warps][kW] scratch.
__device__ __forceinline__ void ScanTile(const Common& c, int64_t t, int64_t hi, uint32_t mask,
                                         uint32_t* run, uint32_t (*s_warp)[kW], int32_t* rows_out) {
  const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  const int W = c.world;
  uint32_t prefix[kW];
#pragma unroll
  for (int d = 0; d < kW; ++d) {
    const unsigned bal = __ballot_sync(kFull, (mask >> d) & 1u);
    prefix[d] = __popc(bal & LaneMaskLt());
    if (lane == 0) s_warp[warp][d] = __popc(bal);
  }
  uint8_t* token_ranks = At<uint8_t>(c, c.layout.token_ranks);
  if (t < hi) {
    for (int d = 0; d < W; ++d) token_ranks[t * W + d] = (mask >> d) & 1u;
  }
  __syncthreads();
  const int64_t G = CombineGroups(c.max_tokens);
  const size_t group_row = c.layout.recv_group_row + static_cast<size_t>(c.me) * (G + 1) * 4;
  const bool group_first = t < hi && t % kGroupTokens == 0;
#pragma unroll
  for (int d = 0; d < kW; ++d) {
    if (d >= W) break;
    uint32_t off = run[d] + prefix[d];
    for (unsigned w = 0; w < warp; ++w) off += s_warp[w][d];
    const bool in = (mask >> d) & 1u;
    if (t < hi) rows_out[d] = in ? static_cast<int32_t>(off) : -1;
    if (group_first) {
      *PeerAt<int32_t>(c, group_row + (t / kGroupTokens) * 4, d) = static_cast<int32_t>(off);
    }
    if (d == c.me && t < hi) {
      At<int32_t>(c, c.layout.token_self_row)[t] = in ? static_cast<int32_t>(off) : -1;
    }
  }
  __syncthreads();
  if (tid < static_cast<unsigned>(W)) {
    uint32_t sum = 0;
    for (unsigned w = 0; w < nwarps; ++w) sum += s_warp[w][tid];
    run[tid] += sum;
  }
}

// Quiet + the grid-completion counter; the last block signals dispatch_done to
// every pe, waits for every pe's, resets `work` (if any) and advances the epoch.
__device__ __forceinline__ void FinishDispatch(const DispatchParams& p, uint64_t epoch,
                                               uint32_t* work) {
  const Common& c = p.c;
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  EpDeviceState* state = State(c);
  Stamp(p.stamps, 4);
  const bool last = FinishBlock(&state->dispatch_blocks_done);
  Stamp(p.stamps, 5);
  if (!last) return;
  uint64_t* done = At<uint64_t>(c, c.layout.dispatch_done);
  if (warp == 0) {
    for (unsigned pe = lane; pe < static_cast<unsigned>(c.world); pe += 32) {
      dev::SignalSet(c.ctx, &done[c.me], epoch, static_cast<int>(pe));
    }
    for (unsigned s = lane; s < static_cast<unsigned>(c.world); s += 32) {
      WaitPeerWord(&done[s], epoch, c.timeout_ns, c.me, static_cast<int>(s), "dispatch", epoch,
                   "rows written", 0);
    }
    __syncwarp();
    if (lane == 0) {
      if (work != nullptr) *work = 0;  // every warp has taken its last item
      state->epoch = epoch;
    }
  }
  Stamp(p.stamps, 6);
}

__device__ __forceinline__ uint64_t LoadRelaxed(const uint64_t* addr) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}

// One warp waits until words[i * kW + d] >= floor for every i in [0, n) and d in
// [0, per): it polls them all with relaxed loads, every load of a round in flight at
// once (an acquire load each would serialise them), then syncs the warp and fences,
// so that what the words' writers released is visible to every lane. With sum != nullptr, lane 0
// gets sum[d] = the sum of CountOf over i. Words are written by blocks of this grid
// (on this GPU); a timeout traps naming `what`.
__device__ void WaitGridWords(const Common& c, const uint64_t* words, unsigned n, int per,
                              uint64_t floor, unsigned lane, uint32_t* sum, const char* what) {
  uint32_t acc[kW];
  const uint64_t start = dev::GlobalTimerNs();
  for (;;) {
    bool ready = true;
#pragma unroll
    for (int d = 0; d < kW; ++d) acc[d] = 0;
#pragma unroll 4
    for (unsigned i = lane; i < n; i += 32) {
#pragma unroll
      for (int d = 0; d < kW; ++d) {
        if (d < per) {
          const uint64_t v = LoadRelaxed(&words[i * kW + d]);
          ready &= v >= floor;
          acc[d] += static_cast<uint32_t>(CountOf(v));
        }
      }
    }
    if (__all_sync(kFull, ready)) break;
    if (c.timeout_ns != 0 && dev::GlobalTimerNs() - start > c.timeout_ns) {
      if (lane == 0) {
        printf("mori.ep dispatch on rank %d, block %d: %s not posted within %llu ns\n", c.me,
               blockIdx.x, what, static_cast<unsigned long long>(c.timeout_ns));
        dev::TrapReported();
      }
      __syncwarp();
      dev::Trap();
    }
  }
  // The warp barrier orders every lane after the lanes that saw each word; then the
  // fence makes it an acquire for all (a vote alone orders no memory).
  __syncwarp();
  __threadfence();
  if (sum == nullptr) return;
#pragma unroll
  for (int d = 0; d < kW; ++d) {
    const uint32_t v = __reduce_add_sync(kFull, acc[d]);
    if (lane == 0) sum[d] = v;
  }
}

// This block's chunk [lo, hi) of n tokens: ceil(n / blocks) each, in block order (the
// last blocks' chunks short or empty).
struct TokenRange {
  int64_t lo, hi;
};
__device__ __forceinline__ TokenRange BlockChunk(int64_t n) {
  const int64_t chunk = (n + gridDim.x - 1) / gridDim.x;
  const int64_t lo = std::min<int64_t>(chunk * blockIdx.x, n);
  return {lo, std::min<int64_t>(lo + chunk, n)};
}

// The static kernel (MORI_EP_DISPATCH_DYNAMIC=0): every block routes every token to
// count those before its chunk, then scans and moves its own chunk.
template <int kThreads, int kSeg, bool kCapped>
__global__ void __launch_bounds__(kThreads) DispatchKernel(DispatchParams p, DispatchScratch) {
  const Common& c = p.c;
  const int W = c.world;
  const unsigned tid = threadIdx.x, nthreads = blockDim.x;
  const unsigned lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const uint64_t epoch = State(c)->epoch + 1;

  __shared__ uint32_t s_total[kW], s_before[kW], s_run[kW], s_base[kW];
  __shared__ uint32_t s_counts[kW * kW];
  __shared__ uint32_t s_warp[kThreads / 32][kW];
  __shared__ int32_t s_rows[kThreads][kW];
  __shared__ int s_over;  // MarkOverCapacity (kCapped)
  if (tid < kW) s_total[tid] = s_before[tid] = 0;
  if (kCapped && tid == 0) s_over = kW;
  __syncthreads();

  // 1. Count: all tokens, and those before this block's chunk.
  const int64_t n = p.num_tokens;
  const auto [lo, hi] = BlockChunk(n);
  Stamp(p.stamps, 0);
  uint32_t total[kW] = {}, before[kW] = {};
  for (int64_t t = tid; t < n; t += nthreads) {
    const uint32_t mask = RankMask(p, t, epoch);
#pragma unroll
    for (int d = 0; d < kW; ++d) {
      const uint32_t in = (mask >> d) & 1u;
      total[d] += in;
      before[d] += t < lo ? in : 0u;
    }
  }
#pragma unroll
  for (int d = 0; d < kW; ++d) {
    const uint32_t tw = __reduce_add_sync(kFull, total[d]);
    const uint32_t bw = __reduce_add_sync(kFull, before[d]);
    if (lane == 0 && d < W) {
      atomicAdd_block(&s_total[d], tw);
      atomicAdd_block(&s_before[d], bw);
    }
  }
  __syncthreads();
  Stamp(p.stamps, 1);

  // 2. Exchange: post my row everywhere (block 0), wait for every row (each block).
  if (blockIdx.x == 0 && warp == 0) PostCountRow(c, epoch, lane, s_total, p.row_tag);
  if (warp == 0) WaitCountWords(c, epoch, lane, s_counts, p.row_tag);
  __syncthreads();
  SetRowBases(c, s_counts, s_before, s_base, s_run);
  if constexpr (kCapped) MarkOverCapacity(p, s_counts, &s_over);
  __syncthreads();
  if constexpr (kCapped) {
    if (s_over < kW) TrapOverCapacity(c.me, W, s_over, s_counts, p.recv_capacity, c.timeout_ns);
  }
  Stamp(p.stamps, 2);
  PostTailGroupRows(c, n, s_base, s_counts);

  // 3. Rows: tiles of `nthreads` tokens of this block's chunk; thread i scans token
  // lo + tile + i, then the warps put the tile's (token, segment) items.
  constexpr int64_t kSegBytes = kSeg * 16 * 32;
  const int nseg = p.vec ? static_cast<int>((p.row_bytes + kSegBytes - 1) / kSegBytes) : 1;
  for (int64_t tile = lo; tile < hi; tile += nthreads) {
    const int64_t t = tile + tid;
    ScanTile(c, t, hi, t < hi ? RankMask(p, t, epoch) : 0u, s_run, s_warp, s_rows[tid]);
    if (tile == lo) Stamp(p.stamps, 3);
    const int64_t items = std::min<int64_t>(nthreads, hi - tile) * nseg;
    for (int64_t item = warp; item < items; item += nwarps) {
      const int64_t i = item / nseg;
      PutTokenSegment<kSeg>(p, tile + i, static_cast<int>(item % nseg),
                            lane < static_cast<unsigned>(W) ? s_rows[i][lane] : -1, lane);
    }
    __syncthreads();  // s_rows is rewritten by the next tile
  }

  // 4. Done.
  FinishDispatch(p, epoch, nullptr);
}

// The dynamic kernel (from MORI_EP_DISPATCH_DYNAMIC_TOKENS tokens up): each block
// routes only its chunk and publishes its counts; block 0 sums them for the
// exchange, every block sums those of the blocks before it; each block scans its
// chunk into token_rows; then, once every chunk is scanned, warps take (token,
// segment) items from one grid-wide counter until none is left, so blocks that get
// more NVLink bandwidth move more rows and the grid finishes together.
template <int kThreads, int kSeg, bool kCapped>
__global__ void __launch_bounds__(kThreads)
    DispatchDynamicKernel(DispatchParams p, DispatchScratch s) {
  const Common& c = p.c;
  const int W = c.world;
  const unsigned tid = threadIdx.x, nthreads = blockDim.x;
  const unsigned lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const uint64_t epoch = State(c)->epoch + 1;

  __shared__ uint32_t s_chunk[kW], s_total[kW], s_before[kW], s_run[kW], s_base[kW];
  __shared__ uint32_t s_counts[kW * kW];
  __shared__ uint32_t s_warp[kThreads / 32][kW];
  __shared__ int s_over;  // MarkOverCapacity (kCapped)
  if (tid < kW) s_chunk[tid] = 0;
  if (kCapped && tid == 0) s_over = kW;
  __syncthreads();

  // 1. Route this block's chunk, count per pe, publish the counts.
  const int64_t n = p.num_tokens;
  const auto [lo, hi] = BlockChunk(n);
  Stamp(p.stamps, 0);
  uint32_t first_mask = 0;  // token lo + tid's pes: the scan's first tile reuses it
  uint32_t count[kW] = {};
  for (int64_t t = lo + tid; t < hi; t += nthreads) {
    const uint32_t mask = RankMask(p, t, epoch);
    if (t == lo + tid) first_mask = mask;
#pragma unroll
    for (int d = 0; d < kW; ++d) count[d] += (mask >> d) & 1u;
  }
#pragma unroll
  for (int d = 0; d < kW; ++d) {
    const uint32_t v = __reduce_add_sync(kFull, count[d]);
    if (lane == 0 && d < W) atomicAdd_block(&s_chunk[d], v);
  }
  __syncthreads();
  if (tid < static_cast<unsigned>(W)) {
    dev::StoreRelease(&s.block_counts[blockIdx.x * kW + tid], CountWord(epoch, s_chunk[tid]));
  }
  Stamp(p.stamps, 1);

  // 2. Block 0 posts the totals over every block; every block learns the rows of
  // the blocks before it (warp 1) and every pe's counts (warp 0).
  if (warp == 0) {
    if (blockIdx.x == 0) {
      WaitGridWords(c, s.block_counts, gridDim.x, W, EpochFloor(epoch), lane, s_total,
                    "block counts");
      __syncwarp();
      PostCountRow(c, epoch, lane, s_total, p.row_tag);
    }
    WaitCountWords(c, epoch, lane, s_counts, p.row_tag);
  }
  if (warp == (nwarps > 1 ? 1u : 0u)) {
    WaitGridWords(c, s.block_counts, blockIdx.x, W, EpochFloor(epoch), lane, s_before,
                  "block counts");
  }
  __syncthreads();
  SetRowBases(c, s_counts, s_before, s_base, s_run);
  if constexpr (kCapped) MarkOverCapacity(p, s_counts, &s_over);
  __syncthreads();
  if constexpr (kCapped) {
    if (s_over < kW) TrapOverCapacity(c.me, W, s_over, s_counts, p.recv_capacity, c.timeout_ns);
  }
  Stamp(p.stamps, 2);
  PostTailGroupRows(c, n, s_base, s_counts);

  // 3. Scan the chunk into token_rows; publish it.
  for (int64_t tile = lo; tile < hi; tile += nthreads) {
    const int64_t t = tile + tid;
    const uint32_t mask = tile == lo ? first_mask : t < hi ? RankMask(p, t, epoch) : 0u;
    ScanTile(c, t, hi, mask, s_run, s_warp, s.token_rows + t * kW);
    __syncthreads();  // s_warp is rewritten by the next tile
  }
  if (tid == 0) {
    __threadfence();
    dev::StoreRelease(&s.chunk_ready[blockIdx.x * kW], epoch);
  }
  Stamp(p.stamps, 3);

  // 4. Items: once every chunk is scanned, take items one at a time, asking for the
  // next while the current one moves.
  constexpr int64_t kSegBytes = kSeg * 16 * 32;
  const int nseg = p.vec ? static_cast<int>((p.row_bytes + kSegBytes - 1) / kSegBytes) : 1;
  const int64_t items = n * nseg;
  if (items > 0) {
    WaitGridWords(c, s.chunk_ready, gridDim.x, 1, epoch, lane, nullptr, "scanned chunks");
  }
  uint32_t ticket = 0;
  if (lane == 0) ticket = atomicAdd(s.work, 1u);
  int64_t item = __shfl_sync(kFull, ticket, 0);
  while (item < items) {
    if (lane == 0) ticket = atomicAdd(s.work, 1u);
    const int64_t t = item / nseg;
    const int32_t lane_row =
        lane < static_cast<unsigned>(W) ? __ldcg(s.token_rows + t * kW + lane) : -1;
    PutTokenSegment<kSeg>(p, t, static_cast<int>(item % nseg), lane_row, lane);
    item = __shfl_sync(kFull, ticket, 0);
  }

  // 5. Done.
  FinishDispatch(p, epoch, s.work);
}

__global__ void RejectDispatchKernel(Common c) {
  EpDeviceState* state = State(c);
  const uint64_t epoch = state->epoch + 1;
  PostRejectedCounts(c, epoch, threadIdx.x, blockDim.x);
  __syncwarp();
  if (threadIdx.x == 0) state->epoch = epoch;
}

// The dispatch kernel for a block of `threads` (kNarrowThreads or kMaxThreads)
// moving kseg-word segments (4 or 8; the 1024-thread build takes 4).
template <bool kCapped>
const void* DispatchKernelOf(int threads, int kseg, bool dynamic) {
  if (threads > kNarrowThreads) {
    return dynamic ? reinterpret_cast<const void*>(DispatchDynamicKernel<kMaxThreads, 4, kCapped>)
                   : reinterpret_cast<const void*>(DispatchKernel<kMaxThreads, 4, kCapped>);
  }
  if (kseg == 4) {
    return dynamic
               ? reinterpret_cast<const void*>(DispatchDynamicKernel<kNarrowThreads, 4, kCapped>)
               : reinterpret_cast<const void*>(DispatchKernel<kNarrowThreads, 4, kCapped>);
  }
  return dynamic ? reinterpret_cast<const void*>(DispatchDynamicKernel<kNarrowThreads, 8, kCapped>)
                 : reinterpret_cast<const void*>(DispatchKernel<kNarrowThreads, 8, kCapped>);
}

const void* DispatchKernelFor(int threads, int kseg, bool dynamic, bool capped) {
  return capped ? DispatchKernelOf<true>(threads, kseg, dynamic)
                : DispatchKernelOf<false>(threads, kseg, dynamic);
}

// The build for blocks of `warps` warps: the 512-thread one (kseg-word segments) up
// to kNarrowThreads, else the 1024-thread one (4).
const void* DispatchKernelForWarps(int warps, int kseg, bool dynamic, bool capped) {
  const bool narrow = warps * 32 <= kNarrowThreads;
  return DispatchKernelFor(narrow ? kNarrowThreads : kMaxThreads, narrow ? kseg : 4, dynamic,
                           capped);
}

}  // namespace

void LaunchDispatch(const DispatchParams& p, const DispatchScratch& scratch, int kseg, bool dynamic,
                    bool capped, LaunchShape launch, uintptr_t stream) {
  void* args[] = {const_cast<DispatchParams*>(&p), const_cast<DispatchScratch*>(&scratch)};
  MORI_CUDA_CHECK(cudaLaunchKernel(
      DispatchKernelForWarps(launch.warp_per_block, kseg, dynamic, capped), dim3(launch.block_num),
      dim3(launch.warp_per_block * 32), args, 0, reinterpret_cast<cudaStream_t>(stream)));
  MORI_CUDA_CHECK(cudaGetLastError());
}

int DispatchBlocksPerSm(int warps, int kseg, bool dynamic, bool capped) {
  int n = 0;
  MORI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, DispatchKernelForWarps(warps, kseg, dynamic, capped), warps * 32, 0));
  return n;
}

void LaunchRejectDispatch(const Common& c, uintptr_t stream) {
  RejectDispatchKernel<<<1, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(c);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::intranode
