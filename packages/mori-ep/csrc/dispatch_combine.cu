// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CUDA kernels of the intra-node protocol (protocol.hpp, README "The
// intra-node protocol"), step for step the operations of dispatch_combine_cpu.cpp:
//
// dispatch (one kernel, every block co-resident):
//   1. every block routes all tokens (rank masks, expert id check) and counts, per
//      destination, all tokens and those before its own chunk of tokens;
//   2. warp 0 of block 0 posts this pe's count row, tagged with the epoch, into every
//      pe (SignalSet, release.sys); warp 0 of every block waits for all W x W words
//      of the epoch (WaitUntil, acquire.sys) and checks for rejections;
//   3. each block scans its chunk tile by tile (ballots per destination) to give
//      every (token, destination) its row base(me, d) + prefix, then its warps put
//      the rows (16-byte vectorized) with weights, scales, indices and src_pos;
//   4. Quiet + a grid-completion counter: the last block signals dispatch_done to
//      every pe, waits for every pe's, advances the epoch in device memory.
// combine (one kernel, every block co-resident):
//   1. warps put received rows (and weights) into slot [me][t] of their source pe;
//   2. Quiet + the completion counter: the last block signals combine_done to every
//      pe; every block waits for all W combine_done words (acquire);
//   3. warps reduce tokens over the pes they went to, in ascending pe order, fp32,
//      rounded once (the CPU implementation's order, hence its bits).
#include <cuda_runtime.h>

#include <algorithm>

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
constexpr unsigned kFull = 0xFFFFFFFFu;

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
};

struct CombineParams {
  Common c;
  int64_t hidden, combine_row_bytes, row_bytes;
  const char* input;
  int64_t input_row_stride, input_rows;
  bool bfloat16;
  const float* weights;
  void* out;
  float* out_weights;
  int64_t num_tokens;
};

template <typename T>
__device__ __forceinline__ T* At(const Common& c, size_t offset) {
  return reinterpret_cast<T*>(c.block + offset);
}

__device__ __forceinline__ EpDeviceState* State(const Common& c) {
  return At<EpDeviceState>(c, c.layout.state);
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

// The set of pes token t goes to, as a bit mask. An id outside [-1, num_experts)
// rejects the epoch on every pe (so peers fail fast instead of timing out) and traps.
__device__ uint32_t RankMask(const DispatchParams& p, int64_t t, uint64_t epoch) {
  const int32_t* row = p.indices + t * p.c.top_k;
  uint32_t mask = 0;
  for (int j = 0; j < p.c.top_k; ++j) {
    const int32_t e = row[j];
    if (e == -1) continue;
    if (e < 0 || e >= p.num_experts) {
      printf(
          "mori.ep dispatch on rank %d: expert id %d out of range [-1, %d) at token %lld slot "
          "%d\n",
          p.c.me, e, p.num_experts, static_cast<long long>(t), j);
      PostRejectedCounts(p.c, epoch, 0, 1);
      __trap();
    }
    mask |= 1u << ExpertRank(e, p.experts_per_rank);
  }
  return mask;
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
      __trap();
    }
    if (CountOf(w) == kRejectedCount) {
      printf(
          "mori.ep dispatch on rank %d: dispatch rejected by rank %u (its inputs failed "
          "validation; see its error)\n",
          c.me, i / c.world);
      __trap();
    }
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

__global__ void __launch_bounds__(kMaxThreads) DispatchKernel(DispatchParams p) {
  const Common& c = p.c;
  const int W = c.world, me = c.me, K = c.top_k;
  const unsigned tid = threadIdx.x, nthreads = blockDim.x;
  const unsigned lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  EpDeviceState* state = State(c);
  const uint64_t epoch = state->epoch + 1;

  __shared__ uint32_t s_total[kW], s_before[kW], s_run[kW];
  __shared__ uint32_t s_counts[kW * kW];
  __shared__ uint32_t s_warp[kMaxWarpsPerBlock][kW];
  __shared__ int32_t s_rows[kMaxThreads][kW];
  if (tid < kW) s_total[tid] = s_before[tid] = 0;
  __syncthreads();

  // 1. Count: all tokens, and those before this block's chunk.
  const int64_t n = p.num_tokens;
  const int64_t chunk = (n + gridDim.x - 1) / gridDim.x;
  const int64_t lo = std::min<int64_t>(chunk * blockIdx.x, n);
  const int64_t hi = std::min<int64_t>(lo + chunk, n);
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

  // 2. Exchange: post my row everywhere (block 0), wait for every row (each block).
  uint64_t* count_words = At<uint64_t>(c, c.layout.count_words);
  if (blockIdx.x == 0 && warp == 0) {
    for (unsigned i = lane; i < static_cast<unsigned>(W * W); i += 32) {
      const int pe = static_cast<int>(i / W), d = static_cast<int>(i % W);
      dev::SignalSet(c.ctx, &count_words[me * W + d], CountWord(epoch, s_total[d]), pe);
    }
  }
  if (warp == 0) WaitCountWords(c, epoch, lane, s_counts);
  __syncthreads();
  if (tid < static_cast<unsigned>(W)) {
    uint32_t base = 0;
    for (int s = 0; s < me; ++s) base += s_counts[s * W + tid];
    s_run[tid] = base + s_before[tid];
  }
  if (blockIdx.x == 0 && tid == 0) {
    int32_t recv = 0;
    for (int s = 0; s < W; ++s) recv += static_cast<int32_t>(s_counts[s * W + me]);
    *At<int32_t>(c, c.layout.total_recv) = recv;
  }
  __syncthreads();

  // 3. Rows: tiles of `nthreads` tokens of this block's chunk; thread i scans token
  // lo + tile + i, then the warps put the tile's rows.
  uint8_t* token_ranks = At<uint8_t>(c, c.layout.token_ranks);
  char* recv_tokens = At<char>(c, c.layout.recv_tokens);
  float* recv_weights = At<float>(c, c.layout.recv_weights);
  char* recv_scales = At<char>(c, c.layout.recv_scales);
  int32_t* recv_indices = At<int32_t>(c, c.layout.recv_indices);
  int32_t* recv_src_pos = At<int32_t>(c, c.layout.recv_src_pos);
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes;
  for (int64_t tile = lo; tile < hi; tile += nthreads) {
    const int64_t t = tile + tid;
    const uint32_t mask = t < hi ? RankMask(p, t, epoch) : 0u;
    uint32_t prefix[kW];
#pragma unroll
    for (int d = 0; d < kW; ++d) {
      const unsigned bal = __ballot_sync(kFull, (mask >> d) & 1u);
      prefix[d] = __popc(bal & LaneMaskLt());
      if (lane == 0) s_warp[warp][d] = __popc(bal);
    }
    if (t < hi) {
      for (int d = 0; d < W; ++d) token_ranks[t * W + d] = (mask >> d) & 1u;
    }
    __syncthreads();
#pragma unroll
    for (int d = 0; d < kW; ++d) {
      if (d >= W) break;
      uint32_t off = s_run[d] + prefix[d];
      for (unsigned w = 0; w < warp; ++w) off += s_warp[w][d];
      s_rows[tid][d] = ((mask >> d) & 1u) ? static_cast<int32_t>(off) : -1;
    }
    __syncthreads();
    const int64_t in_tile = std::min<int64_t>(nthreads, hi - tile);
    for (int64_t i = warp; i < in_tile; i += nwarps) {
      const int64_t tok = tile + i;
      const int32_t src_pos = EncodeSrcPos(me, tok, c.max_tokens);
      for (int d = 0; d < W; ++d) {
        const int32_t r = s_rows[i][d];
        if (r < 0) continue;
        dev::PutWarp_nbi(c.ctx, recv_tokens + r * H, p.tokens + tok * p.row_bytes, p.row_bytes, d);
        dev::PutWarp_nbi(c.ctx, recv_weights + static_cast<int64_t>(r) * K, p.weights + tok * K,
                         K * sizeof(float), d);
        if (Sb > 0) dev::PutWarp_nbi(c.ctx, recv_scales + r * Sb, p.scales + tok * Sb, Sb, d);
        dev::PutWarp_nbi(c.ctx, recv_indices + static_cast<int64_t>(r) * K, p.indices + tok * K,
                         K * sizeof(int32_t), d);
        if (lane == 0) *dev::Ptr(c.ctx, recv_src_pos + r, d) = src_pos;
      }
    }
    // Advance the running rows past this tile once every thread has read them.
    if (tid < static_cast<unsigned>(W)) {
      uint32_t sum = 0;
      for (unsigned w = 0; w < nwarps; ++w) sum += s_warp[w][tid];
      s_run[tid] += sum;
    }
    __syncthreads();
  }

  // 4. Done: the last block signals every pe, waits for every pe, advances the epoch.
  if (!FinishBlock(&state->dispatch_blocks_done)) return;
  uint64_t* done = At<uint64_t>(c, c.layout.dispatch_done);
  if (warp == 0) {
    for (unsigned pe = lane; pe < static_cast<unsigned>(W); pe += 32) {
      dev::SignalSet(c.ctx, &done[me], epoch, static_cast<int>(pe));
    }
    for (unsigned s = lane; s < static_cast<unsigned>(W); s += 32) {
      dev::WaitUntil(&done[s], Cmp::kGe, epoch, c.timeout_ns);
    }
    __syncwarp();
    if (lane == 0) state->epoch = epoch;
  }
}

__global__ void RejectDispatchKernel(Common c) {
  EpDeviceState* state = State(c);
  const uint64_t epoch = state->epoch + 1;
  PostRejectedCounts(c, epoch, threadIdx.x, blockDim.x);
  __syncwarp();
  if (threadIdx.x == 0) state->epoch = epoch;
}

__global__ void RejectCombineKernel(Common c) {
  const uint64_t epoch = State(c)->epoch;
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
  for (unsigned pe = threadIdx.x; pe < static_cast<unsigned>(c.world); pe += blockDim.x) {
    dev::SignalSet(c.ctx, &done[c.me], (epoch << 1) | 1u, static_cast<int>(pe));
  }
}

// Sums `ranks`' slots of token t for columns [col, col + kVec) into acc.
template <int kVec>
__device__ __forceinline__ void ReduceChunk(const CombineParams& p, const char* slots,
                                            const uint8_t* ranks, int64_t t, int64_t byte_off,
                                            float (&acc)[kVec]) {
#pragma unroll
  for (int v = 0; v < kVec; ++v) acc[v] = 0.0f;
  for (int d = 0; d < p.c.world; ++d) {
    if (!ranks[d]) continue;
    const char* row = slots + (static_cast<int64_t>(d) * p.c.max_tokens + t) * p.combine_row_bytes;
    const uint4 raw = *reinterpret_cast<const uint4*>(row + byte_off);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (kVec == 8) {
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
}

__global__ void __launch_bounds__(kMaxThreads) CombineKernel(CombineParams p) {
  const Common& c = p.c;
  const int W = c.world, me = c.me, K = c.top_k;
  const int64_t M = c.max_tokens;
  const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned nwarps = blockDim.x >> 5;
  const int64_t gwarp = static_cast<int64_t>(blockIdx.x) * nwarps + warp;
  const int64_t all_warps = static_cast<int64_t>(gridDim.x) * nwarps;
  EpDeviceState* state = State(c);
  const uint64_t epoch = state->epoch;
  const int64_t total = *At<int32_t>(c, c.layout.total_recv);
  uint64_t* done = At<uint64_t>(c, c.layout.combine_done);
  if (total > p.input_rows) {
    // Reject the combine on every pe (they trap naming this one), then trap; the
    // other blocks leave without touching the short input.
    if (blockIdx.x == 0 && tid == 0) {
      printf(
          "mori.ep combine on rank %d: combine input has %lld rows, fewer than total_recv "
          "%lld\n",
          me, static_cast<long long>(p.input_rows), static_cast<long long>(total));
      for (int pe = 0; pe < W; ++pe) dev::SignalSet(c.ctx, &done[me], (epoch << 1) | 1u, pe);
      __trap();
    }
    return;
  }

  // 1. Rows back to their sources: row i into slot [me][t] of pe s.
  char* comb_tokens = At<char>(c, c.layout.comb_tokens);
  float* comb_weights = At<float>(c, c.layout.comb_weights);
  const int32_t* src_pos = At<int32_t>(c, c.layout.recv_src_pos);
  const bool with_weights = p.out_weights != nullptr;
  for (int64_t i = gwarp; i < total; i += all_warps) {
    const int s = static_cast<int>(src_pos[i] / M);
    const int64_t slot = static_cast<int64_t>(me) * M + src_pos[i] % M;
    dev::PutWarp_nbi(c.ctx, comb_tokens + slot * p.combine_row_bytes,
                     p.input + i * p.input_row_stride, p.row_bytes, s);
    if (with_weights) {
      dev::PutWarp_nbi(c.ctx, comb_weights + slot * K, p.weights + i * K, K * sizeof(float), s);
    }
  }

  // 2. The last block signals every pe; every block waits for every pe.
  if (FinishBlock(&state->combine_blocks_done) && warp == 0) {
    for (unsigned pe = lane; pe < static_cast<unsigned>(W); pe += 32) {
      dev::SignalSet(c.ctx, &done[me], epoch << 1, static_cast<int>(pe));
    }
  }
  if (warp == 0) {
    for (unsigned d = lane; d < static_cast<unsigned>(W); d += 32) {
      const uint64_t v = dev::WaitUntil(&done[d], Cmp::kGe, epoch << 1, c.timeout_ns);
      if (v & 1u) {
        printf(
            "mori.ep combine on rank %d: combine rejected by rank %u (its inputs failed "
            "validation; see its error)\n",
            me, d);
        __trap();
      }
    }
  }
  __syncthreads();

  // 3. Reduce my tokens over the pes they went to, ascending pe order.
  const uint8_t* token_ranks = At<uint8_t>(c, c.layout.token_ranks);
  const int64_t hidden = p.hidden;
  const int elem = p.bfloat16 ? 2 : 4;
  const bool vec = (p.row_bytes % 16) == 0 && (p.combine_row_bytes % 16) == 0 &&
                   (reinterpret_cast<uintptr_t>(p.out) % 16) == 0;
  for (int64_t t = gwarp; t < p.num_tokens; t += all_warps) {
    const uint8_t* ranks = token_ranks + t * W;
    char* out_row = static_cast<char*>(p.out) + t * hidden * elem;
    if (vec && p.bfloat16) {
      for (int64_t off = static_cast<int64_t>(lane) * 16; off < p.row_bytes; off += 32 * 16) {
        float acc[8];
        ReduceChunk<8>(p, comb_tokens, ranks, t, off, acc);
        uint32_t w[4];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          w[v] = FloatToBFloat16(acc[2 * v]) |
                 (static_cast<uint32_t>(FloatToBFloat16(acc[2 * v + 1])) << 16);
        }
        *reinterpret_cast<uint4*>(out_row + off) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else if (vec) {
      for (int64_t off = static_cast<int64_t>(lane) * 16; off < p.row_bytes; off += 32 * 16) {
        float acc[4];
        ReduceChunk<4>(p, comb_tokens, ranks, t, off, acc);
        *reinterpret_cast<float4*>(out_row + off) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      }
    } else {
      for (int64_t h = lane; h < hidden; h += 32) {
        float acc = 0.0f;
        for (int d = 0; d < W; ++d) {
          if (!ranks[d]) continue;
          const char* row = comb_tokens + (static_cast<int64_t>(d) * M + t) * p.combine_row_bytes;
          acc += p.bfloat16 ? BFloat16ToFloat(reinterpret_cast<const uint16_t*>(row)[h])
                            : reinterpret_cast<const float*>(row)[h];
        }
        if (p.bfloat16) {
          reinterpret_cast<uint16_t*>(out_row)[h] = FloatToBFloat16(acc);
        } else {
          reinterpret_cast<float*>(out_row)[h] = acc;
        }
      }
    }
    if (with_weights) {
      for (int j = static_cast<int>(lane); j < K; j += 32) {
        float acc = 0.0f;
        for (int d = 0; d < W; ++d) {
          if (ranks[d]) acc += comb_weights[(static_cast<int64_t>(d) * M + t) * K + j];
        }
        p.out_weights[t * K + j] = acc;
      }
    }
  }
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
  mori::cuda::ScopedDevice guard(device_);
  MORI_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  MORI_CUDA_CHECK(cudaMemset(block_, 0, SignalBytes(layout_)));
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  shmem::BarrierAll();
}

int IntraNodeCuda::MaxResidentBlocks(bool dispatch, int warps) {
  MORI_CHECK_ARG(warps >= 1 && warps <= kMaxWarpsPerBlock, "warp_per_block ", warps,
                 " must be in [1, ", kMaxWarpsPerBlock, "]");
  int& cached = max_blocks_[dispatch ? 1 : 0][warps];
  if (cached == 0) {
    int per_sm = 0;
    if (dispatch) {
      MORI_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, DispatchKernel, warps * 32, 0));
    } else {
      MORI_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, CombineKernel, warps * 32, 0));
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
  DispatchKernel<<<launch.block_num, launch.warp_per_block * 32, 0,
                   reinterpret_cast<cudaStream_t>(stream)>>>(p);
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
  CombineKernel<<<launch.block_num, launch.warp_per_block * 32, 0,
                  reinterpret_cast<cudaStream_t>(stream)>>>(p);
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
