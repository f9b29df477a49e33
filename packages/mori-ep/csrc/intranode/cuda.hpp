// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Intra-node dispatch/combine (intranode/protocol.hpp) on a CUDA symmetric heap: the same
// protocol as IntraNodeCpu, run by kernels on the caller's stream. Nothing on the
// hot path synchronises with the host: the epoch, the grid-completion counters
// and total_recv live in the op's block in device memory, so the calls can be
// captured in a CUDA graph and replayed (each replay advances the epoch).
// Plain C++ (no CUDA types): streams cross as integers.

#include <chrono>
#include <cstdint>
#include <string>

#include "common/args.hpp"
#include "common/launch_shape.hpp"
#include "common/timeline.hpp"
#include "intranode/kernels/params.hpp"
#include "intranode/protocol.hpp"
#include "intranode/tuning.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

class IntraNodeCuda {
 public:
  // Collective over the heap's pes: zeroes this pe's signal words and device state,
  // synchronises the device, then a heap barrier. `block` is this pe's address of
  // a symmetric block of MakeLayout(shape).total_bytes on CUDA device `device`.
  IntraNodeCuda(const EpShape& shape, void* block, int device, std::chrono::milliseconds timeout);
  ~IntraNodeCuda();
  IntraNodeCuda(const IntraNodeCuda&) = delete;
  IntraNodeCuda& operator=(const IntraNodeCuda&) = delete;

  // Enqueues the dispatch kernel on `stream`. Expert ids are checked in the kernel:
  // an id outside [-1, num_experts) makes it post a rejection to every pe, print
  // the token, slot and value, and trap (the peers trap naming this pe). With a
  // receive cap (shape.recv_capacity), a call that would deliver more rows than the
  // cap to some pe traps on every pe before any row moves, naming the pe and counts.
  void Dispatch(const DispatchArgs& args, LaunchShape launch, uintptr_t stream);
  // Posts a rejected count row for the next epoch (peers' kernels trap naming this
  // pe), then throws InvalidArgumentError(reason).
  [[noreturn]] void RejectDispatch(const std::string& reason, uintptr_t stream);

  // Enqueues the combine kernel: rows back to their sources, then the reduction in
  // ascending pe order (fp32, one rounding), bit-identical to IntraNodeCpu. fp8
  // e4m3 input, and bf16 with args.fp8_cast, cross NVLink as fp8 bytes; bf16 with
  // args.fp8_block_scale_dim as MORI's fp8_blockwise blocks and scales.
  // A total_recv above args.input_rows is a device-side trap. By the last dispatch's
  // routing or args.routing's, as IntraNodeCpu::Combine (a combine that follows a
  // combine first enqueues a heap barrier on `stream`).
  void Combine(const CombineArgs& args, LaunchShape launch, uintptr_t stream);
  [[noreturn]] void RejectCombine(const std::string& reason, uintptr_t stream,
                                  const RoutingSnapshot* routing = nullptr);

  const EpBufferLayout& layout() const { return layout_; }
  // Host mirrors of what was enqueued (the device copies are authoritative).
  int64_t num_tokens() const { return num_tokens_; }
  uint64_t epoch() const { return epoch_; }
  bool combine_pending() const { return order_.Pending(epoch_); }
  uint64_t combined_epoch() const { return order_.combined_epoch(); }
  // The largest grid of `warps` warps per block that stays resident, for dispatch's
  // kernels or combine's (those moving rows as `wire`, intranode::CombineWire).
  int MaxResidentBlocks(bool dispatch, int warps, int wire = 0);
  // With MORI_EP_TIMELINE=1: the per-phase stamps of the last dispatch and combine
  // kernels as text (synchronises the device); else "". A measurement aid.
  std::string Timeline() { return timeline_.Format(); }

 private:
  LaunchShape Resolve(LaunchShape launch, bool dispatch, int wire);
  RoutingSnapshot LastRouting() const;

  EpShape shape_;
  EpBufferLayout layout_;
  char* block_;
  int device_;
  int sm_count_ = 0;
  char* scratch_ = nullptr;  // the dynamic dispatch's private scratch (device memory)
  int scratch_blocks_ = 0;   // the largest grid the scratch serves
  uint64_t timeout_ns_;
  IntraNodeTuning tuning_;   // read from the environment once, in the constructor
  KernelTimeline timeline_;  // MORI_EP_TIMELINE: parts 0 (dispatch) and 1 (combine)
  bool capped_;              // a receive cap below world x max tokens: dispatch checks it
  shmem::DeviceContext ctx_;
  // [0]: dispatch, [1 + wire]: combine moving rows as `wire`.
  int max_blocks_[1 + intranode::kCombineWires][intranode::kMaxWarpsPerBlock + 1] = {};
  uint64_t epoch_ = 0;
  int64_t num_tokens_ = 0;
  CombineOrder order_;
};

}  // namespace mori::ep
