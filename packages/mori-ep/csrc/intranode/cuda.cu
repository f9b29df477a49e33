// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// IntraNodeCuda: the host side of the CUDA intra-node kernels (kernels/): checks,
// launch shapes, the path and kernel build chosen per call (launched through
// common/launch_api.hpp). Nothing here synchronises with the device on the hot path.
#include "intranode/cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "common/call_checks.hpp"
#include "common/launch_api.hpp"
#include "common/numeric.hpp"
#include "intranode/kernels/params.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

using intranode::CombineParams;
using intranode::Common;
using intranode::DispatchParams;
using intranode::DispatchScratch;
using intranode::kMaxBlocksPerSm;
using intranode::kMaxThreads;
using intranode::kMaxWarpsPerBlock;
using intranode::kMetaWords;
using intranode::kNarrowThreads;
using intranode::kOnePassPath;
using intranode::kSegWords;
using intranode::kStreamPath;
using intranode::kTiledPath;
using intranode::kWireBlockwise;
using intranode::kWireFp8;
using intranode::kWireNative;
using intranode::ScratchOffsets;
using intranode::SplitRow;

namespace {

// Whether a combine on `stream` must first run the barrier over the ranks
// (CombineOrder: `after_combine`). A combine captured into a CUDA graph always
// does: the graph may be replayed right after a combine whatever preceded the
// capture on the host.
bool CombineNeedsBarrier(bool after_combine, uintptr_t stream) {
  if (after_combine) return true;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MORI_CUDA_CHECK(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capture));
  return capture != cudaStreamCaptureStatusNone;
}

}  // namespace

IntraNodeCuda::IntraNodeCuda(const EpShape& shape, void* block, int device,
                             std::chrono::milliseconds timeout)
    : shape_(shape),
      layout_(MakeLayout(shape)),
      block_(static_cast<char*>(block)),
      device_(device),
      timeout_ns_(KernelTimeoutNs(timeout, "timeout")),
      tuning_(IntraNodeTuning::FromEnv()),
      timeline_(device,
                {{"dispatch", {"start", "routed", "counts", "scanned", "rows", "quiet", "done"}},
                 {"combine", {"start", "returned", "first_reduce", "end"}}},
                tuning_.timeline),
      capped_(RecvCapacity(shape) < shape.world_size * shape.max_tokens),
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
  if (scratch_ != nullptr) cudaFree(scratch_);
}

int IntraNodeCuda::MaxResidentBlocks(bool dispatch, int warps, int wire) {
  MORI_CHECK_ARG(warps >= 1 && warps <= kMaxWarpsPerBlock, "warp_per_block ", warps,
                 " must be in [1, ", kMaxWarpsPerBlock, "]");
  MORI_CHECK_ARG(wire >= 0 && wire < intranode::kCombineWires, "combine wire ", wire,
                 " must be in [0, ", intranode::kCombineWires, ")");
  int& cached = max_blocks_[dispatch ? 0 : 1 + wire][warps];
  if (cached == 0) {
    int per_sm = 0;
    if (dispatch) {  // either kernel may run on the grid: the smaller bound holds
      const int seg = tuning_.dispatch_seg;
      per_sm = std::min(intranode::DispatchBlocksPerSm(warps, seg, false, capped_),
                        intranode::DispatchBlocksPerSm(warps, seg, true, capped_));
    } else {  // any combine path may run on the grid: the smallest bound holds
      per_sm = intranode::CombineBlocksPerSm(warps, kTiledPath, wire);
      for (int path : {kOnePassPath, kStreamPath}) {
        per_sm = std::min(per_sm, intranode::CombineBlocksPerSm(warps, path, wire));
      }
    }
    MORI_CHECK(per_sm > 0, "the ", dispatch ? "dispatch" : "combine", " kernel cannot run with ",
               warps, " warps per block on device ", device_);
    cached = per_sm * sm_count_;
  }
  return cached;
}

LaunchShape IntraNodeCuda::Resolve(LaunchShape launch, bool dispatch, int wire) {
  MORI_CHECK_ARG(launch.block_num >= 1, "block_num ", launch.block_num, " must be >= 1");
  // Blocks wait for signals of other blocks of the grid: all must be resident.
  launch.block_num =
      std::min(launch.block_num, MaxResidentBlocks(dispatch, launch.warp_per_block, wire));
  return launch;
}

void IntraNodeCuda::Dispatch(const DispatchArgs& a, LaunchShape launch, uintptr_t stream) {
  const int64_t M = shape_.max_tokens;
  CheckDispatchArgs(shape_, a, [&](const std::string& why) { RejectDispatch(why, stream); });
  mori::cuda::ScopedDevice guard(device_);
  launch = Resolve(launch, true, 0);
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
  p.rank_masks = a.rank_masks;
  p.row_tag = a.row_tag;
  p.recv_capacity = RecvCapacity(shape_);
  auto aligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a == 0;
  };
  p.vec = p.row_bytes % 16 == 0 && p.hidden_bytes % 16 == 0 && aligned(p.tokens, 16);
  p.indices_vec = shape_.top_k % 4 == 0 && aligned(p.indices, 16);
  p.meta_staged = p.scale_bytes % 4 == 0 && aligned(p.scales, 4) &&
                  2 * shape_.top_k + p.scale_bytes / 4 + 1 <= 32 * kMetaWords;
  p.stamps = timeline_.Begin(0, launch.block_num, stream);
  MORI_CHECK(launch.block_num <= scratch_blocks_, "dispatch grid of ", launch.block_num,
             " blocks exceeds the scratch for ", scratch_blocks_);
  const ScratchOffsets o(scratch_blocks_, shape_.max_tokens);
  DispatchScratch scratch{reinterpret_cast<uint64_t*>(scratch_ + o.block_counts),
                          reinterpret_cast<uint64_t*>(scratch_ + o.chunk_ready),
                          reinterpret_cast<int32_t*>(scratch_ + o.token_rows),
                          reinterpret_cast<uint32_t*>(scratch_ + o.work)};
  const bool dynamic = tuning_.dispatch_dynamic < 0
                           ? a.num_tokens >= tuning_.dispatch_dynamic_tokens
                           : tuning_.dispatch_dynamic != 0;
  intranode::LaunchDispatch(p, scratch, tuning_.dispatch_seg, dynamic, capped_, launch, stream);
  ++epoch_;
  num_tokens_ = a.num_tokens;
  order_.Dispatched(true);
}

void IntraNodeCuda::RejectDispatch(const std::string& reason, uintptr_t stream) {
  {
    mori::cuda::ScopedDevice guard(device_);
    Common c{ctx_,        block_,       layout_,           shape_.world_size,
             shape_.rank, shape_.top_k, shape_.max_tokens, timeout_ns_};
    intranode::LaunchRejectDispatch(c, stream);
  }
  ++epoch_;
  order_.Dispatched(false);
  throw InvalidArgumentError(reason);
}

RoutingSnapshot IntraNodeCuda::LastRouting() const {
  auto at = [this](size_t off) { return block_ + off; };
  return RoutingSnapshot{
      reinterpret_cast<const int32_t*>(at(layout_.recv_src_pos)),
      reinterpret_cast<const int32_t*>(at(layout_.recv_group_row)),
      reinterpret_cast<const uint8_t*>(at(layout_.token_ranks)),
      reinterpret_cast<const int32_t*>(at(layout_.token_self_row)),
      reinterpret_cast<const int32_t*>(at(layout_.total_recv)),
      reinterpret_cast<const uint64_t*>(at(layout_.state + offsetof(EpDeviceState, epoch))),
      epoch_,
      num_tokens_};
}

void IntraNodeCuda::Combine(const CombineArgs& a, LaunchShape launch, uintptr_t stream) {
  const RoutingSnapshot last = LastRouting();
  const RoutingSnapshot* r = order_.Pick(a.routing, last);
  if (r == nullptr) order_.ThrowNotCombinable(a.routing, epoch_);
  const int64_t row_bytes = shape_.hidden_dim * CombineElementBytes(a.dtype);
  if (row_bytes > shape_.combine_row_bytes) {
    RejectCombine(StrCat("combine rows of ", row_bytes, " bytes exceed the combine buffer's ",
                         shape_.combine_row_bytes, " (hidden_dim * max(max_token_type_size, 2))"),
                  stream, a.routing);
  }
  if (a.fp8_cast && a.dtype != CombineDtype::kBFloat16) {
    RejectCombine("fp8_direct_cast combines bf16 input only", stream, a.routing);
  }
  if (a.dtype == CombineDtype::kFloat4E2M1x2) {
    RejectCombine(
        "a float4_e2m1fn_x2 combine is implemented on host heaps only (CUDA combines "
        "bf16, fp32 and fp8 e4m3)",
        stream, a.routing);
  }
  // fp8_blockwise: bf16 rows cross as fp8 blocks with fp32 scales (IntraNodeCpu's
  // checks, in its order).
  const int S = a.fp8_block_scale_dim;
  if (S > 0 && a.dtype != CombineDtype::kBFloat16) {
    RejectCombine("fp8_blockwise combines bf16 input only", stream, a.routing);
  }
  if (S > 0 && BlockwiseRowBytes(shape_.hidden_dim, S) > shape_.combine_row_bytes) {
    RejectCombine(StrCat("fp8_blockwise rows of ", BlockwiseRowBytes(shape_.hidden_dim, S),
                         " bytes (", shape_.hidden_dim, " fp8 values and ", S,
                         " fp32 scales) exceed the combine buffer's ", shape_.combine_row_bytes),
                  stream, a.routing);
  }
  // fp8 input, and bf16 under fp8_direct_cast, cross as fp8 e4m3 bytes (half of bf16's).
  const int wire = S > 0                                                ? kWireBlockwise
                   : a.dtype == CombineDtype::kFloat8E4M3 || a.fp8_cast ? kWireFp8
                                                                        : kWireNative;
  mori::cuda::ScopedDevice guard(device_);
  launch = Resolve(launch, false, wire);
  CombineParams p{};
  p.c = Common{ctx_,        block_,       layout_,           shape_.world_size,
               shape_.rank, shape_.top_k, shape_.max_tokens, timeout_ns_};
  p.c.combine_bits = static_cast<uint32_t>(
      CombineWord(0, S > 0 ? kCombineTagFp8Blockwise : CombineDtypeTag(a.dtype), false,
                  a.out_weights != nullptr));
  p.hidden = shape_.hidden_dim;
  p.combine_row_bytes = shape_.combine_row_bytes;
  p.row_bytes = row_bytes;
  p.input = static_cast<const char*>(a.input);
  p.input_row_stride = a.input_row_stride;
  p.input_rows = a.input_rows;
  p.dtype = a.dtype;
  p.fp8_cast = a.fp8_cast;
  p.weights = a.weights;
  p.out = a.out;
  p.out_weights = a.out_weights;
  p.num_tokens = r->num_tokens;
  p.src_pos = r->src_pos;
  p.group_row = r->group_row;
  p.token_ranks = r->token_ranks;
  p.token_self_row = r->token_self_row;
  p.total_recv = r->total_recv;
  p.epoch = r->epoch;
  auto aligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a == 0;
  };
  p.vec = row_bytes % 16 == 0 && p.combine_row_bytes % 16 == 0 && p.input_row_stride % 16 == 0 &&
          aligned(p.input, 16) && aligned(p.out, 16);
  p.scale_dim = S;
  if (S > 0) {
    p.block_elems = BlockwiseBlockElems(shape_.hidden_dim, S);
    p.scales_offset = BlockwiseScalesOffset(shape_.hidden_dim);
    // The word-parallel rows need a block of whole 16-byte words, a power of two of
    // them up to a warp (combine_blockwise.cuh); other blocks go column by column.
    const int64_t words = p.block_elems / 8;
    p.block_lanes = static_cast<int>(words);
    p.vec = p.vec && p.block_elems % 8 == 0 && words <= 32 && (words & (words - 1)) == 0;
  }
  p.steps = tuning_.combine_steps;
  p.split = tuning_.combine_split;
  // Few rows per block: the one-pass path. total_recv is only on the device, so the
  // host bounds it by num_tokens x world (balanced ranks); either path reads the other
  // path's words, so a wrong guess costs time, never correctness, and pes need not
  // agree.
  const bool onepass = tuning_.combine_onepass_rows > 0 &&
                       r->num_tokens * shape_.world_size <=
                           static_cast<int64_t>(tuning_.combine_onepass_rows) * launch.block_num;
  // The streaming path needs a return warp and a reducing one per block.
  const int warps = launch.warp_per_block;
  const bool stream_path = !onepass && tuning_.combine_stream && warps >= 2;
  const int path = onepass ? kOnePassPath : stream_path ? kStreamPath : kTiledPath;
  p.ret_seg_words = 1;
  p.nseg_ret = 1;
  if (p.vec) {
    SplitRow(row_bytes / 16,
             warps * 32 <= kNarrowThreads ? kSegWords<kNarrowThreads> : kSegWords<kMaxThreads>,
             tuning_.even_segments, &p.ret_seg_words, &p.nseg_ret);
  }
  p.return_warps = std::clamp(
      tuning_.combine_return_warps > 0 ? tuning_.combine_return_warps : warps / 2, 1, warps - 1);
  {
    // Groups per posted step: about kStepItems (row, segment) items per return warp,
    // counting a group as full (kCombineGroupTokens rows from every other pe).
    constexpr int64_t kStepItems = 6;
    const int64_t per_group = std::max<int64_t>(
        1, int64_t{kCombineGroupTokens} * std::max(1, shape_.world_size - 1) * p.nseg_ret);
    p.step_groups = tuning_.combine_step_groups > 0
                        ? tuning_.combine_step_groups
                        : static_cast<int>(std::max<int64_t>(
                              1, (kStepItems * p.return_warps + per_group - 1) / per_group));
  }
  if (CombineNeedsBarrier(order_.Enter(r->host_epoch), stream)) shmem::BarrierOnStream(stream);
  p.stamps = timeline_.Begin(1, launch.block_num, stream);
  intranode::LaunchCombine(p, path, wire, launch, stream);
}

void IntraNodeCuda::RejectCombine(const std::string& reason, uintptr_t stream,
                                  const RoutingSnapshot* routing) {
  const RoutingSnapshot last = LastRouting();
  if (const RoutingSnapshot* r = order_.Pick(routing, last)) {
    mori::cuda::ScopedDevice guard(device_);
    if (CombineNeedsBarrier(order_.Enter(r->host_epoch), stream)) {
      shmem::BarrierOnStream(stream);
    }
    Common c{ctx_,        block_,       layout_,           shape_.world_size,
             shape_.rank, shape_.top_k, shape_.max_tokens, timeout_ns_};
    intranode::LaunchRejectCombine(c, r->epoch, stream);
  }
  throw InvalidArgumentError(reason);
}

}  // namespace mori::ep
