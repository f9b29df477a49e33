// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// BalancedCuda (balanced/cuda.hpp): fills the kernels' parameters and launches them in
// BalancedCpu's order (balanced/cpu.cpp), on the caller's stream.
#include "balanced/cuda.hpp"

#include <cuda_runtime.h>

#include "common/launch_api.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep::balanced {

namespace {

DevicePlan Device(const RankPlan& p) {
  return DevicePlan{p.dst, p.experts_to_copy, p.zero_fill, p.dup_groups, p.dup_loffs, p.dup_counts};
}

cudaStream_t S(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

}  // namespace

BalancedCuda::BalancedCuda(const PlanShape& shape, int64_t hidden, int rank, void* block,
                           int device, std::chrono::milliseconds timeout)
    : shape_(shape),
      hidden_(hidden),
      rank_(rank),
      device_(device),
      layout_(MakeBlockLayout(shape, hidden)),
      block_(static_cast<char*>(block)),
      ctx_(shmem::GetDeviceContext()),
      timeout_ns_(KernelTimeoutNs(timeout, "timeout")) {
  MORI_CHECK_ARG(ctx_.n_pes == shape.ranks, "num_ep_ranks ", shape.ranks,
                 " differs from the heap's n_pes ", ctx_.n_pes);
  MORI_CHECK_ARG(ctx_.my_pe == rank, "rank ", rank, " differs from the heap's my_pe ", ctx_.my_pe);
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the Buffer's block is not a symmetric block of ", layout_.total_bytes, " bytes");
  for (int pe = 0; pe < ctx_.n_pes; ++pe) {
    if (shmem::Ptr(block, pe) == nullptr) {
      MORI_THROW(NotSupportedError, "the balanced mode needs every pe on this node (NVLink), ",
                 "but pe ", pe, " is not load/store reachable from pe ", ctx_.my_pe);
    }
  }
  mori::cuda::ScopedDevice guard(device_);
  const size_t words = layout_.total_bytes - layout_.entry;
  MORI_CUDA_CHECK(cudaMemset(block_ + layout_.entry, 0, words));
  MORI_CUDA_CHECK(cudaMemset(block_ + layout_.dup_src, 0xff, sizeof(int32_t) * shape.nvs()));
  MORI_CUDA_CHECK(cudaMalloc(&error_, 4 * sizeof(int32_t)));
  MORI_CUDA_CHECK(cudaMalloc(&scratch_, 2 * sizeof(int32_t) * shape.nvs()));
  MORI_CUDA_CHECK(cudaMalloc(&plan_scratch_, sizeof(int32_t) * PlannerScratchWords(shape)));
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  common_ = Common{ctx_,
                   shape_,
                   rank_,
                   hidden_,
                   reinterpret_cast<uint16_t*>(block_ + layout_.hidden),
                   reinterpret_cast<float*>(block_ + layout_.weights),
                   reinterpret_cast<int32_t*>(block_ + layout_.dup_src),
                   reinterpret_cast<int32_t*>(block_ + layout_.counts),
                   reinterpret_cast<uint64_t*>(block_ + layout_.entry),
                   reinterpret_cast<uint64_t*>(block_ + layout_.phase),
                   timeout_ns_};
  shmem::BarrierAll();
}

BalancedCuda::~BalancedCuda() {
  mori::cuda::ScopedDevice guard(device_);
  // Never throw from a destructor; a failure leaks the buffers.
  if (error_ != nullptr) cudaFree(error_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (plan_scratch_ != nullptr) cudaFree(plan_scratch_);
}

void BalancedCuda::Enter(int op, uint32_t kind, const char* name, const std::string& reason,
                         const int32_t* tpe, uintptr_t stream) {
  const uint64_t call = ++calls_;
  if (!reason.empty()) {
    LaunchEntry(common_, call, kAny, true, true, nullptr, op, stream);
    MORI_THROW(InvalidArgumentError, reason, " (balanced ", name, ": every other rank's kernel ",
               "traps naming rank ", rank_, ")");
  }
  LaunchEntry(common_, call, kind, false, false, tpe, op, stream);
}

void BalancedCuda::Refuse(const char* op, const std::string& reason, uintptr_t stream) {
  MORI_CHECK(!reason.empty(), "Refuse needs a reason");
  mori::cuda::ScopedDevice guard(device_);
  const std::string name = op;
  const int code = name == "combine"           ? kOpCombine
                   : name == "prefetch_weight" ? kOpPrefetch
                   : name == "reduce_grad"     ? kOpReduceGrad
                                               : kOpDispatch;
  Enter(code, kAny, op, reason, nullptr, stream);
  throw InternalError("unreachable: a refused call returned");
}

void BalancedCuda::Plan(const int32_t* tpe, const int32_t* topk, const std::string& reason,
                        const PlanTables& tables, int32_t* dst, uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  MORI_CUDA_CHECK(
      cudaMemsetAsync(common_.dup_src, 0xff, sizeof(int32_t) * shape_.nvs(), S(stream)));
  Enter(kOpDispatch, kPlanned, "dispatch", reason, tpe, stream);
  LaunchPlanner(
      PlannerParams{shape_, rank_, common_.counts, topk, tables, dst, error_, plan_scratch_},
      stream);
  LaunchPlannerCheck(error_, rank_, stream);
}

void BalancedCuda::Dispatch(const RankPlan& plan, const uint16_t* hidden, int64_t row_stride,
                            const float* weights, bool fresh, const std::string& reason,
                            uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  if (!fresh) Enter(kOpDispatch, kReplayed, "dispatch", reason, nullptr, stream);
  const DevicePlan p = Device(plan);
  LaunchDispatchRows(common_, p, hidden, row_stride, weights, fresh, stream);
  LaunchBarrier(common_, ++phases_, calls_, kOpDispatch, kStageRowsWritten, stream);
  if (fresh) LaunchDupGroups(common_, p, scratch_, stream);
  LaunchExpandZero(common_, p, stream);
}

void BalancedCuda::Combine(const RankPlan& plan, const uint16_t* hidden_nvsh,
                           const float* weights_nvs, uint16_t* out, float* out_weights,
                           const std::string& reason, uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  Enter(kOpCombine, kCombineCall, "combine", reason, nullptr, stream);
  const int64_t nvs = shape_.nvs();
  if (hidden_nvsh != common_.shard) {
    MORI_CUDA_CHECK(cudaMemcpyAsync(common_.shard, hidden_nvsh, nvs * hidden_ * 2,
                                    cudaMemcpyDefault, S(stream)));
  }
  if (weights_nvs != nullptr && weights_nvs != common_.weights) {
    MORI_CUDA_CHECK(
        cudaMemcpyAsync(common_.weights, weights_nvs, nvs * 4, cudaMemcpyDefault, S(stream)));
  }
  LaunchCombine(common_, Device(plan), out, out_weights, ++phases_, calls_, stream);
}

PoolArgs BalancedCuda::Pools(const char* op, const std::vector<const char*>& locals,
                             const std::vector<char*>& pools, const std::vector<int64_t>& sizes,
                             int64_t unit, std::string& why) const {
  PoolArgs a{};
  MORI_CHECK(locals.size() == pools.size() && pools.size() == sizes.size() &&
                 pools.size() <= static_cast<size_t>(kMaxPools),
             op, ": ", pools.size(), " pools");
  a.n = static_cast<int>(pools.size());
  for (int i = 0; i < a.n; ++i) {
    const size_t bytes = static_cast<size_t>(shape_.ranks) * shape_.epn() * sizes[i] * unit;
    if (why.empty() && !shmem::IsSymmetric(pools[i], bytes)) {
      why = StrCat(op, " buffer ", i, " is not a symmetric tensor of ", bytes,
                   " bytes (allocate it with mori.core.shmem.empty)");
    }
    a.locals[i] = locals[i];
    a.pools[i] = pools[i];
    a.bytes[i] = sizes[i];
  }
  return a;
}

void BalancedCuda::Prefetch(const int32_t* experts_to_copy, const std::vector<const char*>& locals,
                            const std::vector<char*>& pools, const std::vector<int64_t>& bytes,
                            const std::string& reason, bool copy_engine, uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  std::string why = reason;
  const PoolArgs a = Pools("prefetch", locals, pools, bytes, 1, why);
  Enter(kOpPrefetch, kPrefetchCall, "prefetch_weight", why, nullptr, stream);
  if (!copy_engine) {
    LaunchPrefetch(common_, experts_to_copy, a, stream);
  } else {
    // Copy engines: the host needs the slots' experts (R * epn words, one stream
    // synchronisation), then one peer copy per (slot, tensor) this rank owns.
    const int R = shape_.ranks, epn = shape_.epn();
    std::vector<int32_t> copy(static_cast<size_t>(R) * epn);
    MORI_CUDA_CHECK(cudaMemcpyAsync(copy.data(), experts_to_copy, copy.size() * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, S(stream)));
    MORI_CUDA_CHECK(cudaStreamSynchronize(S(stream)));
    for (int64_t slot = 0; slot < static_cast<int64_t>(copy.size()); ++slot) {
      const int32_t e = copy[slot];
      if (e < 0 || e / epn != rank_) continue;
      const int d = static_cast<int>(slot / epn);
      for (int i = 0; i < a.n; ++i) {
        void* dst = shmem::Ptr(a.pools[i] + slot * a.bytes[i], d);
        MORI_CUDA_CHECK(cudaMemcpyAsync(dst,
                                        a.locals[i] + static_cast<int64_t>(e % epn) * a.bytes[i],
                                        a.bytes[i], cudaMemcpyDeviceToDevice, S(stream)));
      }
    }
  }
  LaunchBarrier(common_, ++phases_, calls_, kOpPrefetch, kStageWeightsWritten, stream);
}

void BalancedCuda::ReduceGrad(const int32_t* experts_to_copy, const std::vector<float*>& locals,
                              const std::vector<float*>& pools, const std::vector<int64_t>& elems,
                              const std::string& reason, uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  std::string why = reason;
  std::vector<const char*> l;
  std::vector<char*> p;
  for (float* x : locals) l.push_back(reinterpret_cast<const char*>(x));
  for (float* x : pools) p.push_back(reinterpret_cast<char*>(x));
  const PoolArgs a = Pools("reduce", l, p, elems, 4, why);
  Enter(kOpReduceGrad, kReduceGradCall, "reduce_grad", why, nullptr, stream);
  LaunchReduceGrad(common_, experts_to_copy, a, ++phases_, calls_, stream);
}

}  // namespace mori::ep::balanced
