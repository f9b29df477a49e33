// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Device helpers shared by the low-latency dispatch and combine kernels (dispatch.cu,
// combine.cu): the view of the op's block, the traps and their messages, the kernel
// variants, the flag waits, the consumed words of a copy-engine op and the rejection
// phase. Internal linkage (an anonymous namespace): every kernel file gets its own
// copy, as before the kernels were split (no -rdc). Addressing the block, the
// peer-trap pause and the grid-completion counter are mori-core's
// (mori/shmem/block_device.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "common/launch_api.hpp"
#include "common/numeric.hpp"
#include "common/peer_wait.cuh"
#include "common/timeline.cuh"
#include "low_latency/kernels/params.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/block_device.cuh"
#include "mori/shmem/device.cuh"

namespace mori::ep::low_latency {

namespace {

namespace dev = mori::shmem::device;
using mori::shmem::Cmp;

constexpr unsigned kFull = 0xFFFFFFFFu;

struct Ctx {
  const LlParams& p;
  __device__ char* Local(size_t offset) const { return dev::At<char>(p, offset); }
  __device__ char* Peer(size_t offset, int pe) const { return dev::PeerAt<char>(p, offset, pe); }
  __device__ LlDeviceState* State() const {
    return reinterpret_cast<LlDeviceState*>(p.block + p.layout.state);
  }
};

// A dispatch rejected by pe `from` over the receive cap (its note): every pe prints
// the same pes and counts. Not inlined, scalars only (as TrapLlFlagDiffers).
__device__ __noinline__ void ReportOverCap(int me, int from, uint64_t count, uint64_t dest,
                                           int64_t slots) {
  printf(
      "mori.ep low-latency dispatch on rank %d: dispatch rejected by rank %d: it routes %llu "
      "tokens to rank %llu, more than the %lld receive slots per source rank "
      "(max_total_recv_tokens)\n",
      me, from, static_cast<unsigned long long>(count), static_cast<unsigned long long>(dest),
      static_cast<long long>(slots));
  dev::TrapReported();
}

// What a pe rejected by pe `from` prints: the over-the-cap note `notes[from]` when it
// carries `call` (notes is null for combine), else that `from` refused its inputs. Not
// inlined, scalars only, so that the receive keeps its registers (as TrapLlFlagDiffers).
__device__ __noinline__ void ReportRejected(int me, int from, const char* what,
                                            const LlOverNote* notes, uint64_t call, int64_t slots) {
  const LlOverNote note = notes != nullptr ? notes[from] : LlOverNote{0, 0};
  if (notes != nullptr && EpochOf(note.word) == (call & kEpochMask)) {
    ReportOverCap(me, from, CountOf(note.word), note.dest, slots);
    return;
  }
  printf(
      "mori.ep low-latency %s on rank %d: rejected by rank %d (its inputs failed "
      "validation; see its error)\n",
      what, me, from);
  dev::TrapReported();
}

// A call rejected by pe `from`: the first thread names it (ReportRejected) and every
// pe but `from` traps after the pause.
__device__ void TrapRejected(const LlParams& p, int from, const char* what, const LlOverNote* notes,
                             uint64_t call) {
  if (from != p.me) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      ReportRejected(p.me, from, what, notes, call, p.recv_slots);
    }
    dev::PauseNs(dev::PeerTrapPauseNs(p.timeout_ns));
  }
  dev::TrapAfterReport();
}

// One kernel per variant: kLlDefault, kLlPartials (LlCombineArgs::pre_reduce
// combines), kLlCopyEngine (the other calls of a copy-engine op) and kLlPartialsCe
// (pre-reduced combines of a copy-engine op), so that no variant's code raises the
// others' register use.
constexpr int kLlDefault = 0, kLlPartials = 1, kLlCopyEngine = 2, kLlPartialsCe = 3;

// Whether a combine of variant kVariant is a copy-engine op's (single-buffered combine
// area with consumed words), and whether it is pre-reduced.
template <int kVariant>
constexpr bool CombineCe = kVariant == kLlCopyEngine || kVariant == kLlPartialsCe;
template <int kVariant>
constexpr bool CombinePartials = kVariant == kLlPartials || kVariant == kLlPartialsCe;

// The half of the dispatch area a call uses: call & 1, or with the copy engines always
// half 0 (single-buffered; the consumed words stand in for the second half).
__device__ __forceinline__ size_t DispHalf(const LlParams& p, uint64_t call) {
  return p.copy_engine ? 0 : (call & 1);
}
template <bool kCe>
__device__ __forceinline__ size_t DispHalf(uint64_t call) {
  return kCe ? 0 : (call & 1);
}

// Release every store of the block, then count it; true in the last block.
using dev::FinishBlock;

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

__device__ __forceinline__ int WarpSum(int v) { return __reduce_add_sync(kFull, v); }

// Few rows, many warps: a row moves in RowChunks() pieces, each by its own warp, so that
// more of its loads are in flight at once. A warp keeps 8 x 16 B per lane in flight
// (CopyBytes), so a 14 KiB row by one warp costs four load latencies in a row; in
// pieces of at least kLlMinChunk bytes, one each.
inline constexpr int64_t kLlMinChunk = 2048;

__device__ __forceinline__ int64_t RowChunks(int64_t rows, int64_t nwarps, int64_t row_bytes) {
  const int64_t by_warps = rows > 0 ? nwarps / rows : 1;
  const int64_t by_size = (row_bytes + kLlMinChunk - 1) / kLlMinChunk;
  return by_warps < by_size ? (by_warps > 1 ? by_warps : 1) : (by_size > 1 ? by_size : 1);
}

// Bytes [lo, hi) of piece `ch` of `chunks` of a `bytes`-byte row; pieces start at
// multiples of 16 bytes, so that a piece keeps the row's alignment.
struct LlSpan {
  int64_t lo, hi;
};
__device__ __forceinline__ LlSpan ChunkSpan(int64_t bytes, int64_t ch, int64_t chunks) {
  const int64_t per = ((bytes + chunks - 1) / chunks + 15) / 16 * 16;
  const int64_t lo = ch * per < bytes ? ch * per : bytes;
  return {lo, lo + per < bytes ? lo + per : bytes};
}

// Piece `ch` of a row of `bytes` bytes from src to dst, by one warp. Where both ends
// are 16-byte aligned (rows are), in rounds of up to 4 x 16 B per lane whose loads
// all precede their stores, the last round predicated: a 2 KiB piece (4 words per
// lane) costs one load latency (the shared CopyBytes moves a tail under 8 words per
// lane word by word, four latencies for such a piece).
__device__ __forceinline__ void CopyChunk(char* dst, const char* src, int64_t bytes, int64_t ch,
                                          int64_t chunks, int lane) {
  const LlSpan s = ChunkSpan(bytes, ch, chunks);
  char* d = dst + s.lo;
  const char* x = src + s.lo;
  const int64_t n = s.hi - s.lo;
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(x)) & 15) != 0 ||
      n % 16 != 0) {
    mori::shmem::device::detail::CopyBytes(d, x, n, lane, 32);
    return;
  }
  constexpr int kInFlight = 4;
  const int64_t words = n / 16;
  const int4* sw = reinterpret_cast<const int4*>(x);
  int4* dw = reinterpret_cast<int4*>(d);
  for (int64_t i = lane; i < words; i += kInFlight * 32) {
    int4 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (i + k * 32 < words) v[k] = sw[i + k * 32];
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (i + k * 32 < words) dw[i + k * 32] = v[k];
    }
  }
}

// A sender's flag of another wire tag than this pe's (LlTagName; `tag_from`, `theirs`),
// else (a combine) one of another weights count (LlCombineWord; `weights_from`, the
// lowest such pe, as LowLatencyCpu::CombineRecv names it, in CombineVote's words):
// the first block's first thread prints both, pe 0 traps at once, the others after
// the pause (as TrapRejected). `mine`: this pe's flag bits below the call (its tag
// and weights count). Every pe with such a peer finds one: the tags (counts) differ
// pairwise. Not inlined, one call site, scalars only, so the wait keeps its registers.
__device__ __noinline__ void TrapLlFlagDiffers(int me, int tag_from, uint32_t theirs,
                                               int weights_from, uint32_t mine, uint64_t timeout_ns,
                                               bool dispatch) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (tag_from >= 0) {
      printf(
          "mori.ep low-latency %s on rank %d: rank %d sends %s %s, this rank %s (every rank "
          "must pass the same dtype and layout)\n",
          dispatch ? "dispatch" : "combine", me, tag_from, LlTagName(theirs),
          dispatch ? "tokens" : "rows", LlTagName(RowTagOf(mine)));
    } else {
      const bool weights = CountOf(mine) != 0;
      printf(
          "mori.ep low-latency combine on rank %d: combine weights differ between ranks: rank "
          "%d passes %s, this rank passes %s (every rank must pass weights, or every rank "
          "None); outputs not written\n",
          me, weights_from, CombineWeightsName(!weights), CombineWeightsName(weights));
    }
    dev::TrapReported();
  }
  if (me != 0) {
    dev::PauseNs(dev::PeerTrapPauseNs(timeout_ns));
  }
  dev::TrapAfterReport();
}

// Waits for the flags of `call` in `flags` (this pe's copy of one half): `lanes` lanes
// of each of the W sources (kLlFlagLanes where every sending block posts its own, 1 for
// a copy-engine op), spread over the block's threads; the block gets the counts (lane
// 0's) and the first rejecting pe (or -1). A flag under another wire tag than `mine`
// traps naming both; then (a combine: `weights`, this pe's LlCombineWeights) a flag
// whose weights count differs traps naming the lowest such pe.
__device__ void WaitFlags(const LlParams& p, const uint64_t* flags, uint64_t call, int64_t* counts,
                          int* rejected_by, uint32_t mine, bool dispatch, int lanes,
                          bool weights = false) {
  __shared__ int other_from, other_weights_from;
  __shared__ uint32_t other_tag;
  if (threadIdx.x == 0) {
    *rejected_by = -1;
    other_from = -1;
    other_weights_from = p.world;
  }
  __syncthreads();
  // A combine flag that agrees with this pe's call has exactly this pe's bits below the
  // call (tag and weights count): one compare passes it.
  const uint64_t expect = LlCombineWord(0, mine, weights);
  constexpr uint64_t kLow = (uint64_t{1} << kCountBits) - 1;
  for (int i = threadIdx.x; i < p.world * lanes; i += blockDim.x) {
    const int s = i / lanes, lane = i % lanes;
    const uint64_t w =
        WaitPeerWord(&flags[s * kLlFlagLanes + lane], LlWord(call, 0), p.timeout_ns, p.me, s,
                     dispatch ? "low-latency dispatch" : "low-latency combine", call,
                     dispatch ? "dispatch flag" : "combine flag", kCountBits);
    const bool rej = CountOf(w) == kLlRejected;
    if (lane == 0) counts[s] = rej ? 0 : static_cast<int64_t>(CountOf(w));
    if (!dispatch && (w & kLow) == expect) continue;
    if (rej) atomicCAS(rejected_by, -1, s);
    if (!rej && RowTagOf(w) != mine && atomicCAS(&other_from, -1, s) == -1) other_tag = RowTagOf(w);
    if (!dispatch && !rej && CountOf(w) != CountOf(expect)) atomicMin(&other_weights_from, s);
  }
  __syncthreads();
  if (*rejected_by < 0 && (other_from >= 0 || other_weights_from < p.world)) {
    TrapLlFlagDiffers(p.me, other_from, other_tag, other_weights_from,
                      static_cast<uint32_t>(expect), p.timeout_ns, dispatch);
  }
}

// Posts `word` as this pe's flag (source me) into every pe's `flags` half: with
// `own_lanes`, the lanes this block owns (b, b + B, ...; "Flag lanes" in
// low_latency/protocol.hpp), else every lane (the grid's last block, or a rejection
// every block of the grid posts alike). Every thread of the block calls it after the
// stores the flag covers and a barrier; each posting thread releases them.
__device__ void PostLanes(const LlParams& p, uint64_t* flags, uint64_t word, bool own_lanes) {
  for (int i = threadIdx.x; i < p.world * kLlFlagLanes; i += blockDim.x) {
    const int d = i / kLlFlagLanes, lane = i % kLlFlagLanes;
    if (own_lanes && lane % static_cast<int>(gridDim.x) != static_cast<int>(blockIdx.x)) continue;
    dev::SignalSet(p.ctx, &flags[p.me * kLlFlagLanes + lane], word, d);
  }
}

// With the copy engines: once every block has read the single-buffered area, tell
// every source pe that this pe consumed `call` (its next copies wait for it).
template <bool kCe>
__device__ void PostConsumed(const LlParams& p, uint64_t call, bool combine = false) {
  if (!kCe) return;
  const Ctx c{p};
  if (FinishBlock(&c.State()->blocks_done) && threadIdx.x < p.world && threadIdx.x != p.me) {
    uint64_t* consumed = reinterpret_cast<uint64_t*>(
        c.Local(combine ? p.layout.comb_consumed : p.layout.disp_consumed));
    dev::SignalSet(p.ctx, &consumed[p.me], LlWord(call, 0), threadIdx.x);
  }
}

template <bool kCe>
__device__ void Reject(const LlParams& p, bool dispatch) {
  const Ctx c{p};
  LlDeviceState* st = c.State();
  const int W = p.world;
  const uint64_t call = (dispatch ? st->dispatch_calls : st->combine_calls) + 1;
  const size_t half = DispHalf<kCe>(call);  // combines of a copy-engine op use half 0 too
  uint64_t* flags =
      reinterpret_cast<uint64_t*>(c.Local(dispatch ? p.layout.disp_flag : p.layout.comb_flag)) +
      LlFlagIndex(half, W, 0);
  // Every block posts the rejection into its own lanes (a copy-engine op's receivers
  // read lane 0, which block 0 owns).
  PostLanes(p, flags, LlWord(call, kLlRejected), true);
  const int lanes = kCe ? 1 : kLlFlagLanes;
  for (int i = threadIdx.x; i < W * lanes; i += blockDim.x) {
    WaitPeerWord(&flags[(i / lanes) * kLlFlagLanes + i % lanes], LlWord(call, 0), p.timeout_ns,
                 p.me, i / lanes, dispatch ? "low-latency dispatch" : "low-latency combine", call,
                 dispatch ? "dispatch flag" : "combine flag", kCountBits);
  }
  __syncthreads();
  // Received (as rejected): the next copies may come.
  if (dispatch) {
    PostConsumed<kCe>(p, call);
  } else {
    PostConsumed<kCe>(p, call, true);
  }
  if (threadIdx.x == 0) {
    if (dispatch) {
      st->dispatch_calls = call;
    } else {
      st->combine_calls = call;
    }
  }
}

}  // namespace

}  // namespace mori::ep::low_latency
