// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The low-latency dispatch/combine protocol (kernel types IntraNodeLL and AsyncLL,
// the expert-major layout of MORI's standard MoE and DeepEP's low_latency_*), shared
// by the CPU implementation (low_latency/cpu.cpp) and the CUDA kernels
// (kernels/dispatch.cu, kernels/combine.cu). No Python, no torch. The package's
// docs/low_latency.md walks through it with an example.
//
// Why it differs from the intra-node protocol (intranode/protocol.hpp): there a count
// exchange (one cross-rank round trip) precedes every data move and doubles as the
// "receive buffers are free" barrier. Here every source rank owns a fixed slot
// range in every destination, so data moves at once, and the count travels with it:
//
//   * Receive slots: pe d's dispatch area has P slots per source pe s (W x P; P = M,
//     or with MORI's max_total_recv_tokens cap min(ceil(cap / W), M): LlRecvSlots);
//     s writes its j-th token routed to d into slot [s][j] (j counts s's tokens that
//     go to d, in token order), one copy per destination pe however many of its
//     experts live there (expanded into expert rows on the receiving side), then
//     posts flag[s] = Word(call, count) with release. The receiver waits for W
//     flags, no count exchange before data.
//   * Flag lanes: flag[s] is kLlFlagLanes words, not one. Every block of a sender's
//     launch computes the whole routing (the counts, the over-the-cap check and the
//     id checks), so each block posts the same word itself, into lanes b, b + B,
//     b + 2B, ... (B blocks, B <= kLlFlagLanes), after its own rows, with release:
//     the receiver waits for all lanes of each source, and no block waits for the
//     grid's last one (an atomic counter round trip and a second system fence) before
//     its rows are announced. A copy-engine op (the host copies a flag after the
//     rows) and the CPU implementation use lane 0 alone; the receiver of such an op
//     waits for lane 0.
//   * Over the cap: a sender whose count for some destination d exceeds P writes no
//     row past slot P - 1 and rejects the call; before its (rejected) flags it writes
//     disp_over[half][s] = {Word(call, count), d} into every pe, so every pe fails
//     the call naming s, d and both counts (the note's call number tells it from an
//     older note: the double-buffering argument below covers it as it covers rows).
//   * Double buffering: the areas come in two halves; call c uses half c & 1 (the
//     call counters live with the op: CUDA keeps them in the block's private state
//     so graph replays advance them; the host does not track them). Why s may write
//     half p in call c + 2 without a barrier: s got to call c + 2 by receiving
//     every flag of call c + 1, d's among them; d posts its call c + 1 flags only
//     after it finished receiving call c (a pe sends call c + 1 after receiving call
//     c: the op's call order; a pe that rejects a call still receives its flags),
//     so d no longer reads half p. Combine keeps its own counter and halves with the
//     same argument.
//   * Copy-engine op (CUDA, MORI_EP_LL_COPY_ENGINE=1; every rank alike): a dispatch's
//     (and a token-major combine's) send kernel writes the rows for other pes into a
//     private staging area laid out as their slots and the host then has the copy
//     engines copy each pe's whole slot range (P dispatch rows, M combine rows: the
//     count is known on the device only) and, after it, the flag. Host-issued copies
//     have fixed destinations, so every call of such an op uses half 0 alone; instead
//     of the second half, a receiver posts disp_consumed[d] / comb_consumed[d] =
//     Word(call) into every source once all its blocks read the call, and a sender
//     waits for Word(call - 1) from each pe before its rows can land (a dispatch send
//     kernel before it ends, its copies follow it; a combine before its first row, as
//     expert-major combines still store directly). Ranks that differ in the setting
//     stop at the timeout, never mix rows of different calls.
//   * Flags are compared with >= on words nobody zeroes again (the call number sits
//     in the high bits, so a stale flag of call c - 2 is smaller), and a rejected
//     call (a pe whose inputs failed the host-side checks) carries kLlRejected as its
//     count: every receiver fails that same call, no data is read.
//
// Dispatch writes for each token routed to d: its bytes (the caller's, or for the
// expert-major fp8 cast: e4m3 bytes and fp32 scales per 128 columns, cast on the
// sender so half the bytes cross), K weights, the caller's scales, K expert ids and
// the source token index. The receiver then lays the rows out
//   * token-major (MORI's IntraNodeLL/AsyncLL dispatch): rows ordered by source pe,
//     then source token, exactly as the intra-node kernels order them;
//   * expert-major (standard MoE / DeepEP): local expert e gets one row per (token,
//     slot k) naming it, ordered by source pe, then token; the rows of source s
//     start at begin(e, s) = sum over s' < s of count(e, s'), so the layout is a
//     function of the routing alone. Expert ids must be distinct within a token.
//
// Combine returns rows into the source's combine area (two halves by the combine
// counter) and posts comb_flag[d] = LlCombineWord(call, tag, weights):
//   * token-major: pe d writes its row for source token t into slot [d][t] (and its
//     weights, when its call combines weights: the flag says so, and pes that differ
//     fail the call); the source sums, per token, the rows of the pes it went to in
//     ascending pe order (fp32, one rounding): the intra-node combine's numbers;
//   * expert-major: the row of (token t, slot k) goes to slot [t][k]; the source
//     computes sum over k ascending of w[t][k] * y[t][k] (fp32 products and sums, one
//     rounding to bf16): DeepEP's weighted combine in a fixed order;
//   * expert-major, pre-reduced per rank (MORI's combine_standard_moe, whose weights
//     are the ones its dispatch sent along, so the expert's pe holds them): pe d sums
//     its own experts' products for source token t first, sum over d's slots k
//     ascending of w[t][k] * y[t][k] in fp32 from -0.0, and sends that one fp32 row
//     to slot [t][d] (partial rows of 4 * hidden_dim bytes); the source adds the
//     partials of the pes the token went to in ascending pe order, from -0.0, one
//     rounding to bf16. A token with n experts on d sends 4 * hidden bytes instead of
//     n * 2 * hidden: fewer from n = 3 on, equal at 2. LlPreReduce decides it per op
//     (top_k >= 2 * world_size, where the partial rows fit the combine area and a
//     token averages more than two experts per pe it reaches); the wire tag
//     (kLlTagExpertPartial) keeps ranks that decided otherwise from mixing rows. The
//     expert's pe finds its rows through disp_pos (written by the dispatch receive)
//     and the weights, ids and source token in the dispatch area, which no peer
//     rewrites before this pe sends its next dispatch (the double-buffering argument).
//
// Block layout (offsets from the block's start, identical on every pe; W = world,
// M = max tokens per rank, P = receive slots per source (LlRecvSlots), K = top-k,
// H = hidden_dim * max_token_type_size,
// S = scale bytes of the caller's scales, Q = hidden_dim / 128 fp32 cast scales,
// Hc = hidden_dim * max(max_token_type_size, 2), R = M * max(W, K)):
//   signals (written by peers), then the private state, zeroed at construction
//     disp_flag   u64 [2][W][kLlFlagLanes]
//     comb_flag   u64 [2][W][kLlFlagLanes]
//     disp_over   u64 [2][W][2]    over-the-cap note of source s: Word(call, count), d
//     disp_consumed u64 [W]        copy-engine op: Word(call) once pe d consumed this
//     comb_consumed u64 [W]        pe's rows of that dispatch / combine call (below)
//     state       LlDeviceState
//   per half h (written by peers)
//     disp_tokens u8  [2][W*P][H]
//     disp_weights f32 [2][W*P][K]
//     disp_scales u8  [2][W*P][S]
//     disp_cast_scales f32 [2][W*P][Q]
//     disp_indices i32 [2][W*P][K]
//     disp_src    i32 [2][W*P]     source token index
//     comb_tokens u8  [2][R][Hc]   (slots of this pe's own tokens: not capped)
//     comb_weights f32 [2][W*M][K]
//   private to the pe
//     token_ranks u8 [M][W]         1 where my token t went to pe d (last dispatch)
//     disp_pos    i32 [W*P][K]      expert-major: the packed row (e * W*M + pos) of
//                                   received slot [s][j]'s top-k slot k, if local

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/dtype.hpp"
#include "common/shape.hpp"
#include "common/signal_words.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

inline constexpr uint64_t kLlRejected = kRejectedCount;

// A flag: the call number, the count and the call's wire tag (below).
MORI_HOST_DEVICE inline uint64_t LlWord(uint64_t call, uint64_t count, uint32_t tag = 0) {
  return CountWord(call, count, tag);
}

// A combine flag carries no count: its count field says whether the sender combines
// weights (kLlCombineWeights: a token-major combine with weights, whose rows went out
// with their weights; 0: none went out), or kLlRejected. A receiver whose own call
// differs fails it (one that asked for weights would read an earlier call's).
inline constexpr uint64_t kLlCombineWeights = 1;
MORI_HOST_DEVICE inline uint64_t LlCombineWord(uint64_t call, uint32_t tag, bool weights) {
  return LlWord(call, weights ? kLlCombineWeights : 0, tag);
}

// The wire format of a call, carried in its flags' tag bits (kRowTagBits): every
// receiver compares each sender's with its own and fails that call where they differ,
// so ranks passing different dtypes, layouts or casts never mix rows. Token-major
// dispatch: its rows' dtype code (DtypeTagName: 1 bf16, 2 e4m3fn, 3 fp16, 4 fp32,
// 15 / 16 float4_e2m1fn_x2 of hidden_dim / hidden_dim / 2 bytes); token-major combine:
// CombineDtypeTag (1, 2, 4, 15), or kLlTagBf16AsFp8 with fp8_direct_cast, kLlTagBf16Fp8Blockwise
// with fp8_blockwise; expert-major dispatch: LlExpertTag, its rows' dtype (MORI's
// dispatch_standard_moe takes bf16, fp16, fp32 and e4m3fn) or, cast to e4m3 on the sender, the cast
// and whether its scales are powers of two (round_scale: a receiver packing ue8m0 exponents reads
// only the exponent of each scale, so it must never get another rank's unrounded ones);
// expert-major combine: kLlTagExpertBf16, or kLlTagExpertPartial pre-reduced per rank. What stays
// on the receiver (use_ue8m0's packing of the fp32 scales it received, src_info's stride) is not on
// the wire.
inline constexpr uint32_t kLlTagExpertBf16 = 5;
inline constexpr uint32_t kLlTagExpertCast = 6;
inline constexpr uint32_t kLlTagBf16AsFp8 = 7;
inline constexpr uint32_t kLlTagExpertPartial = 8;
inline constexpr uint32_t kLlTagExpertFp16 = 9;
inline constexpr uint32_t kLlTagExpertFp32 = 10;
inline constexpr uint32_t kLlTagExpertFp8 = 11;
inline constexpr uint32_t kLlTagExpertCastRounded = 12;
inline constexpr uint32_t kLlTagExpertUnknown = 13;  // a dtype code other than 1..4
inline constexpr uint32_t kLlTagBf16Fp8Blockwise = 14;
static_assert(kLlTagBf16Fp8Blockwise < kDtypeTagFp4x2 && kDtypeTagFp4x2Half < (1u << kRowTagBits),
              "the wire tags and the dtype codes are distinct and fit the tag bits");

// An expert-major dispatch's wire tag: the rows' dtype code (DtypeTagName), or the
// fp8 cast of bf16 rows with or without power-of-two scales.
MORI_HOST_DEVICE inline uint32_t LlExpertTag(uint32_t dtype_tag, bool fp8_cast, bool round_scale) {
  if (fp8_cast) return round_scale ? kLlTagExpertCastRounded : kLlTagExpertCast;
  switch (dtype_tag) {
    case 1:
      return kLlTagExpertBf16;
    case 2:
      return kLlTagExpertFp8;
    case 3:
      return kLlTagExpertFp16;
    case 4:
      return kLlTagExpertFp32;
    default:
      return kLlTagExpertUnknown;
  }
}

MORI_HOST_DEVICE inline const char* LlTagName(uint32_t tag) {
  switch (tag) {
    case kLlTagExpertBf16:
      return "expert-major bfloat16";
    case kLlTagExpertFp16:
      return "expert-major float16";
    case kLlTagExpertFp32:
      return "expert-major float32";
    case kLlTagExpertFp8:
      return "expert-major float8_e4m3fn";
    case kLlTagExpertUnknown:
      return "expert-major unknown-dtype";
    case kLlTagExpertCast:
      return "expert-major bfloat16 cast to float8_e4m3fn";
    case kLlTagExpertCastRounded:
      return "expert-major bfloat16 cast to float8_e4m3fn with power-of-two scales "
             "(round_scale)";
    case kLlTagBf16AsFp8:
      return "bfloat16 sent as float8_e4m3fn (fp8_direct_cast)";
    case kLlTagBf16Fp8Blockwise:
      return "bfloat16 sent as float8_e4m3fn blocks with fp32 scales (fp8_blockwise)";
    case kLlTagExpertPartial:
      return "expert-major float32 per-rank partial";
    default:
      return DtypeTagName(tag);
  }
}

// Columns per fp32 cast scale (DeepEP's per-128-channel fp8 cast).
inline constexpr int kLlCastGroup = 128;
// amax floor of the cast (DeepEP's kFP8Margin) and e4m3's largest finite value.
inline constexpr float kLlCastMargin = 1e-4f;
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE4M3MaxInv = 1.0f / 448.0f;

// Flag lanes per (half, source) (see "Flag lanes" above); a launch has at most this
// many blocks.
inline constexpr int kLlFlagLanes = 64;

// Index of lane `lane` of source s's flag in half `half` of a flag array.
MORI_HOST_DEVICE inline size_t LlFlagIndex(size_t half, int world, int s, int lane = 0) {
  return (half * static_cast<size_t>(world) + static_cast<size_t>(s)) * kLlFlagLanes +
         static_cast<size_t>(lane);
}

struct LlDeviceState {
  uint64_t dispatch_calls;
  uint64_t combine_calls;
  uint32_t blocks_done;
  uint32_t pad;
};

struct LlBufferLayout {
  size_t disp_flag, comb_flag, disp_over, disp_consumed, comb_consumed, state;
  size_t disp_tokens, disp_weights, disp_scales, disp_cast_scales, disp_indices, disp_src;
  size_t comb_tokens, comb_weights;
  size_t token_ranks, disp_pos;
  size_t total_bytes;
  // Bytes of one half of each per-half region.
  size_t half_tokens, half_weights, half_scales, half_cast_scales, half_indices, half_src;
  size_t half_comb_tokens, half_comb_weights;
};

MORI_HOST_DEVICE inline int64_t LlCastScales(int64_t hidden_dim) {
  return hidden_dim % kLlCastGroup == 0 ? hidden_dim / kLlCastGroup : 0;
}

// Receive slots per source pe (P): RecvCapacity / W, M without a cap. The op passes
// recv_capacity = W * min(ceil(max_total_recv_tokens / W), M) (MORI's rule), a
// multiple of W; LlCheckRecvCapacity refuses any other.
MORI_HOST_DEVICE inline int64_t LlRecvSlots(const EpShape& s) {
  return s.recv_capacity > 0 ? s.recv_capacity / s.world_size : s.max_tokens;
}

inline void LlCheckRecvCapacity(const EpShape& s) {
  MORI_CHECK_ARG(s.recv_capacity == 0 ||
                     (s.recv_capacity % s.world_size == 0 && s.recv_capacity >= s.world_size &&
                      s.recv_capacity <= s.world_size * s.max_tokens),
                 "the low-latency receive capacity ", s.recv_capacity, " must be 0 or world_size ",
                 s.world_size, " times a slot count in [1, max_num_inp_token_per_rank ",
                 s.max_tokens, "]");
}

// The over-the-cap note a rejecting sender writes before its flags (disp_over).
struct LlOverNote {
  uint64_t word;  // LlWord(call, the sender's count for dest)
  uint64_t dest;
};

MORI_HOST_DEVICE inline int64_t LlCombineRows(const EpShape& s) {
  return s.max_tokens * (s.world_size > s.top_k ? s.world_size : s.top_k);
}

inline LlBufferLayout MakeLlLayout(const EpShape& s) {
  const size_t W = s.world_size, M = s.max_tokens, K = s.top_k;
  const size_t slots = W * static_cast<size_t>(LlRecvSlots(s));
  LlBufferLayout l{};
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    size_t at = off;
    off = AlignUp(off + bytes, 256);
    return at;
  };
  l.half_tokens = AlignUp(slots * s.hidden_bytes, 256);
  l.half_weights = AlignUp(slots * K * 4, 256);
  l.half_scales = AlignUp(slots * s.scale_bytes, 256);
  l.half_cast_scales = AlignUp(slots * LlCastScales(s.hidden_dim) * 4, 256);
  l.half_indices = AlignUp(slots * K * 4, 256);
  l.half_src = AlignUp(slots * 4, 256);
  l.half_comb_tokens = AlignUp(static_cast<size_t>(LlCombineRows(s)) * s.combine_row_bytes, 256);
  l.half_comb_weights = AlignUp(W * M * K * 4, 256);
  l.disp_flag = take(2 * W * kLlFlagLanes * 8);
  l.comb_flag = take(2 * W * kLlFlagLanes * 8);
  l.disp_over = take(2 * W * sizeof(LlOverNote));
  l.disp_consumed = take(W * 8);
  l.comb_consumed = take(W * 8);
  l.state = take(sizeof(LlDeviceState));
  l.disp_tokens = take(2 * l.half_tokens);
  l.disp_weights = take(2 * l.half_weights);
  l.disp_scales = take(2 * l.half_scales);
  l.disp_cast_scales = take(2 * l.half_cast_scales);
  l.disp_indices = take(2 * l.half_indices);
  l.disp_src = take(2 * l.half_src);
  l.comb_tokens = take(2 * l.half_comb_tokens);
  l.comb_weights = take(2 * l.half_comb_weights);
  l.token_ranks = take(M * W);
  l.disp_pos = take(slots * K * 4);
  l.total_bytes = off;
  return l;
}

inline size_t LlSignalBytes(const LlBufferLayout& l) { return l.disp_tokens; }

// Bytes of one pre-reduced combine row (fp32).
MORI_HOST_DEVICE inline int64_t LlPartialRowBytes(const EpShape& s) { return s.hidden_dim * 4; }

// Whether the pre-reduced expert-major combine's M * W partial rows fit one half of
// the combine area.
inline bool LlPartialsFit(const EpShape& s, const LlBufferLayout& l) {
  return static_cast<size_t>(s.max_tokens) * s.world_size * LlPartialRowBytes(s) <=
         l.half_comb_tokens;
}

// The op's choice for combine_standard_moe (decided once, at construction): pre-reduce
// per rank when top_k >= 2 * world_size (the partial rows then fit: M * W * 4 * hidden
// <= M * top_k * 2 * hidden), unless `enabled` is false (MORI_EP_LL_PRE_REDUCE=0,
// LowLatencyOptions). The buffer layout does not depend on it, so ranks that decide
// differently fail their combines by wire tag instead of disagreeing on the heap.
inline bool LlPreReduce(const EpShape& s, bool enabled) {
  if (!enabled) return false;
  return s.top_k >= 2 * s.world_size && LlPartialsFit(s, MakeLlLayout(s));
}

// How the receiver lays out dispatch's rows, and what dispatch's sender casts.
enum class LlLayout : int { kTokenMajor = 0, kExpertMajor = 1 };

// fp8 cast of 128 columns as DeepEP's low-latency dispatch does it: amax floored at
// kLlCastMargin; round_scale: power-of-two scales (the inverse scale is 2^ceil(log2(
// amax / 448))). Returns the multiplier applied before the e4m3 rounding; *scale_inv
// receives the scale the receiver multiplies by.
MORI_HOST_DEVICE inline float LlCastScale(float amax, bool round_scale, float* scale_inv) {
  if (round_scale) {
    const float v = amax * kE4M3MaxInv;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    const int e = static_cast<int>((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0 ? 1 : 0);
    const uint32_t inv_bits = static_cast<uint32_t>(e + 127) << 23;
    const uint32_t fwd_bits = static_cast<uint32_t>(127 - e) << 23;
    float inv, fwd;
    memcpy(&inv, &inv_bits, 4);
    memcpy(&fwd, &fwd_bits, 4);
    *scale_inv = inv;
    return fwd;
  }
  *scale_inv = amax * kE4M3MaxInv;
  return kE4M3Max / amax;
}

}  // namespace mori::ep
