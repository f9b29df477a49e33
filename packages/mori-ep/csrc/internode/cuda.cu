// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// InterNodeCuda: the host side of the inter-node kernels (internode/kernels/): the
// process's proxy for kernel producers, the call checks the host can make, its own
// count of the calls (for its checks: the kernels number the calls themselves), the
// launches. Nothing here synchronises with the device on the hot path.
#include "internode/cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/call_checks.hpp"
#include "common/numeric.hpp"
#include "internode/kernel_params.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

namespace {

// The process's proxy for kernel producers on the current (CUDA) heap: built by the
// first inter-node op, closed collectively when the heap is finalized (as the host
// implementation's, internode/proxy_link.cpp; a process has one heap, host or CUDA).
std::shared_ptr<proxy::Proxy>& CurrentDeviceProxy() {
  static auto* proxy = new std::shared_ptr<proxy::Proxy>();  // never destroyed at exit
  return *proxy;
}

std::shared_ptr<proxy::Proxy> SharedDeviceProxy(std::chrono::milliseconds timeout) {
  std::shared_ptr<proxy::Proxy>& current = CurrentDeviceProxy();
  if (!current) {
    proxy::ProxyOptions o;
    o.num_queues = 1;
    o.producer = proxy::Producer::kCuda;
    o.timeout = timeout;
    current = std::make_shared<proxy::Proxy>(shmem::GetBootstrap(), o);
    shmem::AtFinalize([] {
      std::shared_ptr<proxy::Proxy> p = std::move(CurrentDeviceProxy());
      CurrentDeviceProxy().reset();
      if (p) p->Close();
    });
  }
  return current;
}

// Threads of the one block each call runs: warp_per_block warps, at least 2 (so the
// waits of up to 32 pes and the rows overlap), at most 32.
int Threads(const LaunchShape& launch) { return std::clamp(launch.warp_per_block, 2, 32) * 32; }

}  // namespace

InterNodeCuda::InterNodeCuda(const EpShape& shape, void* block, int device,
                             std::chrono::milliseconds timeout, InterNodeKind kind, int local_size)
    : shape_(shape),
      nodes_{shape.world_size, local_size},
      kind_(kind),
      block_(static_cast<char*>(block)),
      device_(device),
      timeout_ns_(KernelTimeoutNs(timeout, "timeout")),
      ctx_(shmem::GetDeviceContext()) {
  const int W = shape.world_size;
  MORI_CHECK_ARG(local_size >= 1 && local_size <= 32 && W % local_size == 0, "pes per node ",
                 local_size, " must divide world_size ", W, " and be in [1, 32]");
  if (W > internode::kMaxInterNodeWorld) {
    MORI_THROW(NotSupportedError, "the inter-node CUDA kernels take world sizes up to ",
               internode::kMaxInterNodeWorld, ", got ", W);
  }
  layout_ = MakeInterNodeLayout(shape, nodes_, kind, /*device=*/true);
  if (kind == InterNodeKind::kHierLL) {
    MORI_CHECK_ARG(RecvCapacity(shape) % W == 0, "receive capacity ", RecvCapacity(shape),
                   " is not a multiple of world_size ", W);
  }
  MORI_CHECK_ARG(ctx_.n_pes == W, "world_size ", W, " differs from the heap's n_pes ", ctx_.n_pes);
  MORI_CHECK_ARG(ctx_.my_pe == shape.rank, "rank ", shape.rank, " differs from the heap's my_pe ",
                 ctx_.my_pe);
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the op's buffer is not a symmetric block of ", layout_.total_bytes, " bytes");
  const int node = nodes_.NodeOf(shape.rank);
  for (int pe = node * local_size; pe < (node + 1) * local_size; ++pe) {
    if (shmem::Ptr(block, pe) == nullptr) {
      MORI_THROW(NotSupportedError, InterNodeKindName(kind), ": pe ", pe, " is on node ", node,
                 " (gpu_per_node ", local_size, ") but not load/store reachable from pe ",
                 shape.rank, " (the heap's local group is smaller: lower gpu_per_node)");
    }
  }
  mori::cuda::ScopedDevice guard(device_);
  MORI_CUDA_CHECK(cudaMemset(block_, 0, InterNodeSignalBytes(layout_)));
  // The byte counters and the values last set through the proxy (the last regions).
  MORI_CUDA_CHECK(cudaMemset(block_ + layout_.counters, 0, layout_.total_bytes - layout_.counters));
  // Loaded now, not at a first launch while a kernel spins on the proxy (CUDA's lazy
  // loading may wait for the device).
  internode::LoadFlatKernels();  // also the rejections' kernels of every kind
  internode::LoadHierKernels();
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  proxy_ = SharedDeviceProxy(timeout);
  queue_ = proxy_->DeviceQueue(0);
  bool paths[3] = {false, false, false};
  for (int pe = 0; pe < proxy_->n_pes(); ++pe) {
    if (nodes_.NodeOf(pe) != node) paths[static_cast<int>(proxy_->PathTo(pe))] = true;
  }
  link_name_ = "proxy (kernel producer";
  for (int p = 0; p < 3; ++p) {
    if (paths[p]) link_name_ += std::string(", ") + proxy::PathName(static_cast<proxy::Path>(p));
  }
  link_name_ += ")";
  shmem::BarrierAll();
}

uint64_t InterNodeCuda::ProxyMoved() const {
  uint64_t total = 0;
  for (uint64_t b : proxy_->Stats().bytes_by_path) total += b;
  return total;
}

// The parts of the kernels' parameters every call shares.
static internode::Params BaseParams(char* block, const shmem::DeviceContext& ctx,
                                    const InterNodeLayout& l, const NodeMap& nodes,
                                    const proxy::QueueView& q, InterNodeKind kind, const EpShape& s,
                                    uint64_t timeout_ns) {
  internode::Params p{};
  p.block = block;
  p.block_offset = static_cast<uint64_t>(block - ctx.my_base);
  p.l = l;
  p.nodes = nodes;
  p.ctx = ctx;
  p.queue = q;
  p.kind = static_cast<int>(kind);
  p.world_size = s.world_size;
  p.rank = s.rank;
  p.max_tokens = s.max_tokens;
  p.hidden_bytes = s.hidden_bytes;
  p.scale_bytes = s.scale_bytes;
  p.combine_row_bytes = s.combine_row_bytes;
  p.recv_capacity = RecvCapacity(s);
  p.top_k = s.top_k;
  p.num_experts_per_rank = s.num_experts_per_rank;
  p.timeout_ns = timeout_ns;
  return p;
}

void InterNodeCuda::Dispatch(const DispatchArgs& a, LaunchShape launch, uintptr_t stream) {
  CheckDispatchArgs(shape_, a, [&](const std::string& why) { RejectDispatch(why, stream); });
  mori::cuda::ScopedDevice guard(device_);
  internode::Params p =
      BaseParams(block_, ctx_, layout_, nodes_, queue_, kind_, shape_, timeout_ns_);
  p.tokens = static_cast<const char*>(a.tokens);
  p.token_row_bytes = a.token_row_bytes;
  p.weights = a.weights;
  p.scales = static_cast<const char*>(a.scales);
  p.indices = a.indices;
  p.num_tokens = a.num_tokens;
  p.rank_masks = a.rank_masks;
  p.row_tag = a.row_tag;
  moved_at_dispatch_ = ProxyMoved();
  last_stream_ = stream;
  if (kind_ == InterNodeKind::kFlat) {
    internode::LaunchFlatDispatch(p, Threads(launch), stream);
  } else if (kind_ == InterNodeKind::kHier) {
    internode::LaunchHierDispatch(p, Threads(launch), stream);
  } else {
    internode::LaunchHierLowLatencyDispatch(p, Threads(launch), stream);
  }
  ++epoch_;
  num_tokens_ = a.num_tokens;
  order_.Dispatched(true);
}

void InterNodeCuda::RejectDispatch(const std::string& reason, uintptr_t stream) {
  {
    mori::cuda::ScopedDevice guard(device_);
    internode::Params p =
        BaseParams(block_, ctx_, layout_, nodes_, queue_, kind_, shape_, timeout_ns_);
    p.reject = true;
    if (kind_ == InterNodeKind::kHierLL) {  // the rejection words, then forwarding
      internode::LaunchHierLowLatencyDispatch(p, 64, stream);
    } else {  // the count exchange only: the same in the flat and V1 kernels
      internode::LaunchFlatDispatch(p, 64, stream);
    }
  }
  ++epoch_;
  order_.Dispatched(false);
  throw InvalidArgumentError(reason);
}

RoutingSnapshot InterNodeCuda::LastRouting() const {
  return RoutingSnapshot{reinterpret_cast<const int32_t*>(block_ + layout_.recv_src_pos),
                         nullptr,
                         reinterpret_cast<const uint8_t*>(block_ + layout_.token_ranks),
                         nullptr,
                         reinterpret_cast<const int32_t*>(block_ + layout_.total_recv),
                         nullptr,
                         epoch_,
                         num_tokens_};
}

void InterNodeCuda::LaunchCombine(const CombineArgs* a, const RoutingSnapshot* r,
                                  LaunchShape launch, uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  internode::Params p =
      BaseParams(block_, ctx_, layout_, nodes_, queue_, kind_, shape_, timeout_ns_);
  if (a == nullptr) {
    p.reject = true;  // the vote only: the same in both kernels
    internode::LaunchFlatCombine(p, 64, stream);
    return;
  }
  p.input = static_cast<const char*>(a->input);
  p.input_row_stride = a->input_row_stride;
  p.input_rows = a->input_rows;
  p.dtype = static_cast<int>(a->dtype);
  p.fp8_cast = a->fp8_cast;
  p.combine_weights = a->out_weights != nullptr ? a->weights : nullptr;
  p.out = static_cast<char*>(a->out);
  p.out_weights = a->out_weights;
  p.src_pos = r->src_pos;
  p.token_ranks = r->token_ranks;
  p.total_recv = r->total_recv;
  p.num_tokens = r->num_tokens;
  p.hidden_dim = shape_.hidden_dim;
  p.row_bytes = shape_.hidden_dim * CombineElementBytes(a->dtype);
  p.combine_tag = CombineDtypeTag(a->dtype);
  moved_at_combine_ = ProxyMoved();
  last_stream_ = stream;
  if (kind_ == InterNodeKind::kFlat) {
    internode::LaunchFlatCombine(p, Threads(launch), stream);
  } else {
    internode::LaunchHierCombine(p, Threads(launch), stream);
  }
}

void InterNodeCuda::Combine(const CombineArgs& a, LaunchShape launch, uintptr_t stream) {
  const RoutingSnapshot last = LastRouting();
  const RoutingSnapshot* r = order_.Pick(a.routing, last);
  if (r == nullptr) order_.ThrowNotCombinable(a.routing, epoch_);
  const int64_t row_bytes = shape_.hidden_dim * CombineElementBytes(a.dtype);
  if (a.fp8_block_scale_dim > 0) {
    RejectCombine(StrCat(InterNodeKindName(kind_), " combine only supports quant_type none and ",
                         "fp8_direct_cast (fp8_blockwise: IntraNode, IntraNodeLL, AsyncLL)"),
                  stream, a.routing);
  }
  if (row_bytes > shape_.combine_row_bytes) {
    RejectCombine(StrCat("combine rows of ", row_bytes, " bytes exceed the combine buffer's ",
                         shape_.combine_row_bytes, " (hidden_dim * max(max_token_type_size, 2))"),
                  stream, a.routing);
  }
  if (a.fp8_cast && a.dtype != CombineDtype::kBFloat16) {
    RejectCombine("fp8_direct_cast combines bf16 input only", stream, a.routing);
  }
  // total_recv is on the device: an input shorter than it is a kernel trap (mori.ep
  // checks it on the host first).
  order_.Enter(r->host_epoch);
  LaunchCombine(&a, r, launch, stream);
}

void InterNodeCuda::RejectCombine(const std::string& reason, uintptr_t stream,
                                  const RoutingSnapshot* routing) {
  const RoutingSnapshot last = LastRouting();
  if (const RoutingSnapshot* r = order_.Pick(routing, last)) {
    order_.Enter(r->host_epoch);
    LaunchCombine(nullptr, r, LaunchShape{1, 2}, stream);
  }
  throw InvalidArgumentError(reason);
}

InterNodeBytes InterNodeCuda::Bytes(bool dispatch) {
  mori::cuda::ScopedDevice guard(device_);
  // The stream of the last call (not the device: the proxy's streams keep running).
  MORI_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(last_stream_)));
  uint64_t c[internode::kCounterStride];
  MORI_CUDA_CHECK(cudaMemcpy(
      c, block_ + layout_.counters + (dispatch ? 0 : internode::kCounterStride * sizeof(uint64_t)),
      sizeof(c), cudaMemcpyDeviceToHost));
  InterNodeBytes b;
  b.algo_token = c[internode::kAlgoToken];
  b.physical_token = c[internode::kPhysicalToken];
  b.physical_rows = c[internode::kPhysicalRows];
  b.forwarded_rows = c[internode::kForwardedRows];
  b.link.token = c[internode::kLinkToken];
  b.link.meta = c[internode::kLinkMeta];
  b.link.signal = c[internode::kLinkSignal];
  b.link.writes = c[internode::kLinkWrites];
  b.link.signals = c[internode::kLinkSignals];
  b.moved = ProxyMoved() - (dispatch ? moved_at_dispatch_ : moved_at_combine_);
  return b;
}

}  // namespace mori::ep
