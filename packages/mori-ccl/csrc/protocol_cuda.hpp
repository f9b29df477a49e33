// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The collectives' protocol on a CUDA symmetric heap (collectives.cu): the block
// layout, the call descriptor and the signal words. Plain C++, no CUDA types.
//
// Pull model, as on host heaps (protocol.hpp): a rank writes its input into its own
// symmetric staging buffer and reads its peers' buffers through the heap's peer
// mappings; it writes into peers only signal words. One kernel per call, on the
// caller's stream; block b of every rank handles the same byte ranges, so block b
// exchanges signals only with block b of its peers (no grid-wide wait).
//
// Per call e (the device-resident call counter, state.epoch + 1, the same on every
// rank; the block that finishes last stores e back):
//   1. block b copies its ranges of the input into staging[e % 2];
//   2. it posts Word(e, hash) into arrive[e % 2][b][me] of every pe (release), after
//      every thread's stores were fenced; `hash` digests the call's descriptor
//      (collective, dtype, op, algorithm, bytes, row bytes, root, blocks);
//   3. it waits for arrive[e % 2][b][s] of every s (acquire, bounded by the
//      timeout): a word of call e whose hash differs from this rank's traps naming
//      both ranks' descriptors (read from the peer's desc[e % 2]); kRejectedHash
//      means the peer's inputs failed validation on its host;
//   4. it reads the peers' staging (two-shot: reduces its shard piece into
//      reduced[e % 2], posts ready[e % 2][b][me], waits for every ready, gathers).
// Why two parities and no "done" signal: a rank writes staging/reduced of parity p
// in call e only after its call e - 1 saw every peer arrive at e - 1, so every peer
// had finished call e - 2 (stream order), the last one that read parity p. A peer
// is at most one call ahead (it cannot finish a call without this rank's arrival),
// so arrive[p] of call e is never overwritten by call e + 2 before it is read.
//
// Zero-copy calls (desc.zero_copy: this rank's input lies in the heap, so the peers
// read it where it lies; SM algorithms except one_shot_ll): step 1 is replaced by
// storing the input's offset from the heap's base into sources[e % 2][me] of every pe
// (released by the arrive word that follows), and a reader takes pe s's input at
// peer_bases[s] + sources[e % 2][s]. Because the input is the caller's and may be
// overwritten by the next work on its stream, block b posts ready[e % 2][b][me] once
// it has read its ranges of every peer's input and waits for every peer's before the
// kernel ends ("done reading": one more flag exchange). An output that overlaps the
// part of the input peers read (in-place one-shot, an overlapping reduce-scatter
// output, an all-gather input in another rank's slot) is written after that wait,
// from a copy of the result in this rank's staging (no peer reads it in a
// zero-copy call). Two-shot needs no extra exchange: its ready words already mean
// that every peer has read its shard of this rank's input, and a rank writes its own
// shard of the output only with the values it has just read from the same address.
// Broadcast: only the root's input is read, so only the root waits for the ready
// words. The flag is part of the hash, so every rank must make the same choice.
//
// Copy-engine calls (all-gather, all-to-all with equal splits): a one-warp kernel
// posts Word(e, hash) into arrive[e % 2][0] of every pe and waits for every pe's
// (every peer has finished call e - 1, which read ce_staging; a peer making another
// call sees the hash differ in block 0), cudaMemcpyAsync copies the input
// into ce_staging, a second one-warp kernel posts and waits ce_staged and stores the
// epoch, then one cudaMemcpyAsync per pe pulls from that pe's ce_staging.
//
// Block layout (offsets in bytes, W = world size, K = kMaxBlocks, B = max_bytes):
//   state       CudaCallState      local: epoch, blocks finished, print latch
//   arrive      u64 [2][K][W]      [p][b][s]: last word block b of pe s posted, parity p
//   ready       u64 [2][K][W]      two-shot: reduced shard piece published; zero-copy:
//                                  block b has read its ranges of every peer's input
//   ce_staged   u64 [W]
//   desc        CallDesc [2]       this rank's descriptor of its last call of parity p
//   rows        i64 [2][2][W]      all-to-all: [p][0] the rows this rank sends to each
//                                  rank, [p][1] the rows it expects from each
//   sources     i64 [2][W]         zero-copy: [p][s] pe s's input, from its heap's base
//   staging     u8  [2][B]
//   reduced     u8  [2][B]
//   ce_staging  u8  [B]
//   ll          u64 [2][W][L + 1]  one_shot_ll packets (L = min(B, kLLMaxBytes) / 4):
//                                  [p][s][0] = flag << 32 | hash, posted by pe s (release);
//                                  [p][s][1 + i] = flag << 32 | 32-bit word i of pe s's
//                                  input, flag = the low 32 bits of the call number
//
// one_shot_ll ("data is its own flag"): each rank stores its input, 4 bytes per 8-byte
// packet tagged with the call's flag, into its slot of every peer's ll[e % 2], and
// reads each peer's packets as their flags turn to this call's: one pass, no separate
// flag exchange. The parity argument above covers the packets too (every call, of any
// kind, hears from every peer).

#include <cstddef>
#include <cstdint>

#include "protocol.hpp"

namespace mori::ccl {

inline constexpr int kMaxBlocks = 64;
inline constexpr int kMaxCudaWorld = 8;
inline constexpr int kThreadsPerBlock = 512;
// Bytes of input per block before another block is added (up to max_blocks).
inline constexpr int64_t kBytesPerBlock = 16 << 10;
inline constexpr uint32_t kHashBits = 24;
inline constexpr uint32_t kHashMask = (1u << kHashBits) - 1;
inline constexpr uint32_t kRejectedHash = kHashMask;
// The largest input of the low-latency one-shot all-reduce.
inline constexpr size_t kLLMaxBytes = 256 << 10;

// Algorithms beyond AllReduceAlgorithm's, as stored in CallDesc::algorithm.
enum class CudaAlgorithm : int32_t {
  kOneShot = 0,
  kTwoShot = 1,
  kSm = 2,          // all-gather / all-to-all / broadcast / reduce-scatter by SM loads
  kCopyEngine = 3,  // all-gather / all-to-all by cudaMemcpyAsync over peer mappings
  kOneShotLL = 4,   // all-reduce, packets that carry their own flag
};

struct CudaCallState {
  uint64_t epoch;        // the last call this rank finished enqueuing on the device
  uint32_t blocks_done;  // blocks of the running call that finished
  uint32_t print_latch;  // the first failing thread prints, the others trap quietly
};

struct CallDesc {
  int32_t kind;       // CollectiveKind
  int32_t dtype;      // DataType, -1 for barrier
  int32_t op;         // ReduceOp, -1 where the collective does not reduce
  int32_t algorithm;  // CudaAlgorithm, -1 for barrier
  int32_t root;       // broadcast's source, else -1
  int32_t blocks;     // the kernel's grid (the same on every rank)
  int64_t bytes;      // input bytes (all-to-all: the input's capacity)
  int64_t row_bytes;  // all-to-all: bytes per row
  uint32_t hash;      // DescHash of the fields above and zero_copy
  int32_t zero_copy;  // 1: every rank's input is read where it lies (no staging)
};

struct CudaLayout {
  size_t state, arrive, ready, ce_staged, desc, rows, sources, staging, reduced, ce_staging, ll;
  size_t max_bytes, ll_words, total_bytes;
};

inline CudaLayout MakeCudaLayout(int world_size, size_t max_bytes) {
  const size_t W = static_cast<size_t>(world_size);
  CudaLayout l{};
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off = AlignUp(off + bytes, 256);
    return at;
  };
  l.state = take(sizeof(CudaCallState));
  l.arrive = take(2 * kMaxBlocks * W * 8);
  l.ready = take(2 * kMaxBlocks * W * 8);
  l.ce_staged = take(W * 8);
  l.desc = take(2 * sizeof(CallDesc));
  l.rows = take(2 * 2 * W * 8);
  l.sources = take(2 * W * 8);
  const size_t B = AlignUp(max_bytes, 256);
  l.staging = take(2 * B);
  l.reduced = take(2 * B);
  l.ce_staging = take(B);
  l.ll_words = (B < kLLMaxBytes ? B : kLLMaxBytes) / 4;
  l.ll = take(2 * W * (l.ll_words + 1) * 8);
  l.max_bytes = B;
  l.total_bytes = off;
  return l;
}

// Bytes to zero before the first call (state and signal words), from offset 0.
inline size_t CudaSignalBytes(const CudaLayout& l) { return l.desc; }

// FNV-1a over the descriptor's fields, folded to kHashBits; never kRejectedHash.
inline uint32_t DescHash(const CallDesc& d) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(d.kind);
  mix(d.dtype);
  mix(d.op);
  mix(d.algorithm);
  mix(d.root);
  mix(d.blocks);
  mix(d.bytes);
  mix(d.row_bytes);
  mix(d.zero_copy);
  uint32_t v = static_cast<uint32_t>((h ^ (h >> 24) ^ (h >> 48)) & kHashMask);
  return v == kRejectedHash ? v ^ 1u : v;
}

#if defined(__CUDACC__)
#define MORI_CCL_HD __host__ __device__
#else
#define MORI_CCL_HD
#endif

MORI_CCL_HD inline uint64_t MakeWord(uint64_t epoch, uint32_t hash) {
  return (epoch << kHashBits) | (hash & kHashMask);
}
MORI_CCL_HD inline uint64_t WordEpoch(uint64_t w) { return w >> kHashBits; }
MORI_CCL_HD inline uint32_t WordHash(uint64_t w) { return static_cast<uint32_t>(w & kHashMask); }

// Part i of `parts` of the byte range [begin, end), cut at multiples of 16 bytes
// from `begin` (so 16-byte words stay whole): [*b, *e).
MORI_CCL_HD inline void SplitRange(int64_t begin, int64_t end, int parts, int i, int64_t* b,
                                   int64_t* e) {
  const int64_t n = end - begin;
  int64_t chunk = (n + parts - 1) / parts;
  chunk = (chunk + 15) / 16 * 16;
  int64_t lo = begin + chunk * i;
  if (lo > end) lo = end;
  int64_t hi = lo + chunk;
  if (hi > end) hi = end;
  *b = lo;
  *e = hi;
}

}  // namespace mori::ccl
