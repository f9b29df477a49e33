// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CUDA kernels of InterNode (flat; internode/protocol.hpp): the steps of
// InterNodeCpu (internode/cpu.cpp, cpu_combine.cpp) in the same order, so the rows land
// at the same places and combine sums in the same order, bit for bit. One block per
// call (kernels/common.cuh: how pes of this node and of other nodes are reached).
#include <algorithm>

#include "internode/kernels/common.cuh"

namespace mori::ep::internode {

namespace {

// ------------------------------------------------------------------ dispatch

__global__ void FlatDispatchKernel(Params p) {
  BeginCall(p, /*dispatch=*/true);
  __shared__ DispatchShared sh;
  if (!RouteAndExchange(p, sh)) return;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, me = p.rank, K = p.top_k;
  const int64_t M = p.max_tokens, n = p.num_tokens;
  const int64_t H = p.hidden_bytes, Sb = p.scale_bytes, trb = p.token_row_bytes;
  const uint8_t* token_ranks = reinterpret_cast<const uint8_t*>(p.block + p.l.token_ranks);
  const int32_t* dest_row = reinterpret_cast<const int32_t*>(p.block + p.l.dest_row);

  // The rows: a warp per token; every destination of this node directly at its final
  // row, the token staged once for the writes to the other nodes' destinations.
  for (int64_t t = warp; t < n; t += nwarps) {
    const uint8_t* ranks = token_ranks + t * W;
    const int32_t pos = EncodeSrcPos(me, t, M);
    bool remote = false;
    for (int d = 0; d < W; ++d) {
      if (!ranks[d]) continue;
      if (lane == 0) atomicAdd(&sh.cnt[kAlgoToken], static_cast<unsigned long long>(trb));
      if (!SameNode(p, d)) {
        remote = true;
        continue;
      }
      const int64_t r = sh.base[d] + dest_row[t * W + d];
      char* b = p.block;
      CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_tokens + r * H, d), p.tokens + t * trb, trb, lane, 32);
      CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_weights + r * K * 4, d), p.weights + t * K, K * 4,
                lane, 32);
      if (Sb > 0) {
        CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_scales + r * Sb, d), p.scales + t * Sb, Sb, lane,
                  32);
      }
      CopyBytes(dev::Ptr(p.ctx, b + p.l.recv_indices + r * K * 4, d), p.indices + t * K, K * 4,
                lane, 32);
      if (lane == 0)
        *dev::Ptr(p.ctx, reinterpret_cast<int32_t*>(b + p.l.recv_src_pos) + r, d) = pos;
    }
    if (!remote) continue;
    char* b = p.block;
    CopyBytes(b + p.l.dstage_tokens + t * H, p.tokens + t * trb, trb, lane, 32);
    CopyBytes(b + p.l.dstage_weights + t * K * 4, p.weights + t * K, K * 4, lane, 32);
    if (Sb > 0) CopyBytes(b + p.l.dstage_scales + t * Sb, p.scales + t * Sb, Sb, lane, 32);
    CopyBytes(b + p.l.dstage_indices + t * K * 4, p.indices + t * K, K * 4, lane, 32);
    if (lane == 0) reinterpret_cast<int32_t*>(b + p.l.dstage_src_pos)[t] = pos;
    __threadfence_system();
    __syncwarp();
    for (int d = 0; d < W && lane == 0; ++d) {
      if (!ranks[d] || SameNode(p, d)) continue;
      const int64_t r = sh.base[d] + dest_row[t * W + d];
      PushRemote(p, d, p.l.recv_tokens + r * H, p.l.dstage_tokens + t * H, trb, kLinkToken, sh.cnt);
      PushRemote(p, d, p.l.recv_weights + r * K * 4, p.l.dstage_weights + t * K * 4, K * 4,
                 kLinkMeta, sh.cnt);
      PushRemote(p, d, p.l.recv_scales + r * Sb, p.l.dstage_scales + t * Sb, Sb, kLinkMeta, sh.cnt);
      PushRemote(p, d, p.l.recv_indices + r * K * 4, p.l.dstage_indices + t * K * 4, K * 4,
                 kLinkMeta, sh.cnt);
      PushRemote(p, d, p.l.recv_src_pos + r * 4, p.l.dstage_src_pos + t * 4, 4, kLinkMeta, sh.cnt);
      atomicAdd(&sh.cnt[kPhysicalToken], static_cast<unsigned long long>(trb));
      atomicAdd(&sh.cnt[kPhysicalRows], 1ull);
    }
    __syncwarp();
  }

  // Done words: a pe leaves once every pe has written every row of the call.
  FinishDispatch(p, sh);
}

// ------------------------------------------------------------------- combine

__global__ void FlatCombineKernel(Params p) {
  BeginCall(p, /*dispatch=*/false);
  __shared__ CombineShared sh;
  if (!CombineEntry(p, sh)) return;
  unsigned long long* cnt = sh.cnt;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int W = p.world_size, me = p.rank, K = p.top_k;
  const int64_t M = p.max_tokens, Hc = p.combine_row_bytes, row_bytes = p.row_bytes;
  const int64_t total = *p.total_recv;

  // Every received row back to its source's slot [me][t]: this node directly, other
  // nodes staged and written by the proxy.
  const bool with_weights = p.out_weights != nullptr;
  for (int64_t i = warp; i < total; i += nwarps) {
    const int s = static_cast<int>(p.src_pos[i] / M);
    const int64_t t = p.src_pos[i] % M;
    const char* row = p.input + i * p.input_row_stride;
    const size_t slot = static_cast<size_t>(me) * M + t;
    char* b = p.block;
    if (lane == 0) atomicAdd(&cnt[kAlgoToken], static_cast<unsigned long long>(row_bytes));
    if (SameNode(p, s)) {
      CopyBytes(dev::Ptr(p.ctx, b + p.l.comb_tokens + slot * Hc, s), row, row_bytes, lane, 32);
      if (with_weights) {
        CopyBytes(dev::Ptr(p.ctx, b + p.l.comb_weights + slot * K * 4, s),
                  p.combine_weights + i * K, K * 4, lane, 32);
      }
      continue;
    }
    CopyBytes(b + p.l.cstage_tokens + i * Hc, row, row_bytes, lane, 32);
    if (with_weights) {
      CopyBytes(b + p.l.cstage_weights + i * K * 4, p.combine_weights + i * K, K * 4, lane, 32);
    }
    __threadfence_system();
    __syncwarp();
    if (lane == 0) {
      PushRemote(p, s, p.l.comb_tokens + slot * Hc, p.l.cstage_tokens + i * Hc, row_bytes,
                 kLinkToken, cnt);
      if (with_weights) {
        PushRemote(p, s, p.l.comb_weights + slot * K * 4, p.l.cstage_weights + i * K * 4, K * 4,
                   kLinkMeta, cnt);
      }
      atomicAdd(&cnt[kPhysicalToken], static_cast<unsigned long long>(row_bytes));
      atomicAdd(&cnt[kPhysicalRows], 1ull);
    }
    __syncwarp();
  }
  __threadfence_system();
  __syncthreads();
  if (tid < W) PostSignal(p, tid, p.l.comb_done + static_cast<size_t>(me) * 8, p.call, cnt);
  if (tid < W) {
    WaitWord(p, p.l.comb_done + static_cast<size_t>(tid) * 8, p.call, tid, "combine",
             "combine rows", 0);
  }
  __syncthreads();

  // My tokens: the rows of D(t) in ascending pe order, fp32, one rounding
  // (CombineTokenRow, CombineTokenWeights).
  const CombineDtype dtype = static_cast<CombineDtype>(p.dtype);
  const int elem = static_cast<int>(CombineElementBytes(dtype));
  for (int64_t t = warp; t < p.num_tokens; t += nwarps) {
    const uint8_t* ranks = p.token_ranks + t * W;
    uint32_t mask = 0;
    for (int d = 0; d < W; ++d) mask |= static_cast<uint32_t>(ranks[d] != 0) << d;
    const int parts = __popc(mask);
    char* out = p.out + t * row_bytes;
    auto row_of = [&](int d) -> const char* {
      return p.block + p.l.comb_tokens + (static_cast<size_t>(d) * M + t) * Hc;
    };
    if (parts == 0) {
      for (int64_t h = lane; h < row_bytes; h += 32) out[h] = 0;
    } else if (CopiesSinglePart(parts, p.fp8_cast)) {
      const char* row = row_of(__ffs(mask) - 1);
      for (int64_t h = lane; h < p.hidden_dim; h += 32) CopyElement(out, row, h, elem);
    } else {
      for (int64_t h = lane; h < p.hidden_dim; h += 32) {
        float acc = kSumStart;
        for (uint32_t m = mask; m != 0; m &= m - 1) {
          acc += CombineElementValue(row_of(__ffs(m) - 1), h, dtype, p.fp8_cast);
        }
        StoreElement(out, h, dtype, acc);
      }
    }
    if (!with_weights) continue;
    auto weights_of = [&](int d) -> const float* {
      return reinterpret_cast<const float*>(p.block + p.l.comb_weights) +
             (static_cast<size_t>(d) * M + t) * K;
    };
    for (int j = lane; j < K; j += 32) {
      float acc = parts == 0 ? 0.0f : parts == 1 ? weights_of(__ffs(mask) - 1)[j] : kSumStart;
      for (uint32_t m = parts > 1 ? mask : 0u; m != 0; m &= m - 1)
        acc += weights_of(__ffs(m) - 1)[j];
      p.out_weights[t * K + j] = acc;
    }
  }
  __syncthreads();
  if (tid == 0) {
    pdev::Quiet(p.queue);  // the staging may be rewritten by the next call
    StoreCounters(p, 1, cnt);
  }
}

}  // namespace

void LaunchFlatDispatch(const Params& p, int threads, uintptr_t stream) {
  static const int most = MostThreads(FlatDispatchKernel);
  FlatDispatchKernel<<<1, std::min(threads, most), 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LaunchFlatCombine(const Params& p, int threads, uintptr_t stream) {
  static const int most = MostThreads(FlatCombineKernel);
  FlatCombineKernel<<<1, std::min(threads, most), 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  MORI_CUDA_CHECK(cudaGetLastError());
}

void LoadFlatKernels() {
  cudaFuncAttributes attr;
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, FlatDispatchKernel));
  MORI_CUDA_CHECK(cudaFuncGetAttributes(&attr, FlatCombineKernel));
}

}  // namespace mori::ep::internode
