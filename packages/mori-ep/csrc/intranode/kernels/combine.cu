// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The combine kernels of the intra-node protocol (intranode/protocol.hpp, README "The
// intra-node protocol"), step for step IntraNodeCpu::Combine (intranode/cpu.cpp):
//
// combine, streaming path (the default; CombineStream): block b owns a range of token
//   groups; its return warps return the range's received rows step by step and post
//   each step's combine_done words once every return warp's stores of it are
//   performed, while its other warps reduce the range's tokens as the peers' words
//   arrive (return warps join once their rows are out). No barrier ties the roles.
// combine, tiled path (MORI_EP_COMBINE_STREAM=0, and blocks of one warp; one kernel,
//   every block co-resident, no grid-wide wait):
//   each block walks its tiles of token groups in increasing order; per tile it
//   1. returns the received rows of those groups (from recv_group_row) to their
//      sources' slots [me][t] (own rows stay in the input), Quiet, and posts the
//      groups' combine_done words to every other pe;
//   2. then, for the tile before, waits for every other pe's words of its groups and
//      reduces those tokens over the pes they went to, in ascending pe order, fp32,
//      rounded once (the CPU implementation's order, hence its bits), with several
//      16-byte loads per lane in flight.
//   Reductions of early groups overlap the transfers of later ones.
//   With few received rows per block (num_tokens x world <= MORI_EP_COMBINE_ONEPASS_ROWS,
//   default 16, x blocks) the tiles would leave most of the grid idle, so a one-pass
//   kernel spreads (row, segment) returns over every warp of the grid, the last block
//   (completion counter) posts every group's word, and every warp then reduces
//   (token, segment) items once its token's group words arrived. Same words, same
//   reduction order: a pe on either path works with a peer on the other.
// The row operations the three paths share (return a row segment, reduce a token's
// segment) are in combine_rows.cuh.

#include "intranode/kernels/combine_rows.cuh"
#include "intranode/kernels/device.cuh"

namespace mori::ep::intranode {

namespace {

// This pe's combine word of a call that it did not reject: its input's dtype and
// whether it combines weights (IntraNodeCpu::FinishCombine's word).
__device__ __forceinline__ uint64_t MyCombineWord(const Common& c, uint64_t epoch) {
  return (epoch << kCombineEpochShift) | c.combine_bits;
}

// Posts `word` as combine_done[me][g] to every pe, for every group (rejections).
__device__ void PostCombineWords(const Common& c, uint64_t word, unsigned tid, unsigned nthreads) {
  const int64_t G = CombineGroups(c.max_tokens);
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done) + c.me * G;
  for (int64_t i = tid; i < G * c.world; i += nthreads) {
    dev::SignalSet(c.ctx, &done[i / c.world], word, static_cast<int>(i % c.world));
  }
}

__global__ void RejectCombineKernel(Common c, const uint64_t* epoch) {
  PostCombineWords(c, CombineWord(*epoch, 0, true), threadIdx.x, blockDim.x);
}

// Groups [g0, g1) of the block's tile j: the first `active` groups (those that can
// hold rows) in tiles of `tg1`, then the rest in at most one tile per block.
struct Tiling {
  int64_t active, tg1, tiles1, tg2, tiles;
  __device__ void Range(int64_t j, int64_t& g0, int64_t& g1, int64_t G) const {
    if (j < tiles1) {
      g0 = j * tg1;
      g1 = std::min(active, g0 + tg1);
    } else {
      g0 = active + (j - tiles1) * tg2;
      g1 = std::min(G, g0 + tg2);
    }
  }
};

// Once every thread's returns of groups [g0, g1) are performed, posts their
// combine_done words to every other pe.
__device__ __forceinline__ void PostTileWords(const Common& c, uint64_t* done, uint64_t epoch,
                                              int64_t g0, int64_t g1, unsigned tid,
                                              unsigned nthreads) {
  const int64_t G = CombineGroups(c.max_tokens);
  dev::Quiet();
  __syncthreads();
  for (int64_t i = tid; i < (g1 - g0) * c.world; i += nthreads) {
    const int pe = static_cast<int>(i % c.world);
    if (pe != c.me) {
      dev::SignalSet(c.ctx, &done[c.me * G + g0 + i / c.world], MyCombineWord(c, epoch), pe);
    }
  }
}

// A peer's combine word of another dtype than this pe's input, or (same dtype) of
// another weights bit (one rank passes weights, another None: a pe returns weights only
// when it combines them, so the one asking for them would read an earlier call's; in
// CombineVote::ThrowIfFailed's words). Every pe with such a peer finds one: the first
// detecting thread prints the difference, pe 0 traps at once, the others after the
// pause. `theirs` and `mine`: the two words' bits below the epoch (kCombineLowMask).
// Not inlined: its caller CheckCombineWord is inlined into every wait site, and one
// out-of-line copy keeps the printf out of each; given scalars only, so that the wait
// loops keep their registers (a `const Common&` would put the kernel parameters in
// local memory).
__device__ __noinline__ void TrapCombineWordDiffers(int me, int from, uint32_t theirs_bits,
                                                    uint32_t mine_bits, uint64_t timeout_ns) {
  const uint32_t theirs = CombineTagOf(theirs_bits), mine = CombineTagOf(mine_bits);
  const bool weights = CombineWeightsOf(mine_bits);
  if (FirstTrapReport()) {
    if (theirs != mine) {
      printf(
          "mori.ep combine on rank %d: rank %d passes %s input, this rank %s (every rank must "
          "pass the same dtype)\n",
          me, from, CombineTagName(theirs), CombineTagName(mine));
    } else {
      printf(
          "mori.ep combine on rank %d: combine weights differ between ranks: rank %d passes "
          "%s, this rank passes %s (every rank must pass weights, or every rank None); "
          "outputs not written\n",
          me, from, CombineWeightsName(!weights), CombineWeightsName(weights));
    }
    dev::TrapReported();
  }
  if (me != 0) PauseBeforePeerTrap(timeout_ns);
  dev::TrapAfterReport();
}

// Pe d's combine word of a group (this pe's copy), once it carries `epoch`; a timeout
// traps naming d.
__device__ __forceinline__ uint64_t WaitCombineWord(const Common& c, const uint64_t* word,
                                                    uint64_t epoch, int d) {
  return WaitPeerWord(word, CombineFloor(epoch), c.timeout_ns, c.me, d, "combine", epoch,
                      "combine rows", kCombineEpochShift);
}

// Traps when pe d's combine word `v` carries a rejection, another dtype or another
// weights bit (CombineVote's order). Before a dtype or weights trap this pe posts its
// words of every group to every other pe, so that no peer waits for a group this pe
// had not reached and times out instead of naming the difference; a peer that reads
// them traps on it before it reduces.
__device__ __forceinline__ void CheckCombineWord(const Common& c, uint64_t epoch, int d,
                                                 uint64_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) & kCombineLowMask;
  if (bits != c.combine_bits) {  // one compare: a rejection, another dtype or weights bit
    if (bits & 1u) TrapRejectedBy(c, d, "combine");
    const int64_t G = CombineGroups(c.max_tokens);
    uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
    const uint64_t mine = MyCombineWord(c, epoch);
    for (int pe = 0; pe < c.world; ++pe) {
      if (pe == c.me) continue;
      for (int64_t g = 0; g < G; ++g) dev::SignalSet(c.ctx, &done[c.me * G + g], mine, pe);
    }
    __threadfence_system();
    TrapCombineWordDiffers(c.me, d, bits, c.combine_bits, c.timeout_ns);
  }
}

// One warp waits (lane d for pe d) until every other pe's combine word of group g
// carries this epoch, and traps on a rejection; the warp barrier extends what the
// waiting lanes acquired to the whole warp.
__device__ __forceinline__ void WaitGroupWords(const Common& c, uint64_t epoch, int64_t g,
                                               unsigned lane) {
  const int64_t G = CombineGroups(c.max_tokens);
  const uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
  for (int d = static_cast<int>(lane); d < c.world; d += 32) {
    if (d == c.me) continue;
    CheckCombineWord(c, epoch, d, WaitCombineWord(c, &done[d * G + g], epoch, d));
  }
  __syncwarp();
}

// The tiled path: each block walks tiles of token groups in increasing order,
// returning tile j's rows, posting its groups' words, then reducing tile j - 1 once
// the peers' words of it arrived, so reductions of early groups overlap the
// transfers of later ones.
template <int kThreads, int kWire>
__device__ void CombineTiles(const CombineParams& p, uint64_t epoch, int64_t total) {
  constexpr int kU = kReduceItemWords<kThreads, kWire>;
  const Common& c = p.c;
  const int W = c.world, me = c.me;
  const int64_t G = CombineGroups(c.max_tokens);
  const unsigned tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned nthreads = blockDim.x, nwarps = nthreads >> 5;
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
  // Tiles: the groups that can hold rows (estimated from my tokens and my received
  // rows; a wrong estimate costs balance, not correctness) spread over the grid,
  // p.steps tiles per block; the rest (signals only) one tile per block.
  const int64_t n = p.num_tokens;
  const int64_t my_groups = (n + kGroupTokens - 1) / kGroupTokens;
  Tiling tl;
  tl.active =
      std::min<int64_t>(G, std::max<int64_t>(my_groups, (total + kGroupTokens - 1) / kGroupTokens));
  const int64_t per_tile = static_cast<int64_t>(gridDim.x) * p.steps;
  tl.tg1 = std::max<int64_t>(1, (tl.active + per_tile - 1) / per_tile);
  tl.tiles1 = (tl.active + tl.tg1 - 1) / tl.tg1;
  const int64_t rest = G - tl.active;
  tl.tg2 = std::max<int64_t>(1, (rest + gridDim.x - 1) / gridDim.x);
  tl.tiles = tl.tiles1 + (rest + tl.tg2 - 1) / tl.tg2;

  __shared__ int32_t s_lo[kW], s_cnt[kW];
  const int32_t* group_row = p.group_row;
  const int nseg_ret = p.nseg_ret;
  const int64_t nwords = p.row_bytes / 16;
  const int nseg_red = p.vec ? static_cast<int>((nwords + kU * 32 - 1) / (kU * 32)) : 1;
  // With p.split, the first half of the warps returns tile j while the second half
  // reduces tile j - 1, so a block keeps NVLink busy during its reductions.
  const bool split = p.split && nwarps >= 2;
  const unsigned push_warps = split ? nwarps / 2 : nwarps;
  const bool pusher = !split || warp < push_warps;
  const unsigned rwarp = split ? warp - push_warps : warp;
  const unsigned rwarps = split ? nwarps - push_warps : nwarps;
  int64_t prev = -1;
  for (int64_t j = blockIdx.x;; j += gridDim.x) {
    const bool have = j < tl.tiles;
    int64_t g0 = 0, g1 = 0;
    if (have) {
      // 1. Return the rows of this tile's groups (words posted below).
      tl.Range(j, g0, g1, G);
      if (tid < static_cast<unsigned>(W)) {
        const int s = static_cast<int>(tid);
        const int32_t a = s == me ? 0 : __ldcg(group_row + s * (G + 1) + g0);
        const int32_t b = s == me ? 0 : __ldcg(group_row + s * (G + 1) + g1);
        s_lo[s] = a;
        s_cnt[s] = b - a;
      }
      __syncthreads();
      if (pusher) {
        int64_t rows = 0;
        for (int s = 0; s < W; ++s) rows += s_cnt[s];
        for (int64_t item = warp; item < rows * nseg_ret; item += push_warps) {
          int64_t r = item / nseg_ret;
          int s = 0;
          while (r >= s_cnt[s]) r -= s_cnt[s++];
          ReturnRowSegment<kSegWords<kThreads>, kWire>(p, s_lo[s] + r, s,
                                                       static_cast<int>(item % nseg_ret), lane);
        }
      }
    }
    // Without the split, post tile j's words before reducing the tile before.
    if (have && !split) PostTileWords(c, done, epoch, g0, g1, tid, nthreads);
    if (prev >= 0 && (!split || !pusher)) {
      // 2. The tile before: wait for its groups' rows from every other pe, reduce.
      int64_t h0, h1;
      tl.Range(prev, h0, h1, G);
      const int64_t t0 = h0 * kGroupTokens, t1 = std::min(h1 * kGroupTokens, n);
      if (t0 < t1) {
        const int64_t gw = (t1 - t0 + kGroupTokens - 1) / kGroupTokens;
        // Split: each reducing warp waits itself (then __syncwarp); else the block.
        const unsigned wid = split ? lane : tid, wn = split ? 32 : nthreads;
        for (int64_t i = wid; i < gw * W; i += wn) {
          const int d = static_cast<int>(i % W);
          if (d == me) continue;
          CheckCombineWord(c, epoch, d, WaitCombineWord(c, &done[d * G + h0 + i / W], epoch, d));
        }
        if (split) {
          __syncwarp();
        } else {
          __syncthreads();
        }
        const int64_t items = (t1 - t0) * nseg_red;
        for (int64_t item = rwarp; item < items; item += rwarps) {
          const int64_t t = t0 + item / nseg_red;
          const int seg = static_cast<int>(item % nseg_red);
          ReduceItem<kU, kWire>(p, t, seg, lane);
        }
      }
    }
    if (!have) break;
    if (split) PostTileWords(c, done, epoch, g0, g1, tid, nthreads);
    prev = j;
  }
}

// The one-pass path, for few received rows per block: there the tiles would leave
// most of the grid idle (at 128 tokens per rank and W = 2 the rows fall in 16
// groups, so 16 blocks returned and reduced everything, one SM's bandwidth and
// latency chain each). Here every warp of the grid takes (row, segment) items of all
// received rows, the grid's last block posts every group's word once every block's
// returns are performed, then every warp takes (token, segment) items of the
// reduction, waiting only for its token's group. The words mean what the tiled
// path's mean, so a peer on either path reads them unchanged, and the reduction is
// ReduceSegment's: the bits are the tiled path's.
template <int kThreads, int kWire>
__device__ void CombineOnePass(const CombineParams& p, uint64_t epoch, int64_t total) {
  constexpr int kU = kReduceItemWords<kThreads, kWire>;
  const Common& c = p.c;
  const int W = c.world, me = c.me;
  const int64_t M = c.max_tokens, G = CombineGroups(M);
  const unsigned tid = threadIdx.x, lane = tid & 31;
  const int64_t nwarps = blockDim.x >> 5;
  const int64_t gwarp = blockIdx.x * nwarps + (tid >> 5);
  const int64_t gwarps = gridDim.x * nwarps;
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done);

  // 1. Return every received row but mine (rows from one pe are contiguous; mine,
  // [own_lo, own_hi), stay in the input).
  const int32_t* own = p.group_row + static_cast<int64_t>(me) * (G + 1);
  const int64_t own_lo = __ldcg(own), own_hi = __ldcg(own + G);
  const int32_t* src_pos = p.src_pos;
  const int nseg_ret = p.nseg_ret;
  const int64_t ret_items = (total - (own_hi - own_lo)) * nseg_ret;
  for (int64_t item = gwarp; item < ret_items; item += gwarps) {
    int64_t i = item / nseg_ret;
    if (i >= own_lo) i += own_hi - own_lo;
    const int s = static_cast<int>(src_pos[i] / M);
    ReturnRowSegment<kSegWords<kThreads>, kWire>(p, i, s, static_cast<int>(item % nseg_ret), lane);
  }

  // 2. The last block to finish (it sees every block's returns as performed) posts
  // every group's word to every other pe.
  if (FinishBlock(&State(c)->combine_blocks_done)) {
    for (int64_t i = tid; i < G * W; i += blockDim.x) {
      const int pe = static_cast<int>(i % W);
      if (pe != me) {
        dev::SignalSet(c.ctx, &done[me * G + i / W], MyCombineWord(c, epoch), pe);
      }
    }
  }

  // 3. Reduce: a warp waits (lane d for pe d) for the group of its item's token.
  const int64_t n = p.num_tokens;
  const int64_t nwords = p.row_bytes / 16;
  const int nseg_red = p.vec ? static_cast<int>((nwords + kU * 32 - 1) / (kU * 32)) : 1;
  int64_t waited = -1;
  for (int64_t item = gwarp; item < n * nseg_red; item += gwarps) {
    const int64_t t = item / nseg_red;
    const int seg = static_cast<int>(item % nseg_red);
    const int64_t g = t / kGroupTokens;
    if (g != waited) {
      WaitGroupWords(c, epoch, g, lane);
      waited = g;
    }
    ReduceItem<kU, kWire>(p, t, seg, lane);
  }
}

// The block's reduce: (token, segment) items of tokens [t_lo, t_hi) in order, taken
// from the block's counter *next, each waiting (lane d for pe d) for its group's
// words; a warp waits once per group.
template <int kU, int kWire>
__device__ void ReduceTokenRange(const CombineParams& p, uint64_t epoch, int64_t t_lo, int64_t t_hi,
                                 int nseg_red, unsigned long long* next, bool first_item) {
  const unsigned lane = threadIdx.x & 31;
  const int64_t red_items = (t_hi - t_lo) * nseg_red;
  int64_t waited = -1;
  for (;;) {
    unsigned long long item = 0;
    if (lane == 0) item = atomicAdd(next, 1ull);
    item = __shfl_sync(kFull, item, 0);
    if (static_cast<int64_t>(item) >= red_items) break;
    const int64_t t = t_lo + static_cast<int64_t>(item) / nseg_red;
    const int seg = static_cast<int>(static_cast<int64_t>(item) % nseg_red);
    const int64_t g = t / kGroupTokens;
    if (g != waited) {
      WaitGroupWords(p.c, epoch, g, lane);
      waited = g;
      if (first_item) Stamp(p.stamps, 2, lane == 0);
      first_item = false;
    }
    ReduceItem<kU, kWire>(p, t, seg, lane);
  }
}

// ReduceTokenRange under fp8_blockwise with vector rows, software-pipelined: while a
// warp quantizes, dequantizes and sums item k, item k + 1's own-part loads are in
// flight (issued before item k's arithmetic) and item k + 2's own-part lookups (whether
// the token came to me, its row) too, so the warp's memory traffic does not stop for
// its arithmetic. The other pes' parts are looked up with item k (after its group's
// wait they are loaded anyway). Items, waits and sums are ReduceTokenRange's (one
// item's words: kU a lane).
template <int kU>
__device__ void ReduceBlockwiseTokenRange(const CombineParams& p, uint64_t epoch, int64_t t_lo,
                                          int64_t t_hi, int nseg_red, unsigned long long* next,
                                          bool first_item) {
  const Common& c = p.c;
  const int W = c.world, me = c.me;
  const unsigned lane = threadIdx.x & 31;
  const int64_t red_items = (t_hi - t_lo) * nseg_red;
  auto claim = [&]() {
    unsigned long long item = 0;
    if (lane == 0) item = atomicAdd(next, 1ull);
    return static_cast<int64_t>(__shfl_sync(kFull, item, 0));
  };
  // A claimed item's own-part lookups, issued now and read an item later.
  uint8_t l_own = 0;
  int64_t l_row = 0;
  auto lookup = [&](int64_t item) {
    const int64_t t = t_lo + item / nseg_red;
    l_own = __ldcg(p.token_ranks + t * W + me);
    l_row = __ldcg(p.token_self_row + t);
  };
  auto resolve = [&]() { return BlockwiseToken{static_cast<uint32_t>(l_own != 0) << me, l_row}; };
  int64_t cur = claim();
  if (cur >= red_items) return;
  lookup(cur);
  BlockwiseToken tok = resolve();  // my own part only (its bit of the mask)
  OwnWords<kU> raw;
  LoadOwnWords<kU>(p, tok, static_cast<int>(cur % nseg_red), lane, raw);
  int64_t nxt = claim();
  if (nxt < red_items) lookup(nxt);
  int64_t waited = -1;
  for (;;) {
    // Item k + 1: its own loads; item k + 2: its lookups.
    BlockwiseToken tok_next{0, 0};
    OwnWords<kU> raw_next;
    int64_t after = red_items;
    if (nxt < red_items) {
      tok_next = resolve();
      LoadOwnWords<kU>(p, tok_next, static_cast<int>(nxt % nseg_red), lane, raw_next);
      after = claim();
      if (after < red_items) lookup(after);
    }
    // Item k: the other pes' parts, its group's words, its sums.
    const int64_t t = t_lo + cur / nseg_red;
    const int seg = static_cast<int>(cur % nseg_red);
    uint32_t mask = tok.mask;
    const uint8_t* ranks = p.token_ranks + t * W;
#pragma unroll
    for (int d = 0; d < kW; ++d) {
      if (d >= W) break;
      if (d != me) mask |= static_cast<uint32_t>(ranks[d] != 0) << d;
    }
    const int64_t g = t / kGroupTokens;
    if (g != waited) {
      WaitGroupWords(c, epoch, g, lane);
      waited = g;
      if (first_item) Stamp(p.stamps, 2, lane == 0);
      first_item = false;
    }
    ReduceBlockwiseWords<kU>(p, t, seg, lane, mask, raw);
    if (seg == 0 && p.out_weights != nullptr) ReduceWeights(p, t, lane);
    if (nxt >= red_items) break;
    cur = nxt;
    nxt = after;
    tok = tok_next;
#pragma unroll
    for (int k = 0; k < kU + kU % 2; ++k) raw[k] = raw_next[k];
  }
}

// The streaming path (the default with many rows per block). Block b owns a range of
// token groups, the same on every pe with the same grid, so block b of each pe
// returns what block b of the other reduces. Its first p.return_warps warps return
// the received rows of its groups, p.step_groups groups at a time, round-robin over
// (row, segment) items; after each step a return warp makes its stores performed
// (Quiet) and records its progress, and the warp that completes a step posts that
// step's words. The other warps reduce the block's tokens in order, taking (token,
// segment) items from a block counter and waiting for each group's words; return
// warps join them once their rows are out. No barrier ties the two roles, so a block
// keeps stores in flight to the peers while it reduces. Words and reduction order
// are the other paths'.
template <int kThreads, int kWire>
__device__ void CombineStream(const CombineParams& p, uint64_t epoch) {
  // fp8_blockwise in the 512-thread build: the pipelined reduce (ReduceBlockwiseTokenRange)
  // with the bf16 build's item words, its next item's loads in flight.
  constexpr bool kPipelined = kWire == kWireBlockwise && kThreads <= kNarrowThreads;
  constexpr int kU = kPipelined ? kReduceWords<kThreads> : kReduceItemWords<kThreads, kWire>;
  constexpr int kSeg = kSegWords<kThreads>;
  const Common& c = p.c;
  const int W = c.world, me = c.me;
  const int64_t G = CombineGroups(c.max_tokens);
  const unsigned tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned R = static_cast<unsigned>(p.return_warps);
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
  const int32_t* group_row = p.group_row;
  const int64_t n = p.num_tokens;
  // Range 1: the groups of my tokens, split evenly (returns of peers' tokens of the
  // same groups ride along); range 2: the groups past my tokens (a peer's extra
  // tokens, else words only).
  const int64_t A = std::min<int64_t>(G, (n + kGroupTokens - 1) / kGroupTokens);
  const int64_t B = gridDim.x, b = blockIdx.x;
  const int64_t r1lo = A * b / B, r1hi = A * (b + 1) / B;
  const int64_t r2lo = A + (G - A) * b / B, r2hi = A + (G - A) * (b + 1) / B;
  const int nseg_ret = p.nseg_ret;
  const int64_t nwords = p.row_bytes / 16;
  const int nseg_red = p.vec ? static_cast<int>((nwords + kU * 32 - 1) / (kU * 32)) : 1;

  __shared__ unsigned long long s_next;      // next reduce item
  __shared__ int64_t s_prog[kThreads / 32];  // steps each return warp has completed
  if (tid == 0) s_next = 0;
  if (tid < R) s_prog[tid] = 0;
  __syncthreads();
  Stamp(p.stamps, 0);

  if (warp < R) {
    int64_t step = 0;
    for (int range = 0; range < 2; ++range) {
      const int64_t lo = range == 0 ? r1lo : r2lo, hi = range == 0 ? r1hi : r2hi;
      // Range 2 rarely holds rows: one step, so its words do not wait on a chain of
      // per-step loads.
      const int64_t sg = range == 0 ? p.step_groups : std::max<int64_t>(1, hi - lo);
      for (int64_t g0 = lo; g0 < hi; g0 += sg, ++step) {
        const int64_t g1 = std::min<int64_t>(hi, g0 + sg);
        // Lane s < W: the rows from pe s of groups [g0, g1) (none from me).
        int32_t first = 0, cnt = 0;
        if (lane < static_cast<unsigned>(W) && lane != static_cast<unsigned>(me)) {
          first = __ldcg(group_row + lane * (G + 1) + g0);
          cnt = __ldcg(group_row + lane * (G + 1) + g1) - first;
        }
        const int64_t rows = __reduce_add_sync(kFull, static_cast<unsigned>(cnt));
        bool stored = false;
        for (int64_t item = warp; item < rows * nseg_ret; item += R) {
          int64_t r = item / nseg_ret;
          int s = 0;
          for (;; ++s) {
            const int32_t cs = __shfl_sync(kFull, cnt, s);
            if (r < cs) break;
            r -= cs;
          }
          const int32_t fs = __shfl_sync(kFull, first, s);
          ReturnRowSegment<kSeg, kWire>(p, fs + r, s, static_cast<int>(item % nseg_ret), lane);
          stored = true;
        }
        if (stored) dev::Quiet();
        __syncwarp();
        // Progress: the last return warp to complete the step (the fences order the
        // stores and the reads of s_prog, so at least one warp sees every other's)
        // posts its words.
        bool post = false;
        if (lane == 0) {
          volatile int64_t* prog = s_prog;
          prog[warp] = step + 1;
          __threadfence_block();
          int64_t low = step + 1;
          for (unsigned w = 0; w < R; ++w)
            low = std::min<int64_t>(low, static_cast<int64_t>(prog[w]));
          post = low > step;
        }
        if (__shfl_sync(kFull, post, 0)) {
          // Acquire the other warps' completed steps before releasing the words.
          dev::Quiet();
          for (int64_t i = lane; i < (g1 - g0) * W; i += 32) {
            const int pe = static_cast<int>(i % W);
            if (pe != me) {
              dev::SignalSet(c.ctx, &done[me * G + g0 + i / W], MyCombineWord(c, epoch), pe);
            }
          }
        }
      }
    }
    Stamp(p.stamps, 1, tid == 0);
  }

  // Reduce: (token, segment) items of range 1's tokens, in order, from s_next.
  if constexpr (kPipelined) {
    if (p.vec) {
      ReduceBlockwiseTokenRange<kU>(p, epoch, std::min(n, r1lo * kGroupTokens),
                                    std::min(n, r1hi * kGroupTokens), nseg_red, &s_next, warp == R);
    } else {
      ReduceTokenRange<kU, kWire>(p, epoch, std::min(n, r1lo * kGroupTokens),
                                  std::min(n, r1hi * kGroupTokens), nseg_red, &s_next, warp == R);
    }
  } else {
    ReduceTokenRange<kU, kWire>(p, epoch, std::min(n, r1lo * kGroupTokens),
                                std::min(n, r1hi * kGroupTokens), nseg_red, &s_next, warp == R);
  }
  if (p.stamps != nullptr) {
    __syncthreads();
    Stamp(p.stamps, 3);
  }
}

template <int kThreads, int kPath, int kWire>
__global__ void __launch_bounds__(kThreads) CombineKernel(CombineParams p) {
  const Common& c = p.c;
  const int W = c.world, me = c.me;
  const int64_t G = CombineGroups(c.max_tokens);
  const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned nthreads = blockDim.x;
  const uint64_t epoch = *p.epoch;
  const int64_t total = *p.total_recv;
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
  if (total > p.input_rows) {
    // Reject the combine on every pe (they trap naming this one), then trap; the
    // other blocks leave without touching the short input.
    if (blockIdx.x == 0) {
      if (tid == 0) {
        printf(
            "mori.ep combine on rank %d: combine input has %lld rows, fewer than total_recv "
            "%lld\n",
            me, static_cast<long long>(p.input_rows), static_cast<long long>(total));
        dev::TrapReported();
      }
      PostCombineWords(c, CombineWord(epoch, 0, true), tid, nthreads);
      dev::Quiet();
      __syncthreads();
      if (tid == 0) dev::Trap();
    }
    return;
  }

  if constexpr (kPath == kOnePassPath) {
    Stamp(p.stamps, 0);
    CombineOnePass<kThreads, kWire>(p, epoch, total);
    Stamp(p.stamps, 3);
  } else if constexpr (kPath == kStreamPath) {
    CombineStream<kThreads, kWire>(p, epoch);
  } else {
    Stamp(p.stamps, 0);
    CombineTiles<kThreads, kWire>(p, epoch, total);
    Stamp(p.stamps, 3);
  }
  // A pe with no tokens waits for nothing above; it still must see a rejection
  // posted in this epoch (every group carries it), so block 0 checks the last group.
  if (p.num_tokens == 0 && blockIdx.x == 0 && warp == 0) {
    for (int d = static_cast<int>(lane); d < W; d += 32) {
      if (d == me) continue;
      CheckCombineWord(c, epoch, d, WaitCombineWord(c, &done[d * G + G - 1], epoch, d));
    }
  }
}

// The combine kernel of `path` for a block of `threads`, moving kWire rows.
template <int kWire>
const void* CombineKernelOf(int threads, int path) {
  auto pick = [path](auto tiled, auto onepass, auto stream) {
    return path == kOnePassPath  ? reinterpret_cast<const void*>(onepass)
           : path == kStreamPath ? reinterpret_cast<const void*>(stream)
                                 : reinterpret_cast<const void*>(tiled);
  };
  if (threads > kNarrowThreads) {
    return pick(CombineKernel<kMaxThreads, kTiledPath, kWire>,
                CombineKernel<kMaxThreads, kOnePassPath, kWire>,
                CombineKernel<kMaxThreads, kStreamPath, kWire>);
  }
  return pick(CombineKernel<kNarrowThreads, kTiledPath, kWire>,
              CombineKernel<kNarrowThreads, kOnePassPath, kWire>,
              CombineKernel<kNarrowThreads, kStreamPath, kWire>);
}

const void* CombineKernelFor(int threads, int path, int wire) {
  switch (wire) {
    case kWireFp8:
      return CombineKernelOf<kWireFp8>(threads, path);
    case kWireBlockwise:
      return CombineKernelOf<kWireBlockwise>(threads, path);
    default:
      return CombineKernelOf<kWireNative>(threads, path);
  }
}

}  // namespace

void LaunchCombine(const CombineParams& p, int path, int wire, LaunchShape launch,
                   uintptr_t stream) {
  const unsigned threads = launch.warp_per_block * 32;
  void* args[] = {const_cast<CombineParams*>(&p)};
  MORI_CUDA_CHECK(cudaLaunchKernel(CombineKernelFor(threads, path, wire), dim3(launch.block_num),
                                   dim3(threads), args, 0, reinterpret_cast<cudaStream_t>(stream)));
  MORI_CUDA_CHECK(cudaGetLastError());
}

int CombineBlocksPerSm(int warps, int path, int wire) {
  int n = 0;
  MORI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, CombineKernelFor(warps * 32, path, wire), warps * 32, 0));
  return n;
}

void LaunchRejectCombine(const Common& c, const uint64_t* epoch, uintptr_t stream) {
  RejectCombineKernel<<<1, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(c, epoch);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::intranode
