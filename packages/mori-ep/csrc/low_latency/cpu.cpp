// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CPU implementation of the low-latency protocol (low_latency/protocol.hpp),
// written with the host counterparts of the device API (mori/shmem/host_ops.hpp)
// in the order the CUDA kernel issues the same operations.
#include "low_latency/cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/call_checks.hpp"
#include "common/host_block.hpp"
#include "common/numeric.hpp"
#include "low_latency/options.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/host_ops.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

namespace hs = mori::shmem::host;
using mori::shmem::Cmp;

namespace {

void StoreRow(const std::vector<float>& acc, CombineDtype dtype, void* out, int64_t t) {
  const int64_t hidden = static_cast<int64_t>(acc.size());
  switch (dtype) {
    case CombineDtype::kBFloat16: {
      uint16_t* o = static_cast<uint16_t*>(out) + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] = FloatToBf16Bits(acc[h]);
      break;
    }
    case CombineDtype::kFloat8E4M3: {
      uint8_t* o = static_cast<uint8_t*>(out) + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] = FloatToFloat8E4M3(acc[h]);
      break;
    }
    case CombineDtype::kFloat32:
      std::memcpy(static_cast<float*>(out) + t * hidden, acc.data(), hidden * 4);
      break;
  }
}

// DeepEP's cast of one bf16 row: per 128 columns, amax (floored), the scale, e4m3
// bytes rounded to nearest even and saturated.
void CastRow(const uint16_t* row, int64_t hidden, bool round_scale, uint8_t* fp8,
             float* scale_inv) {
  for (int64_t g = 0; g < hidden / kLlCastGroup; ++g) {
    float amax = kLlCastMargin;
    for (int i = 0; i < kLlCastGroup; ++i) {
      amax = std::fmax(amax, std::fabs(Bf16BitsToFloat(row[g * kLlCastGroup + i])));
    }
    const float scale = LlCastScale(amax, round_scale, &scale_inv[g]);
    for (int i = 0; i < kLlCastGroup; ++i) {
      const int64_t h = g * kLlCastGroup + i;
      fp8[h] = FloatToFloat8E4M3(Bf16BitsToFloat(row[h]) * scale);
    }
  }
}

}  // namespace

LowLatencyCpu::LowLatencyCpu(const EpShape& shape, void* block, std::chrono::milliseconds timeout)
    : shape_(shape),
      slots_(LlRecvSlots(shape)),
      layout_(MakeLlLayout(shape)),
      block_(static_cast<char*>(block)),
      ctx_(shmem::GetDeviceContext()),
      timeout_(CheckedTimeout(timeout, "timeout")),
      pre_reduce_(LlPreReduce(shape, LowLatencyOptions::FromEnv().pre_reduce)) {
  LlCheckRecvCapacity(shape);
  CheckHostBlock(shape, ctx_, block, layout_.total_bytes, "low-latency");
  std::memset(block_, 0, LlSignalBytes(layout_));
  shmem::BarrierAll();
}

void LowLatencyCpu::PostDispatchFlags(uint64_t call, const uint64_t* counts, uint32_t tag) {
  const int W = shape_.world_size, me = shape_.rank;
  uint64_t* flags = At<uint64_t>(layout_.disp_flag) + (call & 1) * W * kLlFlagLanes;
  for (int d = 0; d < W; ++d)
    hs::SignalSet(ctx_, &flags[me * kLlFlagLanes], LlWord(call, counts[d], tag), d);
}

void LowLatencyCpu::RejectDispatch(const std::string& reason) {
  const uint64_t call = ++dispatch_calls_;
  dispatch_recv_pending_ = false;
  combine_recv_pending_ = false;
  std::vector<uint64_t> counts(shape_.world_size, kLlRejected);
  PostDispatchFlags(call, counts.data(), 0);
  // Receive the call too (its flags, no rows): the double buffering relies on no pe
  // sending call c + 1 before it has received call c.
  const int W = shape_.world_size;
  const uint64_t* flags = At<uint64_t>(layout_.disp_flag) + (call & 1) * W * kLlFlagLanes;
  for (int s = 0; s < W; ++s) {
    WaitPeerWord(&flags[s * kLlFlagLanes], LlWord(call, 0), timeout_, shape_.rank, s,
                 {"low-latency dispatch", call, "dispatch flag", kCountBits});
  }
  throw InvalidArgumentError(reason);
}

std::string LowLatencyCpu::OverCapMessage(int from, int dest, int64_t count) const {
  return StrCat("dispatch rejected by rank ", from, ": it routes ", count, " tokens to rank ", dest,
                ", more than the ", slots_,
                " receive slots per source rank (max_total_recv_tokens); no rows were received");
}

void LowLatencyCpu::RejectOverCap(int dest, int64_t count) {
  const int W = shape_.world_size, me = shape_.rank;
  const uint64_t call = dispatch_calls_ + 1;  // the call RejectDispatch posts
  const LlOverNote note{LlWord(call, static_cast<uint64_t>(count)), static_cast<uint64_t>(dest)};
  LlOverNote* notes = At<LlOverNote>(layout_.disp_over) + (call & 1) * W;
  // Ordered before the flags by their release (SignalSet).
  for (int d = 0; d < W; ++d) hs::PutNbi(ctx_, &notes[me], &note, sizeof(note), d);
  RejectDispatch(OverCapMessage(me, dest, count));
}

void LowLatencyCpu::DispatchSend(const LlDispatchArgs& a) {
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int64_t M = shape_.max_tokens, hidden = shape_.hidden_dim;
  const int epr = shape_.num_experts_per_rank, num_experts = epr * W;
  const bool expert_major = a.layout == LlLayout::kExpertMajor;
  if (dispatch_recv_pending_) {
    MORI_THROW(InvalidStateError, "dispatch_send while the previous dispatch (call ",
               dispatch_calls_, ") was not received: call dispatch_recv first");
  }
  if (a.num_tokens < 0 || a.num_tokens > M) {
    RejectDispatch(StrCat("num_tokens ", a.num_tokens, " exceeds max_num_inp_token_per_rank ", M));
  }
  if (a.token_row_bytes > shape_.hidden_bytes) {
    RejectDispatch(StrCat("token rows of ", a.token_row_bytes, " bytes exceed hidden_dim * ",
                          "max_token_type_size = ", shape_.hidden_bytes, " bytes"));
  }
  if (a.fp8_cast &&
      (!expert_major || a.token_row_bytes != hidden * 2 || LlCastScales(hidden) == 0)) {
    RejectDispatch(StrCat("the fp8 cast takes bf16 rows of a hidden_dim divisible by ",
                          kLlCastGroup, " in the expert-major layout (hidden_dim ", hidden, ")"));
  }

  // Routing and every check, before anything is written.
  uint8_t* token_ranks = At<uint8_t>(layout_.token_ranks);
  std::memset(token_ranks, 0, static_cast<size_t>(a.num_tokens) * W);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int32_t* row = a.indices + t * K;
    for (int j = 0; j < K; ++j) {
      const int32_t e = row[j];
      if (e == -1) continue;
      if (e < 0 || e >= num_experts) {
        RejectDispatch(StrCat("expert id ", e, " out of range [-1, ", num_experts, ") at token ", t,
                              " slot ", j));
      }
      if (expert_major) {
        for (int i = 0; i < j; ++i) {
          if (row[i] == e) {
            RejectDispatch(StrCat("expert id ", e, " appears twice in token ", t, " (slots ", i,
                                  " and ", j, "); the expert-major layout needs distinct experts"));
          }
        }
      }
      token_ranks[t * W + ExpertRank(e, epr)] = 1;
    }
  }
  // The receive cap: at most slots_ tokens to each pe (none moves otherwise).
  for (int d = 0; d < W; ++d) {
    int64_t count = 0;
    for (int64_t t = 0; t < a.num_tokens; ++t) count += token_ranks[t * W + d];
    if (count > slots_) RejectOverCap(d, count);
  }

  const uint64_t call = ++dispatch_calls_;
  const size_t half = call & 1;
  const int64_t H = shape_.hidden_bytes, Sb = shape_.scale_bytes, Q = LlCastScales(hidden);
  const int64_t P = slots_;
  char* tokens_area = At<char>(layout_.disp_tokens) + half * layout_.half_tokens;
  float* weights_area =
      reinterpret_cast<float*>(At<char>(layout_.disp_weights) + half * layout_.half_weights);
  char* scales_area = At<char>(layout_.disp_scales) + half * layout_.half_scales;
  float* cast_area = reinterpret_cast<float*>(At<char>(layout_.disp_cast_scales) +
                                              half * layout_.half_cast_scales);
  int32_t* indices_area =
      reinterpret_cast<int32_t*>(At<char>(layout_.disp_indices) + half * layout_.half_indices);
  int32_t* src_area =
      reinterpret_cast<int32_t*>(At<char>(layout_.disp_src) + half * layout_.half_src);
  const char* tokens = static_cast<const char*>(a.tokens);
  const char* scales = static_cast<const char*>(a.scales);
  std::vector<uint64_t> counts(W, 0);
  std::vector<uint8_t> fp8(a.fp8_cast ? hidden : 0);
  std::vector<float> cast_scales(a.fp8_cast ? Q : 0);
  const std::vector<float> zeros(K, 0.0f);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const void* row = tokens + t * a.token_row_bytes;
    int64_t row_bytes = a.token_row_bytes;
    if (a.fp8_cast) {  // cast once, on the sender: every destination gets the same bytes
      CastRow(static_cast<const uint16_t*>(row), hidden, a.round_scale, fp8.data(),
              cast_scales.data());
      row = fp8.data();
      row_bytes = hidden;
    }
    const int32_t src = static_cast<int32_t>(t);
    for (int d = 0; d < W; ++d) {
      if (!token_ranks[t * W + d]) continue;
      const int64_t slot = me * P + static_cast<int64_t>(counts[d]++);
      hs::PutNbi(ctx_, tokens_area + slot * H, row, row_bytes, d);
      if (a.fp8_cast) hs::PutNbi(ctx_, cast_area + slot * Q, cast_scales.data(), Q * 4, d);
      hs::PutNbi(ctx_, weights_area + slot * K, a.weights ? a.weights + t * K : zeros.data(), K * 4,
                 d);
      if (Sb > 0 && scales != nullptr) {
        hs::PutNbi(ctx_, scales_area + slot * Sb, scales + t * Sb, Sb, d);
      }
      hs::PutNbi(ctx_, indices_area + slot * K, a.indices + t * K, K * 4, d);
      hs::PutNbi(ctx_, src_area + slot, &src, 4, d);
    }
  }
  // Release: a pe that sees the flag sees the rows before it.
  dispatch_tag_ = LlDispatchTag(a);
  PostDispatchFlags(call, counts.data(), dispatch_tag_);

  dispatch_recv_pending_ = true;
  combine_recv_pending_ = false;
  dispatch_layout_ = a.layout;
  fp8_cast_ = a.fp8_cast;
  token_row_bytes_ = a.token_row_bytes;
  num_tokens_ = a.num_tokens;
}

int64_t LowLatencyCpu::DispatchRecv(const LlRecvArgs& o) {
  if (!dispatch_recv_pending_) {
    MORI_THROW(InvalidStateError, "dispatch_recv needs a dispatch_send first (call ",
               dispatch_calls_, " was received or rejected)");
  }
  dispatch_recv_pending_ = false;
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int64_t M = shape_.max_tokens, P = slots_, hidden = shape_.hidden_dim, WM = W * M;
  const int E = shape_.num_experts_per_rank;
  const uint64_t call = dispatch_calls_;
  const size_t half = call & 1;
  const uint64_t* flags = At<uint64_t>(layout_.disp_flag) + half * W * kLlFlagLanes;
  std::vector<int64_t> count(W);
  int rejected_by = -1, other_from = -1;
  uint32_t other_tag = 0;
  for (int s = 0; s < W; ++s) {
    const uint64_t w = WaitPeerWord(&flags[s * kLlFlagLanes], LlWord(call, 0), timeout_, me, s,
                                    {"low-latency dispatch", call, "dispatch flag", kCountBits});
    MORI_CHECK(EpochOf(w) == (call & kEpochMask), "dispatch flag from pe ", s, " has call ",
               EpochOf(w), ", expected ", call);
    if (CountOf(w) == kLlRejected) {
      if (rejected_by < 0) rejected_by = s;
      count[s] = 0;
    } else {
      count[s] = static_cast<int64_t>(CountOf(w));
      if (RowTagOf(w) != dispatch_tag_ && other_from < 0) {
        other_from = s;
        other_tag = RowTagOf(w);
      }
    }
  }
  if (rejected_by >= 0) {
    const LlOverNote note = At<LlOverNote>(layout_.disp_over)[half * W + rejected_by];
    if (EpochOf(note.word) == (call & kEpochMask)) {
      throw InvalidArgumentError(OverCapMessage(rejected_by, static_cast<int>(note.dest),
                                                static_cast<int64_t>(CountOf(note.word))));
    }
    MORI_THROW(InvalidArgumentError, "dispatch rejected by rank ", rejected_by,
               " (its inputs failed validation; see its error); no rows were received");
  }
  if (other_from >= 0) {
    MORI_THROW(InvalidArgumentError, "dispatch: rank ", other_from, " sends ", LlTagName(other_tag),
               " tokens, this rank ", LlTagName(dispatch_tag_),
               " (every rank must pass the same dtype and layout); no rows were received");
  }
  recv_half_ = half;
  recv_counts_ = count;
  const int64_t H = shape_.hidden_bytes, Sb = shape_.scale_bytes, Q = LlCastScales(hidden);
  const char* tokens_area = At<char>(layout_.disp_tokens) + half * layout_.half_tokens;
  const float* weights_area =
      reinterpret_cast<const float*>(At<char>(layout_.disp_weights) + half * layout_.half_weights);
  const char* scales_area = At<char>(layout_.disp_scales) + half * layout_.half_scales;
  const float* cast_area = reinterpret_cast<const float*>(At<char>(layout_.disp_cast_scales) +
                                                          half * layout_.half_cast_scales);
  const int32_t* indices_area = reinterpret_cast<const int32_t*>(At<char>(layout_.disp_indices) +
                                                                 half * layout_.half_indices);
  const int32_t* src_area =
      reinterpret_cast<const int32_t*>(At<char>(layout_.disp_src) + half * layout_.half_src);

  if (dispatch_layout_ == LlLayout::kTokenMajor) {
    const int64_t rb = token_row_bytes_;
    int64_t row = 0;
    for (int s = 0; s < W; ++s) {
      for (int64_t j = 0; j < count[s]; ++j, ++row) {
        const int64_t slot = s * P + j;
        std::memcpy(static_cast<char*>(o.out_tokens) + row * H, tokens_area + slot * H, rb);
        std::memcpy(o.out_weights + row * K, weights_area + slot * K, K * 4);
        if (Sb > 0 && o.out_scales != nullptr) {
          std::memcpy(static_cast<char*>(o.out_scales) + row * Sb, scales_area + slot * Sb, Sb);
        }
        std::memcpy(o.out_indices + row * K, indices_area + slot * K, K * 4);
        o.out_src_pos[row] = EncodeSrcPos(s, src_area[slot], M);
      }
    }
    *o.total_recv = static_cast<int32_t>(row);
    return row;
  }

  // Expert-major: rows per (local expert, source), then each source's rows from
  // begin(e, s) on, in token order.
  const int32_t lo = me * E;
  std::vector<int64_t> cnt(static_cast<size_t>(E) * W, 0);
  for (int s = 0; s < W; ++s) {
    for (int64_t j = 0; j < count[s]; ++j) {
      const int32_t* idx = indices_area + (s * P + j) * K;
      for (int k = 0; k < K; ++k) {
        if (idx[k] >= lo && idx[k] < lo + E) ++cnt[(idx[k] - lo) * W + s];
      }
    }
  }
  std::vector<int64_t> next(static_cast<size_t>(E) * W);
  int64_t rows = 0;
  for (int e = 0; e < E; ++e) {
    int64_t begin = 0;
    for (int s = 0; s < W; ++s) {
      next[e * W + s] = begin;
      o.layout_range[e * W + s] = (begin << 32) | cnt[e * W + s];
      begin += cnt[e * W + s];
    }
    o.packed_count[e] = static_cast<int32_t>(begin);
    rows += begin;
  }
  const int64_t xb = fp8_cast_ ? hidden : token_row_bytes_;
  int32_t* disp_pos = At<int32_t>(layout_.disp_pos);
  for (int s = 0; s < W; ++s) {
    for (int64_t j = 0; j < count[s]; ++j) {
      const int64_t slot = s * P + j;
      const int32_t* idx = indices_area + slot * K;
      for (int k = 0; k < K; ++k) {
        if (idx[k] < lo || idx[k] >= lo + E) continue;
        const int e = idx[k] - lo;
        const int64_t pos = next[e * W + s]++;
        const int64_t r = e * WM + pos;
        std::memcpy(static_cast<char*>(o.packed_x) + r * xb, tokens_area + slot * H, xb);
        o.src_info[r] = static_cast<int32_t>(s * o.src_info_stride + src_area[slot]);
        o.slot_k[r] = k;
        disp_pos[slot * K + k] = static_cast<int32_t>(r);
        if (fp8_cast_) {
          const float* sc = cast_area + slot * Q;
          for (int64_t q = 0; q < Q; ++q) {
            if (o.ue8m0) {
              uint8_t* packed = static_cast<uint8_t*>(o.packed_scales);
              packed[((e * (Q / 4) + q / 4) * WM + pos) * 4 + q % 4] =
                  static_cast<uint8_t>(FloatBits(sc[q]) >> 23);
            } else {
              static_cast<float*>(o.packed_scales)[(e * Q + q) * WM + pos] = sc[q];
            }
          }
        }
      }
    }
  }
  return rows;
}

void LowLatencyCpu::PostCombineFlags(uint64_t call, bool rejected, uint32_t tag, bool weights) {
  const int W = shape_.world_size, me = shape_.rank;
  uint64_t* flags = At<uint64_t>(layout_.comb_flag) + (call & 1) * W * kLlFlagLanes;
  const uint64_t word = rejected ? LlWord(call, kLlRejected) : LlCombineWord(call, tag, weights);
  for (int s = 0; s < W; ++s) hs::SignalSet(ctx_, &flags[me * kLlFlagLanes], word, s);
}

void LowLatencyCpu::RejectCombine(const std::string& reason) {
  const uint64_t call = ++combine_calls_;
  combine_recv_pending_ = false;
  PostCombineFlags(call, true, 0, false);
  const int W = shape_.world_size;
  const uint64_t* flags = At<uint64_t>(layout_.comb_flag) + (call & 1) * W * kLlFlagLanes;
  for (int d = 0; d < W; ++d) {
    WaitPeerWord(&flags[d * kLlFlagLanes], LlWord(call, 0), timeout_, shape_.rank, d,
                 {"low-latency combine", call, "combine flag", kCountBits});
  }
  throw InvalidArgumentError(reason);
}

void LowLatencyCpu::CombineSendTokenMajor(const LlCombineArgs& a, int half) {
  const int me = shape_.rank, K = shape_.top_k;
  const int64_t M = shape_.max_tokens, Hc = shape_.combine_row_bytes;
  const int64_t row_bytes = shape_.hidden_dim * CombineElementBytes(a.dtype);
  char* comb_tokens = At<char>(layout_.comb_tokens) + half * layout_.half_comb_tokens;
  float* comb_weights =
      reinterpret_cast<float*>(At<char>(layout_.comb_weights) + half * layout_.half_comb_weights);
  const char* input = static_cast<const char*>(a.input);
  // fp8_blockwise: each row quantized into `wire` before it is sent (to every pe, this
  // one included).
  const int S = a.fp8_block_scale_dim;
  const int64_t wire_bytes = S > 0 ? BlockwiseRowBytes(shape_.hidden_dim, S) : row_bytes;
  std::vector<char> wire(S > 0 ? wire_bytes : 0);
  for (int64_t i = 0; i < a.total_recv; ++i) {
    const int s = static_cast<int>(a.src_pos[i] / M);
    const int64_t t = a.src_pos[i] % M;
    const int64_t slot = me * M + t;
    const char* row = input + i * a.input_row_stride;
    if (S > 0) {
      QuantizeRowFp8Blockwise(reinterpret_cast<const uint16_t*>(row), shape_.hidden_dim, S,
                              wire.data());
      row = wire.data();
    }
    hs::PutNbi(ctx_, comb_tokens + slot * Hc, row, wire_bytes, s);
    if (a.weights != nullptr)
      hs::PutNbi(ctx_, comb_weights + slot * K, a.weights + i * K, K * 4, s);
  }
}

void LowLatencyCpu::CombineSendExpertMajor(const LlCombineArgs& a, int half) {
  const int W = shape_.world_size, K = shape_.top_k, E = shape_.num_experts_per_rank;
  const int64_t M = shape_.max_tokens, WM = W * M, Hc = shape_.combine_row_bytes;
  const int64_t row_bytes = shape_.hidden_dim * 2;
  char* comb_tokens = At<char>(layout_.comb_tokens) + half * layout_.half_comb_tokens;
  const char* input = static_cast<const char*>(a.input);
  for (int e = 0; e < E; ++e) {
    for (int s = 0; s < W; ++s) {
      const int64_t range = a.layout_range[e * W + s];
      const int64_t begin = range >> 32, n = range & 0xFFFFFFFF;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t r = e * WM + begin + j;
        const int64_t t = a.src_info[r] - s * a.src_info_stride;
        const int64_t slot = t * K + a.slot_k[r];
        hs::PutNbi(ctx_, comb_tokens + slot * Hc, input + r * a.input_row_stride, row_bytes, s);
      }
    }
  }
}

// Pre-reduced per rank (low_latency/protocol.hpp): per received token, the sum over
// its slots k naming a local expert, ascending, of w * y in fp32 from -0.0 (the
// weights its source sent with the dispatch), one fp32 row to the source's slot
// [t][me]. Reads the dispatch area of the last received dispatch (recv_half_).
void LowLatencyCpu::CombineSendPartials(int half) {
  const LlCombineArgs& a = combine_;
  const int W = shape_.world_size, me = shape_.rank, K = shape_.top_k;
  const int E = shape_.num_experts_per_rank;
  const int64_t P = slots_, hidden = shape_.hidden_dim, Hp = LlPartialRowBytes(shape_);
  const int64_t stride = a.input_row_stride / 2;  // bf16 elements between rows
  char* partials = At<char>(layout_.comb_tokens) + half * layout_.half_comb_tokens;
  const float* weights_area = reinterpret_cast<const float*>(At<char>(layout_.disp_weights) +
                                                             recv_half_ * layout_.half_weights);
  const int32_t* indices_area = reinterpret_cast<const int32_t*>(At<char>(layout_.disp_indices) +
                                                                 recv_half_ * layout_.half_indices);
  const int32_t* src_area =
      reinterpret_cast<const int32_t*>(At<char>(layout_.disp_src) + recv_half_ * layout_.half_src);
  const int32_t* disp_pos = At<int32_t>(layout_.disp_pos);
  const uint16_t* input = static_cast<const uint16_t*>(a.input);
  const int32_t lo = me * E;
  std::vector<float> acc(hidden);
  for (int s = 0; s < W; ++s) {
    for (int64_t j = 0; j < recv_counts_[s]; ++j) {
      const int64_t slot = s * P + j;
      std::fill(acc.begin(), acc.end(), kSumStart);
      for (int k = 0; k < K; ++k) {
        const int32_t g = indices_area[slot * K + k];
        if (g < lo || g >= lo + E) continue;
        const float w = weights_area[slot * K + k];
        const uint16_t* y = input + static_cast<int64_t>(disp_pos[slot * K + k]) * stride;
        for (int64_t h = 0; h < hidden; ++h) {
          volatile float p = w * Bf16BitsToFloat(y[h]);
          acc[h] = acc[h] + p;
        }
      }
      const int64_t t = src_area[slot];
      hs::PutNbi(ctx_, partials + (t * W + me) * Hp, acc.data(), Hp, s);
    }
  }
}

void LowLatencyCpu::CombineSend(const LlCombineArgs& a) {
  if (combine_recv_pending_) {
    MORI_THROW(InvalidStateError, "combine_send while the previous combine (call ", combine_calls_,
               ") was not received: call combine_recv first");
  }
  if (a.layout == LlLayout::kTokenMajor) {
    if (shape_.hidden_dim * CombineElementBytes(a.dtype) > shape_.combine_row_bytes) {
      RejectCombine(StrCat("combine rows of ", shape_.hidden_dim * CombineElementBytes(a.dtype),
                           " bytes exceed the combine buffer's ", shape_.combine_row_bytes));
    }
    if (a.fp8_cast && a.dtype != CombineDtype::kBFloat16) {
      RejectCombine("fp8_direct_cast combines bf16 input only");
    }
    if (a.fp8_block_scale_dim > 0 && a.dtype != CombineDtype::kBFloat16) {
      RejectCombine("fp8_blockwise combines bf16 input only");
    }
    if (a.fp8_block_scale_dim > 0 &&
        BlockwiseRowBytes(shape_.hidden_dim, a.fp8_block_scale_dim) > shape_.combine_row_bytes) {
      RejectCombine(StrCat("fp8_blockwise rows of ",
                           BlockwiseRowBytes(shape_.hidden_dim, a.fp8_block_scale_dim), " bytes (",
                           shape_.hidden_dim, " fp8 values and ", a.fp8_block_scale_dim,
                           " fp32 scales) exceed the combine buffer's ", shape_.combine_row_bytes));
    }
    if (a.input_rows < a.total_recv) {
      RejectCombine(StrCat("combine input has ", a.input_rows, " rows, fewer than total_recv ",
                           a.total_recv));
    }
  } else if (a.num_tokens < 0 || a.num_tokens > shape_.max_tokens) {
    RejectCombine(StrCat("combine of ", a.num_tokens, " tokens exceeds max_num_inp_token_per_rank ",
                         shape_.max_tokens));
  } else if (a.pre_reduce && !LlPartialsFit(shape_, layout_)) {
    RejectCombine(StrCat("a combine pre-reduced per rank needs ", shape_.max_tokens, " x ",
                         shape_.world_size, " fp32 rows of ", LlPartialRowBytes(shape_),
                         " bytes, more than the combine area's ", layout_.half_comb_tokens,
                         " (top_k ", shape_.top_k, " < 2 * world_size)"));
  } else if (a.pre_reduce && dispatch_layout_ != LlLayout::kExpertMajor) {
    RejectCombine("a combine pre-reduced per rank needs an expert-major dispatch before it");
  }
  const uint64_t call = ++combine_calls_;
  const int half = static_cast<int>(call & 1);
  combine_ = a;
  if (a.layout == LlLayout::kTokenMajor) {
    CombineSendTokenMajor(a, half);
  } else if (a.pre_reduce) {
    CombineSendPartials(half);
  } else {
    CombineSendExpertMajor(a, half);
  }
  PostCombineFlags(call, false, LlCombineTag(a), LlCombineWeights(a));
  combine_recv_pending_ = true;
}

void LowLatencyCpu::CombineRecv() {
  if (!combine_recv_pending_) {
    MORI_THROW(InvalidStateError, "combine_recv needs a combine_send first (call ", combine_calls_,
               " was received or rejected)");
  }
  combine_recv_pending_ = false;
  const LlCombineArgs& a = combine_;
  const int W = shape_.world_size, K = shape_.top_k;
  const int64_t M = shape_.max_tokens, hidden = shape_.hidden_dim, Hc = shape_.combine_row_bytes;
  const uint64_t call = combine_calls_;
  const size_t half = call & 1;
  const uint64_t* flags = At<uint64_t>(layout_.comb_flag) + half * W * kLlFlagLanes;
  const uint32_t mine = LlCombineTag(a);
  const bool weights = LlCombineWeights(a);
  int rejected_by = -1, other_from = -1, other_weights_from = -1;
  uint32_t other_tag = 0;
  for (int d = 0; d < W; ++d) {
    const uint64_t w =
        WaitPeerWord(&flags[d * kLlFlagLanes], LlWord(call, 0), timeout_, shape_.rank, d,
                     {"low-latency combine", call, "combine flag", kCountBits});
    if (CountOf(w) == kLlRejected) {
      if (rejected_by < 0) rejected_by = d;
      continue;
    }
    if (RowTagOf(w) != mine && other_from < 0) {
      other_from = d;
      other_tag = RowTagOf(w);
    }
    if (CountOf(w) != (weights ? kLlCombineWeights : 0) && other_weights_from < 0) {
      other_weights_from = d;
    }
  }
  if (rejected_by >= 0) {
    MORI_THROW(InvalidArgumentError, "combine rejected by rank ", rejected_by,
               " (its inputs failed validation; see its error); outputs not written");
  }
  if (other_from >= 0) {
    MORI_THROW(InvalidArgumentError, "combine: rank ", other_from, " returns ",
               LlTagName(other_tag), " rows, this rank ", LlTagName(mine),
               " (every rank must pass the same dtype and layout); outputs not written");
  }
  if (other_weights_from >= 0) ThrowCombineWeightsDiffer(other_weights_from, weights);
  const char* comb_tokens = At<char>(layout_.comb_tokens) + half * layout_.half_comb_tokens;
  const float* comb_weights = reinterpret_cast<const float*>(At<char>(layout_.comb_weights) +
                                                             half * layout_.half_comb_weights);
  std::vector<float> acc(hidden);
  if (a.layout == LlLayout::kTokenMajor) {
    // Per token, the rows of the pes it went to in ascending pe order (the
    // intra-node combine's order and numbers).
    const uint8_t* token_ranks = At<uint8_t>(layout_.token_ranks);
    std::vector<int64_t> slots(W);  // the slots of a token's parts, ascending pe
    const int64_t row_bytes = hidden * CombineElementBytes(a.dtype);
    for (int64_t t = 0; t < num_tokens_; ++t) {
      int parts = 0;
      for (int d = 0; d < W; ++d) {
        if (token_ranks[t * W + d]) slots[parts++] = d * M + t;
      }
      auto row_of = [&](int i) { return comb_tokens + slots[i] * Hc; };
      if (a.fp8_block_scale_dim > 0) {
        CombineTokenRowFp8Blockwise(
            parts, row_of, hidden, a.fp8_block_scale_dim, acc.data(),
            reinterpret_cast<uint16_t*>(static_cast<char*>(a.out) + t * row_bytes));
      } else {
        CombineTokenRow(parts, row_of, a.dtype, a.fp8_cast, hidden, acc.data(),
                        static_cast<char*>(a.out) + t * row_bytes);
      }
      if (a.out_weights != nullptr) {
        CombineTokenWeights(
            parts, [&](int i) { return comb_weights + slots[i] * K; }, K, a.out_weights + t * K);
      }
    }
    return;
  }
  if (a.pre_reduce) {
    // The partials of the pes each token went to, ascending pe, fp32 from -0.0, one
    // rounding to bf16; no part: zeros.
    const uint8_t* token_ranks = At<uint8_t>(layout_.token_ranks);
    const int64_t Hp = LlPartialRowBytes(shape_);
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      bool any = false;
      for (int d = 0; d < W; ++d) any |= token_ranks[t * W + d] != 0;
      std::fill(acc.begin(), acc.end(), any ? kSumStart : 0.0f);
      for (int d = 0; d < W; ++d) {
        if (!token_ranks[t * W + d]) continue;
        const float* part = reinterpret_cast<const float*>(comb_tokens + (t * W + d) * Hp);
        for (int64_t h = 0; h < hidden; ++h) acc[h] = acc[h] + part[h];
      }
      StoreRow(acc, CombineDtype::kBFloat16, a.out, t);
    }
    return;
  }
  // Expert-major: sum over k ascending of w * y, each product and sum rounded to
  // fp32 (no fused multiply-add), one rounding to bf16; the sum starts from -0.0
  // (kSumStart), so one part of weight 1 keeps its bits (NaN aside); no part: zeros.
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    bool any = false;
    for (int k = 0; k < K; ++k) any |= a.topk_idx[t * K + k] >= 0;
    std::fill(acc.begin(), acc.end(), any ? kSumStart : 0.0f);
    for (int k = 0; k < K; ++k) {
      if (a.topk_idx[t * K + k] < 0) continue;
      const float w = a.topk_weights != nullptr ? a.topk_weights[t * K + k] : 1.0f;
      const uint16_t* y = reinterpret_cast<const uint16_t*>(comb_tokens + (t * K + k) * Hc);
      for (int64_t h = 0; h < hidden; ++h) {
        volatile float p = w * Bf16BitsToFloat(y[h]);
        acc[h] = acc[h] + p;
      }
    }
    StoreRow(acc, CombineDtype::kBFloat16, a.out, t);
  }
}

}  // namespace mori::ep
