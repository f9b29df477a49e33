// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The low-latency dispatch/combine kernel (low_latency_protocol.hpp): one kernel
// that runs the phases a launch asks for (kLlDispatchSend, ...), one warp per token
// (send, reduce) or per (expert, source) (expert-major layout). Written for few
// tokens per rank: every block recomputes the routing masks of all tokens in shared
// memory instead of a grid-wide scan. The arithmetic (bf16/fp8 rounding, the fp8
// cast, the reduction order, fp32 products and sums without fused multiply-adds) is
// the CPU implementation's (low_latency_cpu.cpp), so outputs are bit-identical.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "common/numeric.hpp"
#include "low_latency/cuda.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/block_device.cuh"
#include "mori/shmem/device.cuh"

namespace mori::ep::kernels {

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
// the same pes and counts. Not inlined, scalars only (as TrapLlTag).
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
// inlined, scalars only, so that the receive keeps its registers (as TrapLlTag).
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

// A sender's flag of another wire tag than this pe's (LlTagName): the first block's
// first thread to see one prints both, pe 0 traps at once, the others after the
// pause (as TrapRejected). Every pe with such a peer finds one: the tags differ
// pairwise. Not inlined, scalars only, so the wait keeps its registers.
__device__ __noinline__ void TrapLlTag(int me, int from, uint32_t theirs, uint32_t mine,
                                       uint64_t timeout_ns, bool dispatch) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    printf(
        "mori.ep low-latency %s on rank %d: rank %d sends %s %s, this rank %s (every rank must "
        "pass the same dtype and layout)\n",
        dispatch ? "dispatch" : "combine", me, from, LlTagName(theirs),
        dispatch ? "tokens" : "rows", LlTagName(mine));
    dev::TrapReported();
  }
  if (me != 0) {
    dev::PauseNs(dev::PeerTrapPauseNs(timeout_ns));
  }
  dev::TrapAfterReport();
}

// Waits for the W flags of `call` in `flags` (this pe's copy); threads < W wait,
// the block gets the counts and the first rejecting pe (or -1). A flag under another
// wire tag than `mine` traps naming both.
__device__ void WaitFlags(const LlParams& p, const uint64_t* flags, uint64_t call, int64_t* counts,
                          int* rejected_by, uint32_t mine, bool dispatch) {
  __shared__ int other_from;
  __shared__ uint32_t other_tag;
  if (threadIdx.x == 0) {
    *rejected_by = -1;
    other_from = -1;
  }
  __syncthreads();
  if (threadIdx.x < p.world) {
    const int s = threadIdx.x;
    const uint64_t w = dev::WaitUntil(&flags[s], Cmp::kGe, LlWord(call, 0), p.timeout_ns);
    const bool rej = CountOf(w) == kLlRejected;
    counts[s] = rej ? 0 : static_cast<int64_t>(CountOf(w));
    if (rej) atomicCAS(rejected_by, -1, s);
    if (!rej && RowTagOf(w) != mine && atomicCAS(&other_from, -1, s) == -1) other_tag = RowTagOf(w);
  }
  __syncthreads();
  if (*rejected_by < 0 && other_from >= 0) {
    TrapLlTag(p.me, other_from, other_tag, mine, p.timeout_ns, dispatch);
  }
}

// ------------------------------------------------------------- dispatch send
// kCe: the copy-engine variant (LlParams::copy_engine), a kernel of its own.
template <bool kCe>
__device__ void DispatchSend(const LlParams& p, uint64_t call, uint32_t* masks) {
  const Ctx c{p};
  const LlDispatchArgs& a = p.d;
  const int W = p.world, K = p.top_k, me = p.me;
  const int64_t P = p.recv_slots, n = a.num_tokens, hidden = p.hidden_dim;
  const int num_experts = p.experts_per_rank * W;
  const bool expert_major = a.layout == LlLayout::kExpertMajor;
  LlDeviceState* st = c.State();
  // Routing masks of every token (each block its own copy), and the id checks.
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    uint32_t mask = 0;
    const int32_t* row = a.indices + t * K;
    for (int j = 0; j < K; ++j) {
      const int32_t e = row[j];
      if (e == -1) continue;
      bool bad = e < 0 || e >= num_experts;
      const char* why = "out of range";
      if (!bad && expert_major) {
        for (int i = 0; i < j; ++i) bad |= row[i] == e;
        why = "repeated (the expert-major layout needs distinct experts)";
      }
      if (bad) {
        if (blockIdx.x == 0 && atomicCAS(&st->pad, 0u, 1u) == 0u) {
          printf(
              "mori.ep low-latency dispatch on rank %d: expert id %d %s at token %lld slot %d "
              "(valid: [-1, %d))\n",
              me, e, why, static_cast<long long>(t), j, num_experts);
          dev::TrapReported();
        }
        continue;
      }
      mask |= 1u << (e / p.experts_per_rank);
    }
    masks[t] = mask;
  }
  __syncthreads();

  const size_t half = DispHalf<kCe>(call);
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, Q = LlCastScales(hidden);
  // Where the rows for pe d go: its area (slot [me][j]), or with the copy engines for
  // d != me this pe's staging (slot [d][j], the host copies it after the kernel).
  const auto area = [&](size_t off, int d) -> char* {
    return kCe && d != me ? p.stage + (off - p.layout.disp_tokens) : c.Peer(off, d);
  };
  const size_t tok_off = p.layout.disp_tokens + half * p.layout.half_tokens;
  const size_t w_off = p.layout.disp_weights + half * p.layout.half_weights;
  const size_t s_off = p.layout.disp_scales + half * p.layout.half_scales;
  const size_t cs_off = p.layout.disp_cast_scales + half * p.layout.half_cast_scales;
  const size_t i_off = p.layout.disp_indices + half * p.layout.half_indices;
  const size_t src_off = p.layout.disp_src + half * p.layout.half_src;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  uint8_t* token_ranks = reinterpret_cast<uint8_t*>(c.Local(p.layout.token_ranks));
  for (int64_t t = gwarp; t < n; t += nwarps) {
    const uint32_t mask = masks[t];
    // Slot of t in each destination: the tokens before it routed there.
    int before[kMaxCudaWorldSize];
    for (int d = 0; d < W; ++d) before[d] = 0;
    for (int64_t u = lane; u < t; u += 32) {
      const uint32_t m = masks[u];
      for (int d = 0; d < W; ++d) before[d] += (m >> d) & 1;
    }
    for (int d = 0; d < W; ++d) before[d] = WarpSum(before[d]);
    if (lane < W) token_ranks[t * W + lane] = (mask >> lane) & 1;
    const char* row = static_cast<const char*>(a.tokens) + t * a.token_row_bytes;
    for (int d = 0; d < W; ++d) {
      // Past the receive slots: no row (the last block rejects the call).
      if (!((mask >> d) & 1) || before[d] >= P) continue;
      const int64_t slot = (kCe && d != me ? d : me) * P + before[d];
      if (a.fp8_cast) {
        const uint16_t* x = reinterpret_cast<const uint16_t*>(row);
        uint8_t* dst = reinterpret_cast<uint8_t*>(area(tok_off, d)) + slot * H;
        float* dsc = reinterpret_cast<float*>(area(cs_off, d)) + slot * Q;
        for (int64_t g = 0; g < Q; ++g) {
          float v[4];
          float amax = kLlCastMargin;
          for (int i = 0; i < 4; ++i) {
            v[i] = Bf16BitsToFloat(x[g * kLlCastGroup + lane * 4 + i]);
            amax = fmaxf(amax, fabsf(v[i]));
          }
          amax = WarpMax(amax);
          float inv;
          const float scale = LlCastScale(amax, a.round_scale, &inv);
          uint32_t packed = 0;
          for (int i = 0; i < 4; ++i) {
            packed |= static_cast<uint32_t>(FloatToFloat8E4M3(__fmul_rn(v[i], scale))) << (8 * i);
          }
          reinterpret_cast<uint32_t*>(dst + g * kLlCastGroup)[lane] = packed;
          if (lane == 0) dsc[g] = inv;
        }
      } else {
        char* dst = area(tok_off, d) + slot * H;
        mori::shmem::device::detail::CopyBytes(dst, row, a.token_row_bytes, lane, 32);
      }
      float* dw = reinterpret_cast<float*>(area(w_off, d)) + slot * K;
      int32_t* di = reinterpret_cast<int32_t*>(area(i_off, d)) + slot * K;
      if (lane < K) {
        dw[lane] = a.weights != nullptr ? a.weights[t * K + lane] : 0.0f;
        di[lane] = a.indices[t * K + lane];
      }
      if (Sb > 0 && a.scales != nullptr) {
        mori::shmem::device::detail::CopyBytes(area(s_off, d) + slot * Sb,
                                               static_cast<const char*>(a.scales) + t * Sb, Sb,
                                               lane, 32);
      }
      if (lane == 0) reinterpret_cast<int32_t*>(area(src_off, d))[slot] = static_cast<int32_t>(t);
    }
  }
  if (FinishBlock(&st->blocks_done)) {
    // The last block: every block's rows are released; post the counts. A count past
    // the receive slots rejects the call, its note (the first such pe) written into
    // every pe before the flag that releases it.
    __shared__ int64_t sent[kMaxCudaWorldSize];
    __shared__ int over;
    if (threadIdx.x == 0) over = W;
    __syncthreads();
    if (threadIdx.x < W) {
      const int d = threadIdx.x;
      int64_t count = 0;
      for (int64_t t = 0; t < n; ++t) count += (masks[t] >> d) & 1;
      sent[d] = count;
      if (count > P) atomicMin(&over, d);
    }
    __syncthreads();
    const bool rejected = st->pad != 0 || over < W;
    if (threadIdx.x < W) {
      const int d = threadIdx.x;
      if (over < W) {
        LlOverNote* note =
            reinterpret_cast<LlOverNote*>(c.Peer(p.layout.disp_over, d)) + half * W + me;
        note->word = LlWord(call, static_cast<uint64_t>(sent[over]));
        note->dest = static_cast<uint64_t>(over);
      }
      uint64_t* flags = reinterpret_cast<uint64_t*>(c.Local(p.layout.disp_flag)) + half * W;
      const uint64_t word = LlWord(call, rejected ? kLlRejected : sent[d], LlDispatchTag(a));
      if (kCe && d != me && !rejected) {
        // The host copies it after the rows. d's area is single-buffered: wait until d
        // consumed this pe's previous call (its receive posts that) before the copies.
        p.stage_flags[d] = word;
        const uint64_t* consumed = reinterpret_cast<const uint64_t*>(c.Local(p.layout.disp_consumed));
        dev::WaitUntil(&consumed[d], Cmp::kGe, LlWord(call - 1, 0), p.timeout_ns);
      } else {
        dev::SignalSet(p.ctx, &flags[me], word, d);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) st->dispatch_calls = call;
    if (rejected) {
      if (over < W && threadIdx.x == 0) {
        ReportOverCap(me, me, static_cast<uint64_t>(sent[over]), static_cast<uint64_t>(over), P);
      }
      // Receive the call as every pe does (its flags), then end the launch.
      const uint64_t* flags =
          reinterpret_cast<const uint64_t*>(c.Local(p.layout.disp_flag)) + half * W;
      if (threadIdx.x < W)
        dev::WaitUntil(&flags[threadIdx.x], Cmp::kGe, LlWord(call, 0), p.timeout_ns);
      __syncthreads();
      if (threadIdx.x == 0) st->pad = 0;
      __threadfence();
      dev::TrapAfterReport();
    }
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

// A copy-engine op's combine writes a single-buffered area: before any row, every
// block waits until each other pe consumed this pe's previous combine.
__device__ void WaitCombConsumed(const LlParams& p, uint64_t call) {
  const uint64_t* consumed =
      reinterpret_cast<const uint64_t*>(p.block + p.layout.comb_consumed);
  if (threadIdx.x < p.world && threadIdx.x != p.me) {
    dev::WaitUntil(&consumed[threadIdx.x], Cmp::kGe, LlWord(call - 1, 0), p.timeout_ns);
  }
  __syncthreads();
}

// ---------------------------------------------------------- dispatch receive
template <bool kCe>
__device__ void DispatchRecv(const LlParams& p, uint64_t call) {
  const Ctx c{p};
  const LlRecvArgs& o = p.r;
  const int W = p.world, K = p.top_k, E = p.experts_per_rank;
  const int64_t M = p.max_tokens, P = p.recv_slots, WM = W * M, hidden = p.hidden_dim;
  const size_t half = DispHalf<kCe>(call);
  __shared__ int64_t counts[kMaxCudaWorldSize];
  __shared__ int64_t base[kMaxCudaWorldSize + 1];
  __shared__ int rejected_by;
  const uint64_t* flags = reinterpret_cast<const uint64_t*>(c.Local(p.layout.disp_flag)) + half * W;
  WaitFlags(p, flags, call, counts, &rejected_by, LlDispatchTag(p.d), true);
  if (rejected_by >= 0) {
    TrapRejected(p, rejected_by, "dispatch",
                 reinterpret_cast<const LlOverNote*>(c.Local(p.layout.disp_over)) + half * W, call);
  }
  if (threadIdx.x == 0) {
    base[0] = 0;
    for (int s = 0; s < W; ++s) base[s + 1] = base[s] + counts[s];
  }
  __syncthreads();
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, Q = LlCastScales(hidden);
  const char* tokens = c.Local(p.layout.disp_tokens + half * p.layout.half_tokens);
  const float* weights =
      reinterpret_cast<const float*>(c.Local(p.layout.disp_weights + half * p.layout.half_weights));
  const char* scales = c.Local(p.layout.disp_scales + half * p.layout.half_scales);
  const float* cast = reinterpret_cast<const float*>(
      c.Local(p.layout.disp_cast_scales + half * p.layout.half_cast_scales));
  const int32_t* indices = reinterpret_cast<const int32_t*>(
      c.Local(p.layout.disp_indices + half * p.layout.half_indices));
  const int32_t* src =
      reinterpret_cast<const int32_t*>(c.Local(p.layout.disp_src + half * p.layout.half_src));
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;

  if (p.recv_layout == LlLayout::kTokenMajor) {
    const int64_t rb = p.recv_row_bytes;
    for (int64_t row = gwarp; row < base[W]; row += nwarps) {
      int s = 0;
      while (row >= base[s + 1]) ++s;
      const int64_t slot = s * P + (row - base[s]);
      mori::shmem::device::detail::CopyBytes(static_cast<char*>(o.out_tokens) + row * H,
                                             tokens + slot * H, rb, lane, 32);
      if (lane < K) {
        o.out_weights[row * K + lane] = weights[slot * K + lane];
        o.out_indices[row * K + lane] = indices[slot * K + lane];
      }
      if (Sb > 0 && o.out_scales != nullptr) {
        mori::shmem::device::detail::CopyBytes(static_cast<char*>(o.out_scales) + row * Sb,
                                               scales + slot * Sb, Sb, lane, 32);
      }
      if (lane == 0) o.out_src_pos[row] = EncodeSrcPos(s, src[slot], M);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *o.total_recv = static_cast<int32_t>(base[W]);
    PostConsumed<kCe>(p, call);
    return;
  }

  // Expert-major: warp per (local expert e, source s).
  const int32_t lo = p.me * E;
  int32_t* disp_pos = reinterpret_cast<int32_t*>(c.Local(p.layout.disp_pos));
  const int64_t xb = p.recv_fp8 ? hidden : p.recv_row_bytes;
  auto slot_of = [&](int64_t slot, int e) -> int {  // the k naming e in that row, or -1
    int kk = -1;
    for (int k = 0; k < K; ++k) kk = (kk < 0 && indices[slot * K + k] == lo + e) ? k : kk;
    return kk;
  };
  for (int64_t item = gwarp; item < static_cast<int64_t>(E) * W; item += nwarps) {
    const int e = static_cast<int>(item / W), s = static_cast<int>(item % W);
    int64_t begin = 0;
    for (int s2 = 0; s2 < s; ++s2) {
      for (int64_t j0 = 0; j0 < counts[s2]; j0 += 32) {
        const bool hit = j0 + lane < counts[s2] && slot_of(s2 * P + j0 + lane, e) >= 0;
        begin += __popc(__ballot_sync(kFull, hit));
      }
    }
    int64_t pos = begin;
    for (int64_t j0 = 0; j0 < counts[s]; j0 += 32) {
      const int64_t j = j0 + lane;
      const int k = j < counts[s] ? slot_of(s * P + j, e) : -1;
      uint32_t hits = __ballot_sync(kFull, k >= 0);
      while (hits != 0) {
        const int l = __ffs(hits) - 1;
        hits &= hits - 1;
        const int64_t slot = s * P + j0 + l;
        const int kl = __shfl_sync(kFull, k, l);
        const int64_t r = e * WM + pos;
        mori::shmem::device::detail::CopyBytes(static_cast<char*>(o.packed_x) + r * xb,
                                               tokens + slot * H, xb, lane, 32);
        if (lane == 0) {
          o.src_info[r] = static_cast<int32_t>(s * o.src_info_stride + src[slot]);
          o.slot_k[r] = kl;
          disp_pos[slot * K + kl] = static_cast<int32_t>(r);
        }
        if (p.recv_fp8) {
          for (int64_t q = lane; q < Q; q += 32) {
            const float v = cast[slot * Q + q];
            if (o.ue8m0) {
              static_cast<uint8_t*>(
                  o.packed_scales)[((e * (Q / 4) + q / 4) * WM + pos) * 4 + q % 4] =
                  static_cast<uint8_t>(__float_as_uint(v) >> 23);
            } else {
              static_cast<float*>(o.packed_scales)[(e * Q + q) * WM + pos] = v;
            }
          }
        }
        ++pos;
      }
    }
    if (lane == 0) {
      o.layout_range[e * W + s] = (begin << 32) | (pos - begin);
      if (s == W - 1) o.packed_count[e] = static_cast<int32_t>(pos);
    }
  }
  PostConsumed<kCe>(p, call);
}

// -------------------------------------------------------------- combine send
// Pre-reduced expert-major combine send (low_latency_protocol.hpp). Not inlined: its
// 8-column accumulators would otherwise raise the register pressure of every phase.
__device__ __forceinline__ void CombineSendPartials(const LlParams& p, size_t ct_off) {
  const Ctx c{p};
  const LlCombineArgs& a = p.c;
  const int W = p.world, K = p.top_k, E = p.experts_per_rank, me = p.me;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  LlDeviceState* st = c.State();
  // Per received token of the last dispatch (its half and counts: no peer rewrites
  // them before this pe's next dispatch), the sum over its local slots k ascending
  // of w * y from -0.0, one fp32 row to the source's slot [t][me].
  const uint64_t dcall = st->dispatch_calls;
  const size_t dh = DispHalf(p, dcall);
  const int64_t P = p.recv_slots, hidden = p.hidden_dim, stride = a.input_row_stride / 2;
  const uint64_t* dflags =
      reinterpret_cast<const uint64_t*>(c.Local(p.layout.disp_flag)) + dh * W;
  __shared__ int64_t base[kMaxCudaWorldSize + 1];
  if (threadIdx.x == 0) {
    base[0] = 0;
    for (int s = 0; s < W; ++s) base[s + 1] = base[s] + static_cast<int64_t>(CountOf(dflags[s]));
  }
  __syncthreads();
  const float* weights = reinterpret_cast<const float*>(
      c.Local(p.layout.disp_weights + dh * p.layout.half_weights));
  const int32_t* indices = reinterpret_cast<const int32_t*>(
      c.Local(p.layout.disp_indices + dh * p.layout.half_indices));
  const int32_t* src =
      reinterpret_cast<const int32_t*>(c.Local(p.layout.disp_src + dh * p.layout.half_src));
  const int32_t* disp_pos = reinterpret_cast<const int32_t*>(c.Local(p.layout.disp_pos));
  const uint16_t* y = reinterpret_cast<const uint16_t*>(a.input);
  const int32_t lo = me * E;
  const int64_t Hp = hidden * 4;
  // Items are (received token, 256 columns): a lane sums 8 columns over the token's
  // local slots (16-byte loads where rows allow, independent across k so several are
  // in flight) and stores 32 bytes of the fp32 partial into the source.
  const int64_t chunks = (hidden + 255) / 256;
  const bool vec = hidden % 8 == 0 && stride % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 16 == 0;
  for (int64_t item = gwarp; item < base[W] * chunks; item += nwarps) {
    const int64_t tok = item / chunks, h0 = (item % chunks) * 256 + lane * 8;
    int s = 0;
    while (tok >= base[s + 1]) ++s;
    const int64_t slot = s * P + (tok - base[s]);
    // Lane k < K holds slot k's packed row (or -1 when its expert is not here) and weight.
    int32_t row = -1;
    float w = 0.0f;
    if (lane < K) {
      const int32_t g = indices[slot * K + lane];
      if (g >= lo && g < lo + E) {
        row = disp_pos[slot * K + lane];
        w = weights[slot * K + lane];
      }
    }
    float acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = kSumStart;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      const int32_t rk = __shfl_sync(kFull, row, k);
      const float wk = __shfl_sync(kFull, w, k);
      if (rk < 0 || h0 >= hidden) continue;
      const uint16_t* yr = y + static_cast<int64_t>(rk) * stride + h0;
      uint16_t v[8];
      if (vec) {
        *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(yr);
      } else {
        for (int i = 0; i < 8; ++i) v[i] = h0 + i < hidden ? yr[i] : 0;
      }
      for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(wk, Bf16BitsToFloat(v[i])));
    }
    if (h0 >= hidden) continue;
    float* dst = reinterpret_cast<float*>(c.Peer(ct_off, s) + (src[slot] * W + me) * Hp) + h0;
    if (vec) {
      reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
      for (int i = 0; i < 8 && h0 + i < hidden; ++i) dst[i] = acc[i];
    }
  }
}

// kLlPartials: the pre-reduced expert-major combine (LlCombineArgs::pre_reduce);
// kLlCopyEngine: a copy-engine op's combine (token-major rows for other pes go to the
// staging, the host copies them; every combine of such an op uses half 0).
template <int kVariant>
__device__ void CombineSend(const LlParams& p, uint64_t call) {
  constexpr bool kPartials = CombinePartials<kVariant>, kCe = kVariant == kLlCopyEngine;
  constexpr bool ce = CombineCe<kVariant>;
  const Ctx c{p};
  const LlCombineArgs& a = p.c;
  const int W = p.world, K = p.top_k, E = p.experts_per_rank, me = p.me;
  const int64_t M = p.max_tokens, WM = W * M, Hc = p.combine_row_bytes;
  const size_t half = ce ? 0 : (call & 1);
  if constexpr (ce) WaitCombConsumed(p, call);
  const size_t ct_off = p.layout.comb_tokens + half * p.layout.half_comb_tokens;
  const size_t cw_off = p.layout.comb_weights + half * p.layout.half_comb_weights;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  const char* input = static_cast<const char*>(a.input);
  LlDeviceState* st = c.State();
  if (a.layout == LlLayout::kTokenMajor) {
    const int64_t total = *p.total_recv;
    if (total > a.input_rows) {
      if (blockIdx.x == 0 && threadIdx.x == 0) {
        printf(
            "mori.ep low-latency combine on rank %d: input has %lld rows, fewer than "
            "total_recv %lld\n",
            me, static_cast<long long>(a.input_rows), static_cast<long long>(total));
        dev::TrapReported();
      }
      dev::TrapAfterReport();
    }
    const int64_t eb = CombineElementBytes(a.dtype);
    // Copy engines: rows for other pes into the staging (slot [s][t]), copied after.
    const auto area = [&](size_t off, int s) -> char* {
      return kCe && s != me ? p.stage_comb + (off - p.layout.comb_tokens) : c.Peer(off, s);
    };
    for (int64_t i = gwarp; i < total; i += nwarps) {
      const int s = static_cast<int>(a.src_pos[i] / M);
      const int64_t t = a.src_pos[i] % M;
      const int64_t slot = (kCe && s != me ? s : me) * M + t;
      mori::shmem::device::detail::CopyBytes(area(ct_off, s) + slot * Hc,
                                             input + i * a.input_row_stride, p.hidden_dim * eb,
                                             lane, 32);
      if (a.weights != nullptr && lane < K) {
        reinterpret_cast<float*>(area(cw_off, s))[slot * K + lane] = a.weights[i * K + lane];
      }
    }
  } else if constexpr (kPartials) {
    CombineSendPartials(p, ct_off);
  } else {
    // Only the rows that exist: each block sums every expert's rows over the sources
    // (layout_range) and a warp scans them into prefix[], then a warp per row finds its
    // expert by bisection and its source among W ranges.
    __shared__ int64_t prefix[kLlMaxScanExperts + 1];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      int64_t total = 0;
      for (int s2 = 0; s2 < W; ++s2) total += a.layout_range[e * W + s2] & 0xFFFFFFFF;
      prefix[e + 1] = total;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      int64_t carry = 0;
      for (int b0 = 0; b0 < E; b0 += 32) {
        int64_t v = b0 + lane < E ? prefix[b0 + lane + 1] : 0;
        for (int o = 1; o < 32; o <<= 1) {
          const int64_t u = __shfl_up_sync(kFull, v, o);
          if (lane >= o) v += u;
        }
        if (b0 + lane < E) prefix[b0 + lane + 1] = v + carry;
        carry += __shfl_sync(kFull, v, 31);
      }
      if (lane == 0) prefix[0] = 0;
    }
    __syncthreads();
    for (int64_t item = gwarp; item < prefix[E]; item += nwarps) {
      int lo = 0, hi = E;  // the expert e with prefix[e] <= item < prefix[e + 1]
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (prefix[mid] <= item) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      const int e = lo;
      const int64_t pos = item - prefix[e];
      int s = -1;
      for (int s2 = 0; s2 < W; ++s2) {
        const int64_t range = a.layout_range[e * W + s2];
        const int64_t b = range >> 32, cnt = range & 0xFFFFFFFF;
        if (pos >= b && pos < b + cnt) s = s2;
      }
      if (s < 0) continue;
      const int64_t r = e * WM + pos;
      const int64_t t = a.src_info[r] - s * a.src_info_stride;
      const int64_t slot = t * K + a.slot_k[r];
      mori::shmem::device::detail::CopyBytes(c.Peer(ct_off, s) + slot * Hc,
                                             input + r * a.input_row_stride, p.hidden_dim * 2, lane,
                                             32);
    }
  }
  if (FinishBlock(&st->blocks_done)) {
    if (threadIdx.x < W) {
      uint64_t* flags = reinterpret_cast<uint64_t*>(c.Local(p.layout.comb_flag)) + half * W;
      const uint64_t word = LlWord(call, 0, LlCombineTag(p.c));
      if (kCe && a.layout == LlLayout::kTokenMajor && threadIdx.x != me) {
        p.stage_comb_flags[threadIdx.x] = word;  // the host copies it after the rows
      } else {
        dev::SignalSet(p.ctx, &flags[me], word, threadIdx.x);
      }
    }
    if (threadIdx.x == 0) st->combine_calls = call;
  }
}

// Up to 32 bytes by one thread: 16-, 8- or 4-byte accesses where both ends allow.
__device__ __forceinline__ void CopySmall(char* dst, const char* src, int64_t n) {
  const uintptr_t both = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  int64_t i = 0;
  if ((both & 15) == 0) {
    for (; i + 16 <= n; i += 16) {
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
    }
  } else if ((both & 7) == 0) {
    for (; i + 8 <= n; i += 8) {
      *reinterpret_cast<uint2*>(dst + i) = *reinterpret_cast<const uint2*>(src + i);
    }
  } else if ((both & 3) == 0) {
    for (; i + 4 <= n; i += 4) {
      *reinterpret_cast<uint32_t*>(dst + i) = *reinterpret_cast<const uint32_t*>(src + i);
    }
  }
  for (; i < n; ++i) dst[i] = src[i];
}

__device__ __forceinline__ void StoreValue(void* out, int64_t i, float v, CombineDtype dtype) {
  switch (dtype) {
    case CombineDtype::kBFloat16:
      static_cast<uint16_t*>(out)[i] = FloatToBf16Bits(v);
      return;
    case CombineDtype::kFloat8E4M3:
      static_cast<uint8_t*>(out)[i] = FloatToFloat8E4M3(v);
      return;
    case CombineDtype::kFloat32:
      break;
  }
  static_cast<float*>(out)[i] = v;
}

// ----------------------------------------------------------- combine receive
template <int kVariant>
__device__ void CombineRecv(const LlParams& p, uint64_t call) {
  constexpr bool kPartials = CombinePartials<kVariant>;
  constexpr bool ce = CombineCe<kVariant>;
  const Ctx c{p};
  const LlCombineArgs& a = p.c;
  const int W = p.world, K = p.top_k;
  const int64_t M = p.max_tokens, hidden = p.hidden_dim, Hc = p.combine_row_bytes;
  const size_t half = ce ? 0 : (call & 1);
  __shared__ int64_t counts[kMaxCudaWorldSize];
  __shared__ int rejected_by;
  const uint64_t* flags = reinterpret_cast<const uint64_t*>(c.Local(p.layout.comb_flag)) + half * W;
  WaitFlags(p, flags, call, counts, &rejected_by, LlCombineTag(p.c), false);
  if (rejected_by >= 0) TrapRejected(p, rejected_by, "combine", nullptr, call);
  const char* comb = c.Local(p.layout.comb_tokens + half * p.layout.half_comb_tokens);
  const float* combw = reinterpret_cast<const float*>(
      c.Local(p.layout.comb_weights + half * p.layout.half_comb_weights));
  const uint8_t* token_ranks = reinterpret_cast<const uint8_t*>(c.Local(p.layout.token_ranks));
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x / 32;
  const int64_t gwarp = blockIdx.x * warps + threadIdx.x / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * warps;
  if (a.layout == LlLayout::kTokenMajor) {
    const int64_t n = p.combine_tokens;
    const int64_t eb = CombineElementBytes(a.dtype), row_bytes = hidden * eb;
    // Items are (token, 128 columns), 4 per lane, so that a few tokens still spread
    // over many warps (a warp per token walked a 7168-column row alone).
    const int64_t chunks = (hidden + 127) / 128;
    for (int64_t item = gwarp; item < n * chunks; item += nwarps) {
      const int64_t t = item / chunks, h0 = (item % chunks) * 128 + lane * 4;
      // As CombineTokenRow / CombineTokenWeights (numeric.hpp): no part: zeros; one
      // part: its bytes; else an fp32 sum from -0.0 in ascending pe order.
      int parts = 0, only = 0;
      for (int d = 0; d < W; ++d) {
        if (token_ranks[t * W + d]) ++parts, only = d;
      }
      if (h0 < hidden) {
        const int64_t cols = hidden - h0 < 4 ? hidden - h0 : 4;
        char* o = static_cast<char*>(a.out) + t * row_bytes + h0 * eb;
        if (parts == 0) {
          for (int64_t i = 0; i < cols * eb; ++i) o[i] = 0;
        } else if (CopiesSinglePart(parts, a.fp8_cast)) {
          CopySmall(o, comb + (only * M + t) * Hc + h0 * eb, cols * eb);
        } else {
          float acc[4];
          for (int i = 0; i < 4; ++i) acc[i] = kSumStart;
          for (int d = 0; d < W; ++d) {
            if (!token_ranks[t * W + d]) continue;
            const char* row = comb + (d * M + t) * Hc;
            for (int i = 0; i < cols; ++i) {
              acc[i] = __fadd_rn(acc[i], CombineElementValue(row, h0 + i, a.dtype, a.fp8_cast));
            }
          }
          for (int i = 0; i < cols; ++i) StoreValue(a.out, t * hidden + h0 + i, acc[i], a.dtype);
        }
      }
      if (item % chunks == 0 && a.out_weights != nullptr && lane < K) {
        float acc = parts == 0 ? 0.0f : kSumStart;
        for (int d = 0; d < W; ++d) {
          if (!token_ranks[t * W + d]) continue;
          const float w = combw[(d * M + t) * K + lane];
          acc = parts == 1 ? w : __fadd_rn(acc, w);
        }
        a.out_weights[t * K + lane] = acc;
      }
    }
    PostConsumed<ce>(p, call, true);  // every block gets here
    return;
  }
  if constexpr (kPartials) {
    // The partials of the pes each token went to, ascending pe (low_latency_cpu.cpp);
    // items are (token, 128 columns), 4 per lane (16-byte loads where rows allow).
    const int64_t Hp = hidden * 4;
    const int64_t chunks = (hidden + 127) / 128;
    const bool vec = hidden % 4 == 0;
    uint16_t* out = static_cast<uint16_t*>(a.out);
    for (int64_t item = gwarp; item < a.num_tokens * chunks; item += nwarps) {
      const int64_t t = item / chunks, h0 = (item % chunks) * 128 + lane * 4;
      if (h0 >= hidden) continue;
      bool any = false;
      for (int d = 0; d < W; ++d) any |= token_ranks[t * W + d] != 0;
      float acc[4];
      for (int i = 0; i < 4; ++i) acc[i] = any ? kSumStart : 0.0f;
      for (int d = 0; d < W; ++d) {
        if (!token_ranks[t * W + d]) continue;
        const float* part = reinterpret_cast<const float*>(comb + (t * W + d) * Hp) + h0;
        float v[4];
        if (vec) {
          *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(part);
        } else {
          for (int i = 0; i < 4; ++i) v[i] = h0 + i < hidden ? part[i] : 0.0f;
        }
        for (int i = 0; i < 4; ++i) acc[i] = __fadd_rn(acc[i], v[i]);
      }
      for (int i = 0; i < 4 && h0 + i < hidden; ++i) out[t * hidden + h0 + i] = FloatToBf16Bits(acc[i]);
    }
    PostConsumed<ce>(p, call, true);  // every block gets here
  } else {
    // Items are (token, 128 columns), 4 per lane; lane k < K holds slot k's id and
    // weight. No part: zeros; else a sum from -0.0 over k ascending (low_latency_cpu.cpp).
    const int64_t chunks = (hidden + 127) / 128;
    const bool vec = hidden % 4 == 0 && Hc % 8 == 0;
    for (int64_t item = gwarp; item < a.num_tokens * chunks; item += nwarps) {
      const int64_t t = item / chunks, h0 = (item % chunks) * 128 + lane * 4;
      int32_t g = -1;
      float w = 1.0f;
      if (lane < K) {
        g = a.topk_idx[t * K + lane];
        if (a.topk_weights != nullptr) w = a.topk_weights[t * K + lane];
      }
      const bool any = __any_sync(kFull, lane < K && g >= 0);
      float acc[4];
      for (int i = 0; i < 4; ++i) acc[i] = any ? kSumStart : 0.0f;
      for (int k = 0; k < K; ++k) {
        const int32_t gk = __shfl_sync(kFull, g, k);
        const float wk = __shfl_sync(kFull, w, k);
        if (gk < 0 || h0 >= hidden) continue;
        const uint16_t* y = reinterpret_cast<const uint16_t*>(comb + (t * K + k) * Hc) + h0;
        uint16_t v[4];
        if (vec) {
          *reinterpret_cast<uint2*>(v) = *reinterpret_cast<const uint2*>(y);
        } else {
          for (int i = 0; i < 4; ++i) v[i] = h0 + i < hidden ? y[i] : 0;
        }
        for (int i = 0; i < 4; ++i) {
          acc[i] = __fadd_rn(acc[i], __fmul_rn(wk, Bf16BitsToFloat(v[i])));
        }
      }
      for (int i = 0; i < 4 && h0 + i < hidden; ++i) {
        static_cast<uint16_t*>(a.out)[t * hidden + h0 + i] = FloatToBf16Bits(acc[i]);
      }
    }
    PostConsumed<ce>(p, call, true);
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
      half * W;
  if (threadIdx.x < W) dev::SignalSet(p.ctx, &flags[p.me], LlWord(call, kLlRejected), threadIdx.x);
  if (threadIdx.x < W) dev::WaitUntil(&flags[threadIdx.x], Cmp::kGe, LlWord(call, 0), p.timeout_ns);
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

// A dispatch kernel runs dispatch phases (send, receive, reject), a combine kernel
// combine phases; a launch never mixes them, and each kernel's registers are its own.
// (The names carry "DispatchKernel" / "CombineKernel": the bench's profiler reads them.)
template <int kVariant>
__global__ void __launch_bounds__(kLlMaxWarps * 32, 1)
    LowLatencyDispatchKernel(const __grid_constant__ LlParams p) {
  constexpr bool kCe = kVariant == kLlCopyEngine;
  extern __shared__ uint32_t masks[];
  LlDeviceState* st = Ctx{p}.State();
  if (p.phases & kLlRejectDispatch) return Reject<kCe>(p, true);
  // Every block reads the counter before any block can advance it (the last block of
  // the send phase does, after every block arrived there).
  const uint64_t dcall = st->dispatch_calls + ((p.phases & kLlDispatchSend) ? 1 : 0);
  __syncthreads();
  if (p.phases & kLlDispatchSend) DispatchSend<kCe>(p, dcall, masks);
  if (p.phases & kLlDispatchRecv) DispatchRecv<kCe>(p, dcall);
}

template <int kVariant>
__global__ void __launch_bounds__(kLlMaxWarps * 32, 1)
    LowLatencyCombineKernel(const __grid_constant__ LlParams p) {
  constexpr bool kCe = kVariant == kLlCopyEngine;
  LlDeviceState* st = Ctx{p}.State();
  if (p.phases & kLlRejectCombine) return Reject<kCe>(p, false);
  const uint64_t ccall = st->combine_calls + ((p.phases & kLlCombineSend) ? 1 : 0);
  __syncthreads();
  if (p.phases & kLlCombineSend) CombineSend<kVariant>(p, ccall);
  if (p.phases & kLlCombineRecv) CombineRecv<kVariant>(p, ccall);
}

}  // namespace

void LaunchLowLatency(const LlParams& p, int blocks, int threads, uintptr_t stream) {
  const size_t smem = (p.phases & kLlDispatchSend) ? static_cast<size_t>(p.max_tokens) * 4 : 0;
  const bool dispatch = (p.phases & (kLlDispatchSend | kLlDispatchRecv | kLlRejectDispatch)) != 0;
  const bool combine = (p.phases & (kLlCombineSend | kLlCombineRecv)) != 0;
  MORI_CHECK(!(dispatch && combine), "a low-latency launch mixes dispatch and combine phases");
  auto kernel = LowLatencyCombineKernel<kLlDefault>;
  if (dispatch) {
    kernel = p.copy_engine ? LowLatencyDispatchKernel<kLlCopyEngine>
                           : LowLatencyDispatchKernel<kLlDefault>;
  } else if (p.c.pre_reduce && (p.phases & kLlRejectCombine) == 0) {
    kernel = p.copy_engine ? LowLatencyCombineKernel<kLlPartialsCe>
                           : LowLatencyCombineKernel<kLlPartials>;
  } else if (p.copy_engine) {
    kernel = LowLatencyCombineKernel<kLlCopyEngine>;
  }
  if (smem > 48 * 1024) {
    MORI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  kernel<<<blocks, threads, smem, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mori::ep::kernels
