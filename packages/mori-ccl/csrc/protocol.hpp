// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The collectives' protocol over mori's symmetric heap: the block layout and the
// per-call header, shared by the CPU implementation (collectives_cpu.cpp) and the
// CUDA kernels that will follow. No Python, no torch.
//
// Pull model: a rank writes only its own block (its header, splits and staged
// input) and the signal words of its peers; it reads peers' blocks. Per call e
// (the communicator's call counter, the same on every rank):
//   1. wait done[s] >= e - 1 for every s: every peer has finished reading this
//      rank's block of call e - 1, so it may be overwritten;
//   2. write the header (and the input into `staging`, unless the input is itself
//      symmetric: then the header points at it), then arrive[me] = e on every pe;
//   3. wait arrive[s] >= e for every s, read every header: a rejection or a
//      mismatch (kind, dtype, op, sizes, splits) fails the call on every rank alike;
//   4. read the peers' data (two-shot: reduce this rank's shard into `reduced`,
//      ready[me] = e on every pe, wait every ready[s] >= e, gather the shards);
//   5. done[me] = e on every pe. A call whose input was read in place (symmetric
//      input) also waits for every done[s] >= e, so the caller may reuse it.
// Signal words hold the call number and only grow, so nothing is reset between
// calls, and a word from another call cannot satisfy a wait of this one.
//
// Failure (collectives_cpu.cpp): a word's top bit (kCallFailed) beside a call number
// says that call failed. A rank whose wait for pe s's word times out sets that word,
// in its own block, to kCallFailed | e with a compare-and-swap; s posts its words with
// an exchange. The word is where the two meet, so exactly one wins: either s's post
// landed first (the wait succeeds after all) or s reads the mark back and fails its
// call too, naming the rank that gave up. A rank that fails a call (timed out, or
// read such a mark) then writes kCallFailed | e into its arrive, ready and done words
// on every peer, so that a peer waiting for it, now or in its next call, fails at
// once naming it. With two ranks both therefore agree that a timed-out call failed;
// with more, a rank that saw every peer's signal before any mark landed completes the
// call (with whole data) and fails its next call, naming a rank that failed.
//
// Block layout (offsets in bytes, W = world size, B = max_bytes):
//   arrive   u64 [W]   entry s = the last call pe s entered (written by pe s)
//   ready    u64 [W]   entry s = the last call whose reduced shard pe s published
//   done     u64 [W]   entry s = the last call pe s finished reading peers for
//   header   CallHeader        this rank's call description (read by peers)
//   in_rows  i64 [W]   all-to-all: rows this rank sends to each rank
//   out_rows i64 [W]   all-to-all: rows this rank expects from each rank
//   staging  u8  [B]   this rank's input
//   reduced  u8  [B]   two-shot: this rank's reduced shard, at its offset

#include <cstddef>
#include <cstdint>

namespace mori::ccl {

enum class CollectiveKind : int32_t {
  kBarrier = 0,
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
};

enum class AllReduceAlgorithm : int32_t { kOneShot = 0, kTwoShot = 1 };

inline constexpr size_t kReasonBytes = 240;

struct CallHeader {
  uint64_t epoch;
  int32_t kind;               // CollectiveKind
  int32_t dtype;              // DataType, -1 for barrier
  int32_t op;                 // ReduceOp, -1 where the collective does not reduce
  int32_t algorithm;          // AllReduceAlgorithm, -1 outside all-reduce
  int32_t root;               // broadcast's source rank, else -1
  int32_t rejected;           // 1: this rank's inputs failed validation (reason below)
  int64_t bytes;              // input bytes
  int64_t row_bytes;          // all-to-all: bytes per row
  int64_t src_offset;         // where the input lies, from the heap's base (staging or symmetric)
  char reason[kReasonBytes];  // NUL-terminated when rejected
};

struct BlockLayout {
  size_t arrive, ready, done, header, in_rows, out_rows, staging, reduced, total_bytes;
};

inline size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

inline BlockLayout MakeBlockLayout(int world_size, size_t max_bytes) {
  const size_t W = static_cast<size_t>(world_size);
  BlockLayout l{};
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off = AlignUp(off + bytes, 256);
    return at;
  };
  l.arrive = take(W * 8);
  l.ready = take(W * 8);
  l.done = take(W * 8);
  l.header = take(sizeof(CallHeader));
  l.in_rows = take(W * 8);
  l.out_rows = take(W * 8);
  l.staging = take(max_bytes);
  l.reduced = take(max_bytes);
  l.total_bytes = off;
  return l;
}

// Bytes that must be zero before the first call (the signal words), from offset 0.
inline size_t SignalBytes(const BlockLayout& l) { return l.header; }

// Two-shot all-reduce: rank r reduces elements [ShardBegin(r), ShardBegin(r + 1)).
inline size_t ShardBegin(size_t count, int world_size, int rank) {
  const size_t shard = (count + world_size - 1) / world_size;
  const size_t b = shard * static_cast<size_t>(rank);
  return b < count ? b : count;
}

}  // namespace mori::ccl
