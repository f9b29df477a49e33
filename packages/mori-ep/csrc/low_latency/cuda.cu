// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// LowLatencyCuda: the host side of the low-latency kernels (kernels/dispatch.cu,
// kernels/combine.cu, launched through common/launch_api.hpp): which phases a launch
// runs, launch shapes. Nothing here synchronises with the
// device on the hot path.
#include "low_latency/cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "common/launch_api.hpp"
#include "common/numeric.hpp"
#include "low_latency/options.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

LowLatencyCuda::LowLatencyCuda(const EpShape& shape, void* block, int device,
                               std::chrono::milliseconds timeout)
    : shape_(shape),
      layout_(MakeLlLayout(shape)),
      block_(static_cast<char*>(block)),
      device_(device),
      timeout_ns_(KernelTimeoutNs(timeout, "timeout")),
      ctx_(shmem::GetDeviceContext()) {
  const LowLatencyOptions options = LowLatencyOptions::FromEnv();
  timeline_ = std::make_unique<KernelTimeline>(
      device,
      std::vector<TimelinePart>{{"dispatch send", {"start", "routed", "rows", "posted"}},
                                {"dispatch recv", {"start", "flags", "rows", "consumed"}},
                                {"combine send", {"start", "consumed", "rows", "posted"}},
                                {"combine recv", {"start", "flags", "reduced", "consumed"}}},
      options.timeline);
  pre_reduce_ = LlPreReduce(shape, options.pre_reduce);
  LlCheckRecvCapacity(shape);
  MORI_CHECK_ARG(ctx_.n_pes == shape.world_size, "world_size ", shape.world_size,
                 " differs from the heap's n_pes ", ctx_.n_pes);
  MORI_CHECK_ARG(ctx_.my_pe == shape.rank, "rank ", shape.rank, " differs from the heap's my_pe ",
                 ctx_.my_pe);
  if (shape.world_size > kMaxCudaWorldSize) {
    MORI_THROW(NotSupportedError, "the CUDA low-latency kernels take world sizes up to ",
               kMaxCudaWorldSize, ", got ", shape.world_size);
  }
  if (shape.top_k > 32) {
    MORI_THROW(NotSupportedError, "the CUDA low-latency kernels take top-k up to 32, got ",
               shape.top_k);
  }
  if (shape.num_experts_per_rank > low_latency::kLlMaxScanExperts) {
    MORI_THROW(NotSupportedError, "the CUDA low-latency kernels take up to ",
               low_latency::kLlMaxScanExperts, " experts per rank, got ",
               shape.num_experts_per_rank);
  }
  if (shape.max_tokens > 8192) {
    MORI_THROW(NotSupportedError, "the CUDA low-latency kernels take up to 8192 tokens per rank ",
               "(max_num_inp_token_per_rank), got ", shape.max_tokens);
  }
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the op's buffer is not a symmetric block of ", layout_.total_bytes, " bytes");
  for (int pe = 0; pe < ctx_.n_pes; ++pe) {
    if (shmem::Ptr(block, pe) == nullptr) {
      MORI_THROW(NotSupportedError, "low-latency dispatch/combine needs every pe on this node, ",
                 "but pe ", pe, " is not load/store reachable from pe ", ctx_.my_pe);
    }
  }
  mori::cuda::ScopedDevice guard(device_);
  MORI_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  if (options.copy_engine) {
    copy_engine_ = true;
    const size_t flags = AlignUp(shape.world_size * sizeof(uint64_t), 256);
    stage_span_ = layout_.disp_src + layout_.half_src - layout_.disp_tokens;
    comb_stage_at_ = AlignUp(stage_span_ + flags, 256);
    comb_stage_span_ = layout_.comb_weights + layout_.half_comb_weights - layout_.comb_tokens;
    MORI_CUDA_CHECK(cudaMalloc(&stage_, comb_stage_at_ + comb_stage_span_ + flags));
    MORI_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    MORI_CUDA_CHECK(cudaEventCreateWithFlags(&sent_, cudaEventDisableTiming));
    MORI_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    MORI_CUDA_CHECK(cudaEventCreateWithFlags(&comb_copied_, cudaEventDisableTiming));
  }
  MORI_CUDA_CHECK(cudaMemset(block_, 0, LlSignalBytes(layout_)));
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  shmem::BarrierAll();
}

LowLatencyCuda::~LowLatencyCuda() {
  if (!copy_engine_) return;
  mori::cuda::ScopedDevice guard(device_);
  // Errors ignored: a destructor may run after the context failed (a trap).
  cudaStreamSynchronize(side_);
  cudaEventDestroy(sent_);
  cudaEventDestroy(copied_);
  cudaEventDestroy(comb_copied_);
  cudaStreamDestroy(side_);
  cudaFree(stage_);
}

low_latency::LlParams LowLatencyCuda::Base() const {
  low_latency::LlParams p{};
  p.ctx = ctx_;
  p.block = block_;
  p.layout = layout_;
  p.world = shape_.world_size;
  p.me = shape_.rank;
  p.top_k = shape_.top_k;
  p.experts_per_rank = shape_.num_experts_per_rank;
  p.max_tokens = shape_.max_tokens;
  p.hidden_dim = shape_.hidden_dim;
  p.hidden_bytes = shape_.hidden_bytes;
  p.combine_row_bytes = shape_.combine_row_bytes;
  p.scale_bytes = shape_.scale_bytes;
  p.recv_slots = LlRecvSlots(shape_);
  p.timeout_ns = timeout_ns_;
  p.copy_engine = copy_engine_;
  p.stage = stage_;
  p.stage_flags = copy_engine_ ? reinterpret_cast<uint64_t*>(stage_ + stage_span_) : nullptr;
  p.stage_comb = copy_engine_ ? stage_ + comb_stage_at_ : nullptr;
  p.stage_comb_flags = copy_engine_
                           ? reinterpret_cast<uint64_t*>(stage_ + comb_stage_at_ + comb_stage_span_)
                           : nullptr;
  return p;
}

void LowLatencyCuda::Launch(const low_latency::LlParams& p, LaunchShape launch, uintptr_t stream) {
  // Every block of a launch may wait for the flags its other blocks post: the grid
  // must be resident, one block per SM at most (and the peers' grids beside it), and
  // each block owns at least one flag lane (kLlFlagLanes).
  const int warps = std::clamp(launch.warp_per_block, 1, low_latency::kLlMaxWarps);
  const int blocks =
      std::clamp(launch.block_num, 1, std::max(1, std::min(sm_count_ / 2, kLlFlagLanes)));
  // A launch runs dispatch phases or combine phases, never both (one kernel each).
  const bool dispatch = (p.phases & (low_latency::kLlDispatchSend | low_latency::kLlDispatchRecv |
                                     low_latency::kLlRejectDispatch)) != 0;
  const bool combine =
      (p.phases & (low_latency::kLlCombineSend | low_latency::kLlCombineRecv)) != 0;
  MORI_CHECK(!(dispatch && combine), "a low-latency launch mixes dispatch and combine phases");
  mori::cuda::ScopedDevice guard(device_);
  low_latency::LlParams q = p;
  const int phase_bits[low_latency::kLlParts] = {
      low_latency::kLlDispatchSend, low_latency::kLlDispatchRecv, low_latency::kLlCombineSend,
      low_latency::kLlCombineRecv};
  for (int part = 0; part < low_latency::kLlParts; ++part) {
    q.stamps[part] =
        (p.phases & phase_bits[part]) ? timeline_->Begin(part, blocks, stream) : nullptr;
  }
  if (dispatch) {
    low_latency::LaunchDispatch(q, blocks, warps * 32, stream);
  } else {
    low_latency::LaunchCombine(q, blocks, warps * 32, stream);
  }
}

void LowLatencyCuda::DispatchSend(const LlDispatchArgs& a, bool fuse, LaunchShape launch,
                                  uintptr_t stream) {
  MORI_CHECK_ARG(a.num_tokens >= 0 && a.num_tokens <= shape_.max_tokens, "num_tokens ",
                 a.num_tokens, " exceeds max_num_inp_token_per_rank ", shape_.max_tokens);
  MORI_CHECK_ARG(a.token_row_bytes <= shape_.hidden_bytes, "token rows of ", a.token_row_bytes,
                 " bytes exceed ", shape_.hidden_bytes);
  dispatch_ = a;
  num_tokens_ = a.num_tokens;
  if (fuse && !copy_engine_) {
    dispatch_deferred_ = true;
    return;
  }
  low_latency::LlParams p = Base();
  p.phases = low_latency::kLlDispatchSend;
  p.d = a;
  Launch(p, launch, stream);
  if (copy_engine_) CopyDispatch(a, stream);
}

void LowLatencyCuda::CopyToPeers(const PeerCopy* copies, int n, size_t flag_off,
                                 const uint64_t* flags, uintptr_t stream, cudaEvent_t done) {
  const int W = shape_.world_size, me = shape_.rank;
  mori::cuda::ScopedDevice guard(device_);
  MORI_CUDA_CHECK(cudaEventRecord(sent_, reinterpret_cast<cudaStream_t>(stream)));
  MORI_CUDA_CHECK(cudaStreamWaitEvent(side_, sent_, 0));
  for (int d = 0; d < W; ++d) {
    if (d == me) continue;
    for (int i = 0; i < n; ++i) {
      const size_t bytes = static_cast<size_t>(copies[i].bytes);
      if (bytes == 0) continue;
      char* dst = static_cast<char*>(shmem::Ptr(block_ + copies[i].off, d)) + me * bytes;
      MORI_CUDA_CHECK(
          cudaMemcpyAsync(dst, copies[i].src + d * bytes, bytes, cudaMemcpyDeviceToDevice, side_));
    }
    // After the rows, in stream order: a pe that sees the flag sees them.
    auto* flag = static_cast<uint64_t*>(shmem::Ptr(block_ + flag_off, d)) + LlFlagIndex(0, W, me);
    MORI_CUDA_CHECK(
        cudaMemcpyAsync(flag, flags + d, sizeof(uint64_t), cudaMemcpyDeviceToDevice, side_));
  }
  MORI_CUDA_CHECK(cudaEventRecord(done, side_));
}

void LowLatencyCuda::CopyDispatch(const LlDispatchArgs& a, uintptr_t stream) {
  const int64_t P = LlRecvSlots(shape_), K = shape_.top_k;
  auto at = [&](size_t off) { return stage_ + (off - layout_.disp_tokens); };
  // The arrays this dispatch wrote (DispatchSend in kernels/dispatch.cu), P rows each.
  const int64_t cast = a.fp8_cast ? LlCastScales(shape_.hidden_dim) * 4 : 0;
  const int64_t scales = a.scales != nullptr ? shape_.scale_bytes : 0;
  const PeerCopy copies[] = {
      {layout_.disp_tokens, P * shape_.hidden_bytes, at(layout_.disp_tokens)},
      {layout_.disp_weights, P * K * 4, at(layout_.disp_weights)},
      {layout_.disp_indices, P * K * 4, at(layout_.disp_indices)},
      {layout_.disp_src, P * 4, at(layout_.disp_src)},
      {layout_.disp_scales, P * scales, at(layout_.disp_scales)},
      {layout_.disp_cast_scales, P * cast, at(layout_.disp_cast_scales)},
  };
  CopyToPeers(copies, 6, layout_.disp_flag, reinterpret_cast<uint64_t*>(stage_ + stage_span_),
              stream, copied_);
  copies_pending_ = true;
}

void LowLatencyCuda::CopyCombine(const LlCombineArgs& a, uintptr_t stream) {
  const int64_t M = shape_.max_tokens, K = shape_.top_k;
  char* base = stage_ + comb_stage_at_;
  auto at = [&](size_t off) { return base + (off - layout_.comb_tokens); };
  const PeerCopy copies[] = {
      {layout_.comb_tokens, M * shape_.combine_row_bytes, at(layout_.comb_tokens)},
      {layout_.comb_weights, a.weights != nullptr ? M * K * 4 : 0, at(layout_.comb_weights)},
  };
  CopyToPeers(copies, 2, layout_.comb_flag, reinterpret_cast<uint64_t*>(base + comb_stage_span_),
              stream, comb_copied_);
  comb_copies_pending_ = true;
}

void LowLatencyCuda::DispatchRecv(const LlRecvArgs& out, LaunchShape launch, uintptr_t stream) {
  if (copies_pending_) {
    mori::cuda::ScopedDevice guard(device_);
    MORI_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), copied_, 0));
    copies_pending_ = false;
  }
  low_latency::LlParams p = Base();
  p.phases = low_latency::kLlDispatchRecv;
  if (dispatch_deferred_) p.phases |= low_latency::kLlDispatchSend;
  dispatch_deferred_ = false;
  p.d = dispatch_;
  p.r = out;
  p.recv_layout = dispatch_.layout;
  p.recv_fp8 = dispatch_.fp8_cast;
  p.recv_row_bytes = dispatch_.token_row_bytes;
  Launch(p, launch, stream);
}

void LowLatencyCuda::RejectDispatch(const std::string& reason, uintptr_t stream) {
  dispatch_deferred_ = false;
  low_latency::LlParams p = Base();
  p.phases = low_latency::kLlRejectDispatch;
  Launch(p, LaunchShape{1, 1}, stream);
  throw InvalidArgumentError(reason);
}

void LowLatencyCuda::CombineSend(const LlCombineArgs& a, const int32_t* total_recv, bool fuse,
                                 LaunchShape launch, uintptr_t stream) {
  if (a.pre_reduce && !LlPartialsFit(shape_, layout_)) {
    RejectCombine(
        StrCat("a combine pre-reduced per rank needs ", shape_.max_tokens, " x ", shape_.world_size,
               " fp32 rows of ", LlPartialRowBytes(shape_), " bytes, more than the combine area's ",
               layout_.half_comb_tokens, " (top_k ", shape_.top_k, " < 2 * world_size)"),
        stream);
  }
  if (a.pre_reduce && dispatch_.layout != LlLayout::kExpertMajor) {
    RejectCombine("a combine pre-reduced per rank needs an expert-major dispatch before it",
                  stream);
  }
  if (a.dtype == CombineDtype::kFloat4E2M1x2) {
    RejectCombine(
        "a float4_e2m1fn_x2 combine is implemented on host heaps only (CUDA combines "
        "bf16, fp32 and fp8 e4m3)",
        stream);
  }
  // fp8_blockwise (token-major bf16 rows): LowLatencyCpu::CombineSend's checks.
  const int S = a.fp8_block_scale_dim;
  if (S > 0 && a.dtype != CombineDtype::kBFloat16) {
    RejectCombine("fp8_blockwise combines bf16 input only", stream);
  }
  if (S > 0 && BlockwiseRowBytes(shape_.hidden_dim, S) > shape_.combine_row_bytes) {
    RejectCombine(StrCat("fp8_blockwise rows of ", BlockwiseRowBytes(shape_.hidden_dim, S),
                         " bytes (", shape_.hidden_dim, " fp8 values and ", S,
                         " fp32 scales) exceed the combine buffer's ", shape_.combine_row_bytes),
                  stream);
  }
  combine_ = a;
  combine_total_ = total_recv;
  if (fuse && !copy_engine_) {
    combine_deferred_ = true;
    return;
  }
  low_latency::LlParams p = Base();
  p.phases = low_latency::kLlCombineSend;
  p.c = a;
  p.total_recv = total_recv;
  p.combine_tokens = num_tokens_;
  Launch(p, launch, stream);
  if (copy_engine_ && a.layout == LlLayout::kTokenMajor) CopyCombine(a, stream);
}

void LowLatencyCuda::CombineRecv(LaunchShape launch, uintptr_t stream) {
  if (comb_copies_pending_) {
    mori::cuda::ScopedDevice guard(device_);
    MORI_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), comb_copied_, 0));
    comb_copies_pending_ = false;
  }
  low_latency::LlParams p = Base();
  p.phases = low_latency::kLlCombineRecv;
  if (combine_deferred_) p.phases |= low_latency::kLlCombineSend;
  combine_deferred_ = false;
  p.c = combine_;
  p.total_recv = combine_total_;
  p.combine_tokens = num_tokens_;
  Launch(p, launch, stream);
}

void LowLatencyCuda::RejectCombine(const std::string& reason, uintptr_t stream) {
  combine_deferred_ = false;
  low_latency::LlParams p = Base();
  p.phases = low_latency::kLlRejectCombine;
  Launch(p, LaunchShape{1, 1}, stream);
  throw InvalidArgumentError(reason);
}

}  // namespace mori::ep
