// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CUDA kernels of the intra-node protocol (protocol.hpp, README "The
// intra-node protocol"), step for step the operations of dispatch_combine_cpu.cpp:
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
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dispatch_combine_cuda.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/device.cuh"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

namespace dev = mori::shmem::device;
using mori::shmem::Cmp;
using mori::shmem::DeviceContext;

namespace {

constexpr int kW = kMaxCudaWorldSize;
constexpr int kMaxThreads = kMaxWarpsPerBlock * 32;
// Grids of up to 16 warps per block run a 512-thread build of each kernel, which
// may use 128 registers per thread (the 1024-thread build gets 64).
constexpr int kNarrowThreads = 512;
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int64_t kGroupTokens = kCombineGroupTokens;
// A warp moves a row in segments of kSeg 16-byte words per lane (8 in the 512-thread
// build: 4 KiB; 4 in the 1024-thread one, which has half the registers): all loads
// of a segment are issued before its stores, so the copy costs one load latency per
// segment instead of one per word batch.
template <int kThreads>
constexpr int kSegWords = kThreads <= kNarrowThreads ? 8 : 4;  // combine; dispatch: kSeg
// 16-byte words per lane a combine reduction keeps in flight per pe (two pes at once).
template <int kThreads>
constexpr int kReduceWords = kThreads <= kNarrowThreads ? 4 : 1;
// 32-bit metadata words (weights, indices, scales, src_pos) a lane stages at once.
constexpr int kMetaWords = 4;
// How long a pe waits before trapping on a peer's rejection (TrapRejectedBy); at
// most half the op's timeout.
__device__ constexpr uint64_t kPeerTrapPauseNs = 1000000000;

struct Common {
  DeviceContext ctx;
  char* block;  // this pe's symmetric block
  EpBufferLayout layout;
  int world, me, top_k;
  int64_t max_tokens;  // M
  uint64_t timeout_ns;
};

struct DispatchParams {
  Common c;
  int experts_per_rank, num_experts;
  int64_t hidden_bytes, row_bytes, scale_bytes;
  const char* tokens;
  const float* weights;
  const char* scales;
  const int32_t* indices;
  int64_t num_tokens;
  bool vec;          // token rows move as 16-byte words
  bool indices_vec;  // index rows load as int4 (K % 4 == 0, 16-byte aligned)
  bool meta_staged;  // metadata fits kMetaWords words per lane, 4-byte aligned
  uint64_t* stamps;  // MORI_EP_TIMELINE: [block][kStamps] globaltimer stamps, else null
};

struct CombineParams {
  Common c;
  int64_t hidden, combine_row_bytes, row_bytes;
  const char* input;
  int64_t input_row_stride, input_rows;
  bool bfloat16;
  bool vec;  // rows, slots, input and output all move as 16-byte words
  const float* weights;
  void* out;
  float* out_weights;
  int64_t num_tokens;
  int steps;          // tiles per block the combine aims for (pipeline depth)
  bool split;         // half the warps return rows while the other half reduce
  int ret_seg_words;  // 16-byte words per lane of a returned row segment (SplitRow)
  int nseg_ret;       // segments per returned row
  int return_warps;   // streaming path: warps per block that return rows (1 .. nwarps - 1)
  int step_groups;    // streaming path: groups a block's return warps post at once
  uint64_t* stamps;   // MORI_EP_TIMELINE: [block][kStamps] globaltimer stamps, else null
};

template <typename T>
__device__ __forceinline__ T* At(const Common& c, size_t offset) {
  return reinterpret_cast<T*>(c.block + offset);
}

// pe's copy of this pe's region at `offset` (every pe is load/store reachable:
// the constructor checked).
template <typename T>
__device__ __forceinline__ T* PeerAt(const Common& c, size_t offset, int pe) {
  return reinterpret_cast<T*>(c.ctx.peer_bases[pe] + (c.block - c.ctx.my_base) + offset);
}

__device__ __forceinline__ EpDeviceState* State(const Common& c) {
  return At<EpDeviceState>(c, c.layout.state);
}

// MORI_EP_TIMELINE: the calling thread (by default thread 0 of the block) records when
// it reaches phase k (globaltimer, ns) in the launch's stamp buffer; off, one uniform
// branch.
__device__ __forceinline__ void Stamp(uint64_t* stamps, int k, bool who = threadIdx.x == 0) {
  if (stamps != nullptr && who && blockIdx.x < kTimelineBlocks) {
    stamps[blockIdx.x * kTimelineStamps + k] = dev::GlobalTimerNs();
  }
}

__device__ __forceinline__ unsigned LaneMaskLt() {
  unsigned m;
  asm volatile("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// torch's float -> bf16 conversion (round to nearest even, NaN to 0x7FC0), as in
// dispatch_combine_cpu.cpp, so both implementations produce the same bits.
__device__ __forceinline__ uint16_t FloatToBFloat16(float f) {
  if (f != f) return 0x7FC0;
  uint32_t bits = __float_as_uint(f);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

__device__ __forceinline__ float BFloat16ToFloat(uint32_t v16) {
  return __uint_as_float(v16 << 16);
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

// Posts `word` as combine_done[me][g] to every pe, for every group (rejections).
__device__ void PostCombineWords(const Common& c, uint64_t word, unsigned tid, unsigned nthreads) {
  const int64_t G = CombineGroups(c.max_tokens);
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done) + c.me * G;
  for (int64_t i = tid; i < G * c.world; i += nthreads) {
    dev::SignalSet(c.ctx, &done[i / c.world], word, static_cast<int>(i % c.world));
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
      PostRejectedCounts(p.c, epoch, 0, 1);
      dev::Trap();
    }
  }
}

// The set of pes token t goes to, as a bit mask; any id outside [-1, num_experts)
// reports and traps. The ids load without a branch per id (int4 when aligned).
__device__ __forceinline__ uint32_t RankMask(const DispatchParams& p, int64_t t, uint64_t epoch) {
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

// Ends this pe's launch because pe `from` rejected the op (its inputs failed
// validation). The rejecting pe's own blocks trap at once, silently (it printed the
// reason); another pe says who rejected and traps only after a pause, so that the
// two processes' launches do not fail at the same instant: on one H200 shared by two
// processes, kernels that trapped together left the rejecting one's launch never
// ending in 10 of 20 runs; with the pause, 0 of 12 (the peer fails 1.3-1.4 s after
// its launch, the rejecting pe 0.5-0.8 s).
__device__ void TrapRejectedBy(const Common& c, int from, const char* op) {
  if (from != c.me) {
    printf(
        "mori.ep %s on rank %d: %s rejected by rank %d (its inputs failed validation; see its "
        "error)\n",
        op, c.me, op, from);
    const uint64_t pause = std::min<uint64_t>(c.timeout_ns / 2, kPeerTrapPauseNs);
    const uint64_t t0 = dev::GlobalTimerNs();
    while (dev::GlobalTimerNs() - t0 < pause) __nanosleep(100000);
  }
  dev::Trap();
}

// Warp 0: waits for every count word of `epoch` and stores the counts in
// `counts` (W x W). A rejection or an unexpected epoch traps with a message.
__device__ void WaitCountWords(const Common& c, uint64_t epoch, unsigned lane, uint32_t* counts) {
  const uint64_t* words = At<uint64_t>(c, c.layout.count_words);
  for (unsigned i = lane; i < static_cast<unsigned>(c.world * c.world); i += 32) {
    const uint64_t w = dev::WaitUntil(&words[i], Cmp::kGe, EpochFloor(epoch), c.timeout_ns);
    if (EpochOf(w) != (epoch & kEpochMask)) {
      printf(
          "mori.ep dispatch on rank %d: count word from rank %u has epoch %llu, expected "
          "%llu\n",
          c.me, i / c.world, static_cast<unsigned long long>(EpochOf(w)),
          static_cast<unsigned long long>(epoch));
      dev::Trap();
    }
    if (CountOf(w) == kRejectedCount) TrapRejectedBy(c, static_cast<int>(i / c.world), "dispatch");
    counts[i] = static_cast<uint32_t>(CountOf(w));
  }
}

// Release every put of the block, then count the block as finished; true in the
// one block that finishes last (it then sees every block's puts as released).
__device__ bool FinishBlock(uint32_t* blocks_done) {
  __shared__ bool last;
  dev::Quiet();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t prev = atomicAdd(blocks_done, 1u);
    last = prev == gridDim.x - 1;
    if (last) {
      __threadfence_system();
      *blocks_done = 0;  // every block has counted: the next launch starts at 0
    }
  }
  __syncthreads();
  return last;
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

// Scratch of the dynamic dispatch kernel: private device memory of the pe (not
// symmetric), zeroed once; words carry the epoch and the item counter is reset by the
// kernel's last block, so no launch clears them.
constexpr int kMaxBlocksPerSm = 32;  // the most resident blocks an SM takes (sm_90)
struct ScratchOffsets {
  size_t block_counts = 0, chunk_ready, token_rows, work, total;
  ScratchOffsets(int64_t blocks, int64_t max_tokens) {
    chunk_ready = AlignUp(blocks * kW * sizeof(uint64_t), 256);
    token_rows = chunk_ready + AlignUp(blocks * kW * sizeof(uint64_t), 256);
    work = token_rows + AlignUp(max_tokens * kW * sizeof(int32_t), 256);
    total = work + 256;
  }
};
struct DispatchScratch {
  uint64_t* block_counts;  // [block][kW] CountWord(epoch, tokens of the block's chunk to d)
  uint64_t* chunk_ready;   // [block * kW] epoch once the block's token_rows are written
  int32_t* token_rows;     // [M][kW] row of token t at pe d, -1 when not sent there
  uint32_t* work;          // (token, segment) items handed out; the last block resets it
};

// Block 0, warp 0: posts this pe's count row (totals[d] tokens to pe d) into every pe.
__device__ __forceinline__ void PostCountRow(const Common& c, uint64_t epoch, unsigned lane,
                                             const uint32_t* totals) {
  uint64_t* count_words = At<uint64_t>(c, c.layout.count_words);
  const int W = c.world;
  for (unsigned i = lane; i < static_cast<unsigned>(W * W); i += 32) {
    const int pe = static_cast<int>(i / W), d = static_cast<int>(i % W);
    dev::SignalSet(c.ctx, &count_words[c.me * W + d], CountWord(epoch, totals[d]), pe);
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
      dev::WaitUntil(&done[s], Cmp::kGe, epoch, c.timeout_ns);
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
      }
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
template <int kThreads, int kSeg>
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
  if (tid < kW) s_total[tid] = s_before[tid] = 0;
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
  if (blockIdx.x == 0 && warp == 0) PostCountRow(c, epoch, lane, s_total);
  if (warp == 0) WaitCountWords(c, epoch, lane, s_counts);
  __syncthreads();
  SetRowBases(c, s_counts, s_before, s_base, s_run);
  __syncthreads();
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
template <int kThreads, int kSeg>
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
  if (tid < kW) s_chunk[tid] = 0;
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
      PostCountRow(c, epoch, lane, s_total);
    }
    WaitCountWords(c, epoch, lane, s_counts);
  }
  if (warp == (nwarps > 1 ? 1u : 0u)) {
    WaitGridWords(c, s.block_counts, blockIdx.x, W, EpochFloor(epoch), lane, s_before,
                  "block counts");
  }
  __syncthreads();
  SetRowBases(c, s_counts, s_before, s_base, s_run);
  __syncthreads();
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

__global__ void RejectCombineKernel(Common c) {
  PostCombineWords(c, (State(c)->epoch << 1) | 1u, threadIdx.x, blockDim.x);
}

// Segment `seg` of received row i back to its source s, slot [me][t] there (with
// segment 0, its weights).
template <int kSeg>
__device__ __forceinline__ void ReturnRowSegment(const CombineParams& p, int64_t i, int s, int seg,
                                                 unsigned lane) {
  const Common& c = p.c;
  const int64_t M = c.max_tokens;
  const int64_t t = At<int32_t>(c, c.layout.recv_src_pos)[i] % M;
  const int64_t slot = static_cast<int64_t>(c.me) * M + t;
  const char* src_row = p.input + i * p.input_row_stride;
  if (p.vec) {
    const int64_t nwords = p.row_bytes / 16;
    const int4* src = reinterpret_cast<const int4*>(src_row);
    int4* dst = PeerAt<int4>(c, c.layout.comb_tokens + slot * p.combine_row_bytes, s);
    const int sw = p.ret_seg_words;
    const int64_t w0 = static_cast<int64_t>(seg) * sw * 32 + lane;
    int4 v[kSeg];
#pragma unroll
    for (int k = 0; k < kSeg; ++k) {
      const int64_t w = w0 + k * 32;
      v[k] = k < sw && w < nwords ? __ldg(src + w) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kSeg; ++k) {
      const int64_t w = w0 + k * 32;
      if (k < sw && w < nwords) dst[w] = v[k];
    }
  } else {
    dev::PutWarp_nbi(c.ctx, At<char>(c, c.layout.comb_tokens) + slot * p.combine_row_bytes, src_row,
                     p.row_bytes, s);
  }
  if (seg == 0 && p.out_weights != nullptr) {
    const int K = c.top_k;
    float* dst = PeerAt<float>(c, c.layout.comb_weights + slot * K * 4, s);
    for (int j = static_cast<int>(lane); j < K; j += 32) dst[j] = __ldg(p.weights + i * K + j);
  }
}

// Adds the 16-byte word `raw` (8 bf16 or 4 fp32 values) to acc.
template <bool kBf16>
__device__ __forceinline__ void Accumulate(float* acc, const uint4& raw) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (kBf16) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      acc[2 * v] += BFloat16ToFloat(w[v] & 0xFFFFu);
      acc[2 * v + 1] += BFloat16ToFloat(w[v] >> 16);
    }
  } else {
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[v] += __uint_as_float(w[v]);
  }
}

// The partial row pe d returned for my token t: my own from the combine input,
// the others' from their slots.
__device__ __forceinline__ const char* PartialRow(const CombineParams& p, int d, int64_t t,
                                                  int64_t self_row) {
  if (d == p.c.me) return p.input + self_row * p.input_row_stride;
  return At<char>(p.c, p.c.layout.comb_tokens) +
         (static_cast<int64_t>(d) * p.c.max_tokens + t) * p.combine_row_bytes;
}

// Columns [seg * kU * 512 B, ...) of my token t: the sum over the pes it went to,
// ascending, fp32, rounded once. Pes are taken two at a time so that 2 x kU loads
// per lane are in flight; the additions keep the ascending order.
template <int kU, bool kBf16>
__device__ __forceinline__ void ReduceSegment(const CombineParams& p, int64_t t, int seg,
                                              unsigned lane) {
  constexpr int kVals = kBf16 ? 8 : 4;
  const Common& c = p.c;
  const int W = c.world;
  const uint8_t* ranks = At<uint8_t>(c, c.layout.token_ranks) + t * W;
  const int64_t self_row = At<int32_t>(c, c.layout.token_self_row)[t];
  const int64_t nwords = p.row_bytes / 16;
  const int64_t w0 = static_cast<int64_t>(seg) * kU * 32 + lane;
  float acc[kU][kVals];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
#pragma unroll
    for (int v = 0; v < kVals; ++v) acc[k][v] = 0.0f;
  }
#pragma unroll
  for (int d0 = 0; d0 < kW; d0 += 2) {
    if (d0 >= W) break;
    const bool a = ranks[d0] != 0;
    const bool b = d0 + 1 < W && ranks[d0 + 1] != 0;
    const uint4* ra = reinterpret_cast<const uint4*>(PartialRow(p, d0, t, self_row));
    const uint4* rb = reinterpret_cast<const uint4*>(PartialRow(p, d0 + 1, t, self_row));
    uint4 va[kU], vb[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int64_t w = w0 + k * 32;
      va[k] = a && w < nwords ? __ldcg(ra + w) : make_uint4(0, 0, 0, 0);
      vb[k] = b && w < nwords ? __ldcg(rb + w) : make_uint4(0, 0, 0, 0);
    }
    if (a) {
#pragma unroll
      for (int k = 0; k < kU; ++k) Accumulate<kBf16>(acc[k], va[k]);
    }
    if (b) {
#pragma unroll
      for (int k = 0; k < kU; ++k) Accumulate<kBf16>(acc[k], vb[k]);
    }
  }
  uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.out) + t * p.row_bytes);
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t w = w0 + k * 32;
    if (w >= nwords) continue;
    if constexpr (kBf16) {
      uint32_t o[4];
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        o[v] = FloatToBFloat16(acc[k][2 * v]) |
               (static_cast<uint32_t>(FloatToBFloat16(acc[k][2 * v + 1])) << 16);
      }
      out[w] = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
      out[w] = make_uint4(__float_as_uint(acc[k][0]), __float_as_uint(acc[k][1]),
                          __float_as_uint(acc[k][2]), __float_as_uint(acc[k][3]));
    }
  }
}

// Any row layout: one warp reduces all of token t, element by element.
__device__ void ReduceTokenScalar(const CombineParams& p, int64_t t, unsigned lane) {
  const Common& c = p.c;
  const uint8_t* ranks = At<uint8_t>(c, c.layout.token_ranks) + t * c.world;
  const int64_t self_row = At<int32_t>(c, c.layout.token_self_row)[t];
  char* out_row = static_cast<char*>(p.out) + t * p.row_bytes;
  for (int64_t h = lane; h < p.hidden; h += 32) {
    float acc = 0.0f;
    for (int d = 0; d < c.world; ++d) {
      if (!ranks[d]) continue;
      const char* row = PartialRow(p, d, t, self_row);
      acc += p.bfloat16 ? BFloat16ToFloat(__ldcg(reinterpret_cast<const uint16_t*>(row) + h))
                        : __ldcg(reinterpret_cast<const float*>(row) + h);
    }
    if (p.bfloat16) {
      reinterpret_cast<uint16_t*>(out_row)[h] = FloatToBFloat16(acc);
    } else {
      reinterpret_cast<float*>(out_row)[h] = acc;
    }
  }
}

__device__ __forceinline__ void ReduceWeights(const CombineParams& p, int64_t t, unsigned lane) {
  const Common& c = p.c;
  const int K = c.top_k;
  const int64_t M = c.max_tokens;
  const uint8_t* ranks = At<uint8_t>(c, c.layout.token_ranks) + t * c.world;
  const int64_t self_row = At<int32_t>(c, c.layout.token_self_row)[t];
  const float* comb_weights = At<float>(c, c.layout.comb_weights);
  for (int j = static_cast<int>(lane); j < K; j += 32) {
    float acc = 0.0f;
    for (int d = 0; d < c.world; ++d) {
      if (!ranks[d]) continue;
      acc += d == c.me ? __ldg(p.weights + self_row * K + j)
                       : __ldcg(comb_weights + (static_cast<int64_t>(d) * M + t) * K + j);
    }
    p.out_weights[t * K + j] = acc;
  }
}

// One reduce item: segment `seg` of token t's row (the whole row without vector
// access), and with segment 0 the token's weights. Shared by both combine paths.
template <int kU>
__device__ __forceinline__ void ReduceItem(const CombineParams& p, int64_t t, int seg,
                                           unsigned lane) {
  if (!p.vec) {
    ReduceTokenScalar(p, t, lane);
  } else if (p.bfloat16) {
    ReduceSegment<kU, true>(p, t, seg, lane);
  } else {
    ReduceSegment<kU, false>(p, t, seg, lane);
  }
  if (seg == 0 && p.out_weights != nullptr) ReduceWeights(p, t, lane);
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
    if (pe != c.me) dev::SignalSet(c.ctx, &done[c.me * G + g0 + i / c.world], epoch << 1, pe);
  }
}

// Traps when pe d's combine word `v` carries a rejection.
__device__ __forceinline__ void CheckCombineWord(const Common& c, int d, uint64_t v) {
  if (v & 1u) TrapRejectedBy(c, d, "combine");
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
    CheckCombineWord(c, d, dev::WaitUntil(&done[d * G + g], Cmp::kGe, epoch << 1, c.timeout_ns));
  }
  __syncwarp();
}

// The tiled path: each block walks tiles of token groups in increasing order,
// returning tile j's rows, posting its groups' words, then reducing tile j - 1 once
// the peers' words of it arrived, so reductions of early groups overlap the
// transfers of later ones.
template <int kThreads>
__device__ void CombineTiles(const CombineParams& p, uint64_t epoch, int64_t total) {
  constexpr int kU = kReduceWords<kThreads>;
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
  const int32_t* group_row = At<int32_t>(c, c.layout.recv_group_row);
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
          ReturnRowSegment<kSegWords<kThreads>>(p, s_lo[s] + r, s,
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
          CheckCombineWord(
              c, d, dev::WaitUntil(&done[d * G + h0 + i / W], Cmp::kGe, epoch << 1, c.timeout_ns));
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
          ReduceItem<kU>(p, t, seg, lane);
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
template <int kThreads>
__device__ void CombineOnePass(const CombineParams& p, uint64_t epoch, int64_t total) {
  constexpr int kU = kReduceWords<kThreads>;
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
  const int32_t* own = At<int32_t>(c, c.layout.recv_group_row) + static_cast<int64_t>(me) * (G + 1);
  const int64_t own_lo = __ldcg(own), own_hi = __ldcg(own + G);
  const int32_t* src_pos = At<int32_t>(c, c.layout.recv_src_pos);
  const int nseg_ret = p.nseg_ret;
  const int64_t ret_items = (total - (own_hi - own_lo)) * nseg_ret;
  for (int64_t item = gwarp; item < ret_items; item += gwarps) {
    int64_t i = item / nseg_ret;
    if (i >= own_lo) i += own_hi - own_lo;
    const int s = static_cast<int>(src_pos[i] / M);
    ReturnRowSegment<kSegWords<kThreads>>(p, i, s, static_cast<int>(item % nseg_ret), lane);
  }

  // 2. The last block to finish (it sees every block's returns as performed) posts
  // every group's word to every other pe.
  if (FinishBlock(&State(c)->combine_blocks_done)) {
    for (int64_t i = tid; i < G * W; i += blockDim.x) {
      const int pe = static_cast<int>(i % W);
      if (pe != me) dev::SignalSet(c.ctx, &done[me * G + i / W], epoch << 1, pe);
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
    ReduceItem<kU>(p, t, seg, lane);
  }
}

// The block's reduce: (token, segment) items of tokens [t_lo, t_hi) in order, taken
// from the block's counter *next, each waiting (lane d for pe d) for its group's
// words; a warp waits once per group.
template <int kU>
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
    ReduceItem<kU>(p, t, seg, lane);
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
template <int kThreads>
__device__ void CombineStream(const CombineParams& p, uint64_t epoch) {
  constexpr int kU = kReduceWords<kThreads>;
  constexpr int kSeg = kSegWords<kThreads>;
  const Common& c = p.c;
  const int W = c.world, me = c.me;
  const int64_t G = CombineGroups(c.max_tokens);
  const unsigned tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned R = static_cast<unsigned>(p.return_warps);
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
  const int32_t* group_row = At<int32_t>(c, c.layout.recv_group_row);
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
          ReturnRowSegment<kSeg>(p, fs + r, s, static_cast<int>(item % nseg_ret), lane);
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
            if (pe != me) dev::SignalSet(c.ctx, &done[me * G + g0 + i / W], epoch << 1, pe);
          }
        }
      }
    }
    Stamp(p.stamps, 1, tid == 0);
  }

  // Reduce: (token, segment) items of range 1's tokens, in order, from s_next.
  ReduceTokenRange<kU>(p, epoch, std::min(n, r1lo * kGroupTokens), std::min(n, r1hi * kGroupTokens),
                       nseg_red, &s_next, warp == R);
  if (p.stamps != nullptr) {
    __syncthreads();
    Stamp(p.stamps, 3);
  }
}

// kPath picks the path on the host (IntraNodeCuda::Combine): one kernel per path
// keeps each path's register allocation its own (both in one kernel spilled 248 B
// in the 512-thread build).
enum CombinePath : int { kTiledPath = 0, kOnePassPath = 1, kStreamPath = 2 };

template <int kThreads, int kPath>
__global__ void __launch_bounds__(kThreads) CombineKernel(CombineParams p) {
  const Common& c = p.c;
  const int W = c.world, me = c.me;
  const int64_t G = CombineGroups(c.max_tokens);
  const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned nthreads = blockDim.x;
  const uint64_t epoch = State(c)->epoch;
  const int64_t total = *At<int32_t>(c, c.layout.total_recv);
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
      }
      PostCombineWords(c, (epoch << 1) | 1u, tid, nthreads);
      dev::Quiet();
      __syncthreads();
      if (tid == 0) dev::Trap();
    }
    return;
  }

  if constexpr (kPath == kOnePassPath) {
    Stamp(p.stamps, 0);
    CombineOnePass<kThreads>(p, epoch, total);
    Stamp(p.stamps, 3);
  } else if constexpr (kPath == kStreamPath) {
    CombineStream<kThreads>(p, epoch);
  } else {
    Stamp(p.stamps, 0);
    CombineTiles<kThreads>(p, epoch, total);
    Stamp(p.stamps, 3);
  }
  // A pe with no tokens waits for nothing above; it still must see a rejection
  // posted in this epoch (every group carries it), so block 0 checks the last group.
  if (p.num_tokens == 0 && blockIdx.x == 0 && warp == 0) {
    for (int d = static_cast<int>(lane); d < W; d += 32) {
      if (d == me) continue;
      CheckCombineWord(c, d,
                       dev::WaitUntil(&done[d * G + G - 1], Cmp::kGe, epoch << 1, c.timeout_ns));
    }
  }
}

// The dispatch kernel for a block of `threads` (kNarrowThreads or kMaxThreads)
// moving kseg-word segments (4 or 8; the 1024-thread build takes 4).
const void* DispatchKernelFor(int threads, int kseg, bool dynamic) {
  if (threads > kNarrowThreads) {
    return dynamic ? reinterpret_cast<const void*>(DispatchDynamicKernel<kMaxThreads, 4>)
                   : reinterpret_cast<const void*>(DispatchKernel<kMaxThreads, 4>);
  }
  if (kseg == 4) {
    return dynamic ? reinterpret_cast<const void*>(DispatchDynamicKernel<kNarrowThreads, 4>)
                   : reinterpret_cast<const void*>(DispatchKernel<kNarrowThreads, 4>);
  }
  return dynamic ? reinterpret_cast<const void*>(DispatchDynamicKernel<kNarrowThreads, 8>)
                 : reinterpret_cast<const void*>(DispatchKernel<kNarrowThreads, 8>);
}

// The combine kernel of `path` for a block of `threads`.
const void* CombineKernelFor(int threads, int path) {
  auto pick = [path](auto tiled, auto onepass, auto stream) {
    return path == kOnePassPath  ? reinterpret_cast<const void*>(onepass)
           : path == kStreamPath ? reinterpret_cast<const void*>(stream)
                                 : reinterpret_cast<const void*>(tiled);
  };
  if (threads > kNarrowThreads) {
    return pick(CombineKernel<kMaxThreads, kTiledPath>, CombineKernel<kMaxThreads, kOnePassPath>,
                CombineKernel<kMaxThreads, kStreamPath>);
  }
  return pick(CombineKernel<kNarrowThreads, kTiledPath>,
              CombineKernel<kNarrowThreads, kOnePassPath>,
              CombineKernel<kNarrowThreads, kStreamPath>);
}

// A warp moves a row of `nwords` 16-byte words in segments of at most kseg words per
// lane: as few segments as kseg allows, with the words spread evenly over them (a
// 14336-byte bf16 row at kseg 8: 4 segments of 7 words instead of 3 of 8 and one of
// 4), or, with even false, full kseg-word segments and a short last one.
void SplitRow(int64_t nwords, int kseg, bool even, int* seg_words, int* nseg) {
  const int64_t per_lane = std::max<int64_t>(1, (nwords + 31) / 32);
  const int64_t n = (per_lane + kseg - 1) / kseg;
  *nseg = static_cast<int>(n);
  *seg_words = even ? static_cast<int>((per_lane + n - 1) / n) : kseg;
}

}  // namespace

IntraNodeCuda::IntraNodeCuda(const EpShape& shape, void* block, int device,
                             std::chrono::milliseconds timeout)
    : shape_(shape),
      layout_(MakeLayout(shape)),
      block_(static_cast<char*>(block)),
      device_(device),
      timeout_ns_(static_cast<uint64_t>(timeout.count()) * 1000000ull),
      ctx_(shmem::GetDeviceContext()) {
  MORI_CHECK_ARG(ctx_.n_pes == shape.world_size, "world_size ", shape.world_size,
                 " differs from the heap's n_pes ", ctx_.n_pes);
  MORI_CHECK_ARG(ctx_.my_pe == shape.rank, "rank ", shape.rank, " differs from the heap's my_pe ",
                 ctx_.my_pe);
  if (shape.world_size > kMaxCudaWorldSize) {
    MORI_THROW(NotSupportedError, "the CUDA intra-node kernels take world sizes up to ",
               kMaxCudaWorldSize, ", got ", shape.world_size);
  }
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the op's buffer is not a symmetric block of ", layout_.total_bytes, " bytes");
  for (int pe = 0; pe < ctx_.n_pes; ++pe) {
    if (shmem::Ptr(block, pe) == nullptr) {
      MORI_THROW(NotSupportedError, "intra-node dispatch/combine needs every pe on this node, ",
                 "but pe ", pe, " is not load/store reachable from pe ", ctx_.my_pe);
    }
  }
  // Tuning knobs for measurements: combine tiles per block (pipeline depth),
  if (const char* v = std::getenv("MORI_EP_COMBINE_STEPS"))
    combine_steps_ = std::max(1, std::atoi(v));
  // and 16-byte words per lane a dispatch warp moves at once (4 or 8).
  if (const char* v = std::getenv("MORI_EP_DISPATCH_SEG"))
    dispatch_seg_ = std::atoi(v) == 4 ? 4 : 8;
  // and whether combine splits each block's warps between returning and reducing.
  if (const char* v = std::getenv("MORI_EP_COMBINE_SPLIT")) combine_split_ = std::atoi(v) != 0;
  // and up to how many received rows per block combine takes the one-pass path (0: never).
  if (const char* v = std::getenv("MORI_EP_COMBINE_ONEPASS_ROWS"))
    combine_onepass_rows_ = std::max(0, std::atoi(v));
  // and whether the streaming combine replaces the tiled one (0: tiled),
  if (const char* v = std::getenv("MORI_EP_COMBINE_STREAM")) combine_stream_ = std::atoi(v) != 0;
  // its return warps per block (0: half the block) and groups per posted step (0: auto),
  if (const char* v = std::getenv("MORI_EP_COMBINE_RETURN_WARPS"))
    combine_return_warps_ = std::max(0, std::atoi(v));
  if (const char* v = std::getenv("MORI_EP_COMBINE_STEP_GROUPS"))
    combine_step_groups_ = std::max(0, std::atoi(v));
  // whether combine's returned row segments spread a row's words evenly (SplitRow),
  if (const char* v = std::getenv("MORI_EP_EVEN_SEG")) even_segments_ = std::atoi(v) != 0;
  // whether dispatch hands (token, segment) items out dynamically (1), each block
  // moves its own chunk (0, the static kernel), or auto: dynamic from
  // MORI_EP_DISPATCH_DYNAMIC_TOKENS tokens up,
  if (const char* v = std::getenv("MORI_EP_DISPATCH_DYNAMIC"))
    dispatch_dynamic_ = std::atoi(v) != 0 ? 1 : 0;
  if (const char* v = std::getenv("MORI_EP_DISPATCH_DYNAMIC_TOKENS"))
    dispatch_dynamic_tokens_ = std::max(0, std::atoi(v));
  // and per-phase timestamps of the last calls (Timeline()).
  if (const char* v = std::getenv("MORI_EP_TIMELINE"); v != nullptr && std::atoi(v) != 0) {
    mori::cuda::ScopedDevice guard(device_);
    MORI_CUDA_CHECK(cudaMalloc(&stamps_, 2 * kTimelineBlocks * kTimelineStamps * sizeof(uint64_t)));
    MORI_CUDA_CHECK(
        cudaMemset(stamps_, 0, 2 * kTimelineBlocks * kTimelineStamps * sizeof(uint64_t)));
  }
  mori::cuda::ScopedDevice guard(device_);
  MORI_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  MORI_CUDA_CHECK(cudaMemset(block_, 0, SignalBytes(layout_)));
  // The dynamic dispatch's scratch, for every grid that can be resident (at most
  // kMaxBlocksPerSm blocks per SM).
  scratch_blocks_ = sm_count_ * kMaxBlocksPerSm;
  const size_t scratch_bytes = ScratchOffsets(scratch_blocks_, shape_.max_tokens).total;
  MORI_CUDA_CHECK(cudaMalloc(&scratch_, scratch_bytes));
  MORI_CUDA_CHECK(cudaMemset(scratch_, 0, scratch_bytes));
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  shmem::BarrierAll();
}

IntraNodeCuda::~IntraNodeCuda() {
  mori::cuda::ScopedDevice guard(device_);
  // Never throw from a destructor; a failure leaks the buffer.
  if (stamps_ != nullptr) cudaFree(stamps_);
  if (scratch_ != nullptr) cudaFree(scratch_);
}

uint64_t* IntraNodeCuda::TimelineSlot(int kernel, int blocks, uintptr_t stream) {
  if (stamps_ == nullptr) return nullptr;
  uint64_t* slot = stamps_ + static_cast<size_t>(kernel) * kTimelineBlocks * kTimelineStamps;
  MORI_CUDA_CHECK(cudaMemsetAsync(slot, 0, kTimelineBlocks * kTimelineStamps * sizeof(uint64_t),
                                  reinterpret_cast<cudaStream_t>(stream)));
  timeline_blocks_[kernel] = std::min(blocks, kTimelineBlocks);
  return slot;
}

std::string IntraNodeCuda::Timeline() {
  if (stamps_ == nullptr) return "";
  mori::cuda::ScopedDevice guard(device_);
  std::vector<uint64_t> h(2 * kTimelineBlocks * kTimelineStamps);
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  MORI_CUDA_CHECK(
      cudaMemcpy(h.data(), stamps_, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  static const char* const kNames[2][kTimelineStamps] = {
      {"start", "routed", "counts", "scanned", "rows", "quiet", "done", ""},
      {"start", "returned", "first_reduce", "end", "", "", "", ""}};
  std::string text;
  uint64_t dispatch_end = 0;
  for (int k = 0; k < 2; ++k) {
    const uint64_t* base = h.data() + static_cast<size_t>(k) * kTimelineBlocks * kTimelineStamps;
    const int blocks = timeline_blocks_[k];
    uint64_t t0 = ~uint64_t{0};
    for (int b = 0; b < blocks; ++b) {
      if (base[b * kTimelineStamps] != 0) t0 = std::min(t0, base[b * kTimelineStamps]);
    }
    if (blocks == 0 || t0 == ~uint64_t{0}) continue;
    text += StrCat(k == 0 ? "dispatch" : "combine", " (", blocks, " blocks; us from the first ",
                   "block's start: min/median/max over blocks)");
    if (k == 1 && dispatch_end != 0 && t0 > dispatch_end) {
      text += StrCat(" starts ", (t0 - dispatch_end) / 1e3, " us after the dispatch's done");
    }
    text += "\n";
    for (int j = 0; j < kTimelineStamps; ++j) {
      std::vector<double> v;
      for (int b = 0; b < blocks; ++b) {
        const uint64_t x = base[b * kTimelineStamps + j];
        if (x != 0) v.push_back((x - t0) / 1e3);
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      if (k == 0 && j == 6) dispatch_end = t0 + static_cast<uint64_t>(v.back() * 1e3);
      char line[160];
      std::snprintf(line, sizeof(line), "  %-13s %4zu blocks %8.1f %8.1f %8.1f\n", kNames[k][j],
                    v.size(), v.front(), v[v.size() / 2], v.back());
      text += line;
    }
  }
  return text;
}

int IntraNodeCuda::MaxResidentBlocks(bool dispatch, int warps) {
  MORI_CHECK_ARG(warps >= 1 && warps <= kMaxWarpsPerBlock, "warp_per_block ", warps,
                 " must be in [1, ", kMaxWarpsPerBlock, "]");
  int& cached = max_blocks_[dispatch ? 1 : 0][warps];
  if (cached == 0) {
    int per_sm = 0;
    const bool narrow = warps * 32 <= kNarrowThreads;
    auto occupancy = [&](const void* kernel) {
      int n = 0;
      MORI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, warps * 32, 0));
      return n;
    };
    if (dispatch) {  // either kernel may run on the grid: the smaller bound holds
      const int threads = !narrow ? kMaxThreads : kNarrowThreads, seg = !narrow ? 4 : dispatch_seg_;
      per_sm = std::min(occupancy(DispatchKernelFor(threads, seg, false)),
                        occupancy(DispatchKernelFor(threads, seg, true)));
    } else {  // any combine path may run on the grid: the smallest bound holds
      per_sm = occupancy(CombineKernelFor(narrow ? kNarrowThreads : kMaxThreads, kTiledPath));
      for (int path : {kOnePassPath, kStreamPath}) {
        per_sm = std::min(per_sm,
                          occupancy(CombineKernelFor(narrow ? kNarrowThreads : kMaxThreads, path)));
      }
    }
    MORI_CHECK(per_sm > 0, "the ", dispatch ? "dispatch" : "combine", " kernel cannot run with ",
               warps, " warps per block on device ", device_);
    cached = per_sm * sm_count_;
  }
  return cached;
}

LaunchShape IntraNodeCuda::Resolve(LaunchShape launch, bool dispatch) {
  MORI_CHECK_ARG(launch.block_num >= 1, "block_num ", launch.block_num, " must be >= 1");
  // Blocks wait for signals of other blocks of the grid: all must be resident.
  launch.block_num = std::min(launch.block_num, MaxResidentBlocks(dispatch, launch.warp_per_block));
  return launch;
}

void IntraNodeCuda::Dispatch(const DispatchArgs& a, LaunchShape launch, uintptr_t stream) {
  const int64_t M = shape_.max_tokens;
  if (a.num_tokens < 0 || a.num_tokens > M) {
    RejectDispatch(StrCat("num_tokens ", a.num_tokens, " exceeds max_num_inp_token_per_rank ", M),
                   stream);
  }
  if (a.token_row_bytes > shape_.hidden_bytes) {
    RejectDispatch(StrCat("token rows of ", a.token_row_bytes, " bytes exceed hidden_dim * ",
                          "max_token_type_size = ", shape_.hidden_bytes, " bytes"),
                   stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  launch = Resolve(launch, true);
  DispatchParams p{};
  p.c = Common{ctx_, block_, layout_, shape_.world_size, shape_.rank, shape_.top_k, M, timeout_ns_};
  p.experts_per_rank = shape_.num_experts_per_rank;
  p.num_experts = shape_.num_experts_per_rank * shape_.world_size;
  p.hidden_bytes = shape_.hidden_bytes;
  p.row_bytes = a.token_row_bytes;
  p.scale_bytes = shape_.scale_bytes;
  p.tokens = static_cast<const char*>(a.tokens);
  p.weights = a.weights;
  p.scales = static_cast<const char*>(a.scales);
  p.indices = a.indices;
  p.num_tokens = a.num_tokens;
  auto aligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a == 0;
  };
  p.vec = p.row_bytes % 16 == 0 && p.hidden_bytes % 16 == 0 && aligned(p.tokens, 16);
  p.indices_vec = shape_.top_k % 4 == 0 && aligned(p.indices, 16);
  p.meta_staged = p.scale_bytes % 4 == 0 && aligned(p.scales, 4) &&
                  2 * shape_.top_k + p.scale_bytes / 4 + 1 <= 32 * kMetaWords;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  p.stamps = TimelineSlot(0, launch.block_num, stream);
  const unsigned threads = launch.warp_per_block * 32;
  const bool narrow = threads <= kNarrowThreads;
  MORI_CHECK(launch.block_num <= scratch_blocks_, "dispatch grid of ", launch.block_num,
             " blocks exceeds the scratch for ", scratch_blocks_);
  const ScratchOffsets o(scratch_blocks_, shape_.max_tokens);
  DispatchScratch scratch{reinterpret_cast<uint64_t*>(scratch_ + o.block_counts),
                          reinterpret_cast<uint64_t*>(scratch_ + o.chunk_ready),
                          reinterpret_cast<int32_t*>(scratch_ + o.token_rows),
                          reinterpret_cast<uint32_t*>(scratch_ + o.work)};
  const bool dynamic =
      dispatch_dynamic_ < 0 ? a.num_tokens >= dispatch_dynamic_tokens_ : dispatch_dynamic_ != 0;
  void* args[] = {&p, &scratch};
  MORI_CUDA_CHECK(cudaLaunchKernel(
      DispatchKernelFor(narrow ? kNarrowThreads : kMaxThreads, narrow ? dispatch_seg_ : 4, dynamic),
      dim3(launch.block_num), dim3(threads), args, 0, s));
  MORI_CUDA_CHECK(cudaGetLastError());
  ++epoch_;
  num_tokens_ = a.num_tokens;
  combine_pending_ = true;
}

void IntraNodeCuda::RejectDispatch(const std::string& reason, uintptr_t stream) {
  {
    mori::cuda::ScopedDevice guard(device_);
    Common c{ctx_,        block_,       layout_,           shape_.world_size,
             shape_.rank, shape_.top_k, shape_.max_tokens, timeout_ns_};
    RejectDispatchKernel<<<1, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(c);
    MORI_CUDA_CHECK(cudaGetLastError());
  }
  ++epoch_;
  combine_pending_ = false;
  throw InvalidArgumentError(reason);
}

void IntraNodeCuda::Combine(const CombineArgs& a, LaunchShape launch, uintptr_t stream) {
  if (!combine_pending_) {
    MORI_THROW(InvalidStateError, "combine needs a successful dispatch since the last combine ",
               "(epoch ", epoch_, ")");
  }
  const int64_t elem = a.dtype == CombineDtype::kBFloat16 ? 2 : 4;
  const int64_t row_bytes = shape_.hidden_dim * elem;
  if (row_bytes > shape_.combine_row_bytes) {
    RejectCombine(StrCat("combine rows of ", row_bytes, " bytes exceed the combine buffer's ",
                         shape_.combine_row_bytes, " (hidden_dim * max(max_token_type_size, 2))"),
                  stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  launch = Resolve(launch, false);
  CombineParams p{};
  p.c = Common{ctx_,        block_,       layout_,           shape_.world_size,
               shape_.rank, shape_.top_k, shape_.max_tokens, timeout_ns_};
  p.hidden = shape_.hidden_dim;
  p.combine_row_bytes = shape_.combine_row_bytes;
  p.row_bytes = row_bytes;
  p.input = static_cast<const char*>(a.input);
  p.input_row_stride = a.input_row_stride;
  p.input_rows = a.input_rows;
  p.bfloat16 = a.dtype == CombineDtype::kBFloat16;
  p.weights = a.weights;
  p.out = a.out;
  p.out_weights = a.out_weights;
  p.num_tokens = num_tokens_;
  auto aligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a == 0;
  };
  p.vec = row_bytes % 16 == 0 && p.combine_row_bytes % 16 == 0 && p.input_row_stride % 16 == 0 &&
          aligned(p.input, 16) && aligned(p.out, 16);
  p.steps = combine_steps_;
  p.split = combine_split_;
  // Few rows per block: the one-pass path. total_recv is only on the device, so the
  // host bounds it by num_tokens x world (balanced ranks); either path reads the other
  // path's words, so a wrong guess costs time, never correctness, and pes need not
  // agree.
  const bool onepass = combine_onepass_rows_ > 0 &&
                       num_tokens_ * shape_.world_size <=
                           static_cast<int64_t>(combine_onepass_rows_) * launch.block_num;
  // The streaming path needs a return warp and a reducing one per block.
  const int warps = launch.warp_per_block;
  const bool stream_path = !onepass && combine_stream_ && warps >= 2;
  const int path = onepass ? kOnePassPath : stream_path ? kStreamPath : kTiledPath;
  p.ret_seg_words = 1;
  p.nseg_ret = 1;
  if (p.vec) {
    SplitRow(row_bytes / 16,
             warps * 32 <= kNarrowThreads ? kSegWords<kNarrowThreads> : kSegWords<kMaxThreads>,
             even_segments_, &p.ret_seg_words, &p.nseg_ret);
  }
  p.return_warps =
      std::clamp(combine_return_warps_ > 0 ? combine_return_warps_ : warps / 2, 1, warps - 1);
  {
    // Groups per posted step: about kStepItems (row, segment) items per return warp,
    // counting a group as full (kCombineGroupTokens rows from every other pe).
    constexpr int64_t kStepItems = 6;
    const int64_t per_group = std::max<int64_t>(
        1, int64_t{kCombineGroupTokens} * std::max(1, shape_.world_size - 1) * p.nseg_ret);
    p.step_groups = combine_step_groups_ > 0
                        ? combine_step_groups_
                        : static_cast<int>(std::max<int64_t>(
                              1, (kStepItems * p.return_warps + per_group - 1) / per_group));
  }
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  p.stamps = TimelineSlot(1, launch.block_num, stream);
  const unsigned threads = launch.warp_per_block * 32;
  void* args[] = {&p};
  MORI_CUDA_CHECK(cudaLaunchKernel(CombineKernelFor(threads, path), dim3(launch.block_num),
                                   dim3(threads), args, 0, s));
  MORI_CUDA_CHECK(cudaGetLastError());
  combine_pending_ = false;
}

void IntraNodeCuda::RejectCombine(const std::string& reason, uintptr_t stream) {
  if (combine_pending_) {
    mori::cuda::ScopedDevice guard(device_);
    Common c{ctx_,        block_,       layout_,           shape_.world_size,
             shape_.rank, shape_.top_k, shape_.max_tokens, timeout_ns_};
    RejectCombineKernel<<<1, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(c);
    MORI_CUDA_CHECK(cudaGetLastError());
    combine_pending_ = false;
  }
  throw InvalidArgumentError(reason);
}

}  // namespace mori::ep
