// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The count word every mode posts (the intra-node count exchange, the low-latency
// flags): an epoch (or call number), a count and a row tag in one 64-bit word, so one
// release store publishes them all; and the combine word (the intra-node combine_done,
// the inter-node combine vote): a call number, the input's dtype and a rejection.

#include <cstdint>

#include "common/dtype.hpp"        // DtypeTagName
#include "mori/shmem/context.hpp"  // MORI_HOST_DEVICE

namespace mori::ep {

// count_words hold the epoch in the high bits and, in the low kCountBits, the count
// (kCountFieldBits) under a row tag (the dtype code of the dispatch's token rows,
// kRowTagBits; 0 where a word carries none), so one 64-bit release store publishes
// them all and every pe sees every pe's dtype in the exchange it already waits for.
// 2^39 epochs outlast any process; the count field bounds max_num_inp_token_per_rank.
inline constexpr int kCountBits = 25;
inline constexpr int kCountFieldBits = 20;
inline constexpr int kRowTagBits = kCountBits - kCountFieldBits;
inline constexpr uint64_t kCountMask = (uint64_t{1} << kCountFieldBits) - 1;
// A count of kRejectedCount marks a pe whose inputs failed validation: every pe
// sees it in the same epoch and fails that call without moving data, so the op
// stays consistent and usable.
inline constexpr uint64_t kRejectedCount = kCountMask;
inline constexpr int64_t kMaxTokensPerRank = static_cast<int64_t>(kCountMask) - 1;
inline constexpr uint64_t kEpochMask = (uint64_t{1} << (64 - kCountBits)) - 1;

MORI_HOST_DEVICE inline uint64_t CountWord(uint64_t epoch, uint64_t count, uint32_t tag = 0) {
  return ((epoch & kEpochMask) << kCountBits) |
         (static_cast<uint64_t>(tag & ((1u << kRowTagBits) - 1)) << kCountFieldBits) |
         (count & kCountMask);
}
MORI_HOST_DEVICE inline uint64_t CountOf(uint64_t word) { return word & kCountMask; }
MORI_HOST_DEVICE inline uint32_t RowTagOf(uint64_t word) {
  return static_cast<uint32_t>((word >> kCountFieldBits) & ((1u << kRowTagBits) - 1));
}
MORI_HOST_DEVICE inline uint64_t EpochOf(uint64_t word) { return word >> kCountBits; }
// Smallest word value that carries `epoch` (WaitUntil(word, kGe, EpochFloor(e))):
// earlier epochs' words are smaller, later ones cannot arrive before this call ends.
MORI_HOST_DEVICE inline uint64_t EpochFloor(uint64_t epoch) { return CountWord(epoch, 0); }

// Combine words (intranode/protocol.hpp's combine_done, internode/protocol.hpp's
// comb_vote): (epoch << kCombineEpochShift) | (weights << 5) | (tag << 1) | rejected,
// the tag being the combine input's dtype (DtypeTagName's codes, kCombineTagFp8Blockwise;
// 0 in a rejection), so every pe sees every returning pe's dtype with the words it waits
// for anyway (4 tag bits: every combine tag fits); `weights`: the call combines weights
// (out_weights set), so ranks that differ fail the call (CombineVote). Waits compare
// with CombineFloor(epoch).
inline constexpr int kCombineEpochShift = 6;
inline constexpr uint32_t kCombineTagMask = (1u << 4) - 1;
inline constexpr uint64_t kCombineWeightsBit = uint64_t{1} << 5;
MORI_HOST_DEVICE inline uint64_t CombineWord(uint64_t epoch, uint32_t tag, bool rejected,
                                             bool weights = false) {
  return (epoch << kCombineEpochShift) | (weights ? kCombineWeightsBit : 0) |
         (static_cast<uint64_t>(tag & kCombineTagMask) << 1) | (rejected ? 1u : 0u);
}
// A combine word's bits below its epoch (rejected, tag, weights): one compare of them
// with the caller's own tells a word that agrees.
inline constexpr uint32_t kCombineLowMask = (1u << kCombineEpochShift) - 1;
MORI_HOST_DEVICE inline uint64_t CombineFloor(uint64_t epoch) {
  return epoch << kCombineEpochShift;
}
MORI_HOST_DEVICE inline uint32_t CombineTagOf(uint64_t word) {
  return static_cast<uint32_t>(word >> 1) & kCombineTagMask;
}
MORI_HOST_DEVICE inline bool CombineWeightsOf(uint64_t word) {
  return (word & kCombineWeightsBit) != 0;
}
// How the messages name a combine word's weights bit (Python's argument: a tensor or None).
MORI_HOST_DEVICE inline const char* CombineWeightsName(bool weights) {
  return weights ? "weights" : "None";
}

// The combine tag of bf16 rows sent under fp8_blockwise (a code DtypeTagName does not
// use), and the name of any combine tag.
inline constexpr uint32_t kCombineTagFp8Blockwise = 5;
MORI_HOST_DEVICE inline const char* CombineTagName(uint32_t tag) {
  return tag == kCombineTagFp8Blockwise
             ? "bfloat16 sent as float8_e4m3fn blocks with fp32 scales (fp8_blockwise)"
             : DtypeTagName(tag);
}

}  // namespace mori::ep
