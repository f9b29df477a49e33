// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The low-latency protocol (low_latency/protocol.hpp) as CUDA kernels
// (kernels/dispatch.cu, kernels/combine.cu) on a CUDA symmetric heap. One kernel per call on the
// caller's stream, no host synchronisation: the call counters live in the block's
// private state, so CUDA-graph replays advance them. IntraNodeLL fuses send and
// receive into one kernel; AsyncLL launches the send kernel, then the receive one.

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/launch_shape.hpp"
#include "common/shape.hpp"
#include "common/timeline.hpp"
#include "low_latency/args.hpp"
#include "low_latency/kernels/params.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

class LowLatencyCuda {
 public:
  // Collective: zeroes this pe's signal words and state, synchronises the device,
  // then a heap barrier.
  LowLatencyCuda(const EpShape& shape, void* block, int device, std::chrono::milliseconds timeout);
  ~LowLatencyCuda();
  LowLatencyCuda(const LowLatencyCuda&) = delete;
  LowLatencyCuda& operator=(const LowLatencyCuda&) = delete;

  // Expert ids are checked in the kernel: a bad id (or, expert-major, a repeated
  // one) posts the call as rejected to every pe, prints the token, slot and value,
  // and traps; the peers' receive traps naming this pe. So does a count past the
  // receive slots for some pe (max_total_recv_tokens), whose rows past the slots are
  // not written and whose note lets every pe's trap name the pes and both counts.
  // With `fuse` the receive half runs in the same kernel (DispatchRecv then launches
  // nothing new).
  void DispatchSend(const LlDispatchArgs& args, bool fuse, LaunchShape launch, uintptr_t stream);
  void DispatchRecv(const LlRecvArgs& out, LaunchShape launch, uintptr_t stream);
  [[noreturn]] void RejectDispatch(const std::string& reason, uintptr_t stream);
  void CombineSend(const LlCombineArgs& args, const int32_t* total_recv, bool fuse,
                   LaunchShape launch, uintptr_t stream);
  void CombineRecv(LaunchShape launch, uintptr_t stream);
  [[noreturn]] void RejectCombine(const std::string& reason, uintptr_t stream);

  int64_t num_tokens() const { return num_tokens_; }
  // Whether combine_standard_moe pre-reduces per rank (LlPreReduce).
  bool pre_reduce() const { return pre_reduce_; }
  // Whether dispatches move their rows to other pes with the copy engines
  // (MORI_EP_LL_COPY_ENGINE, read at construction; low_latency/protocol.hpp).
  bool copy_engine() const { return copy_engine_; }
  // With MORI_EP_TIMELINE=1: the per-phase stamps of the last launch of each phase
  // (dispatch send/recv, combine send/recv) as text, synchronising the device; else "".
  std::string Timeline() { return timeline_->Format(); }

 private:
  low_latency::LlParams Base() const;
  void Launch(const low_latency::LlParams& p, LaunchShape launch, uintptr_t stream);
  // After a copy-engine send kernel on `stream`: on the side stream, each other pe's
  // slot range of every array the dispatch wrote, then its flag.
  void CopyDispatch(const LlDispatchArgs& a, uintptr_t stream);
  // The same after a token-major combine send: each other pe's M combine rows (and
  // weights), then its flag.
  void CopyCombine(const LlCombineArgs& a, uintptr_t stream);
  // Copies `n` (dst on pe d, src in the staging) on the side stream after `stream`'s
  // work so far; the flags last (in stream order after the rows).
  struct PeerCopy {
    size_t off;       // the symmetric array's offset in the block
    int64_t bytes;    // per pe
    const char* src;  // the staging of pe 0's range (pe d's at src + d * bytes)
  };
  void CopyToPeers(const PeerCopy* copies, int n, size_t flag_off, const uint64_t* flags,
                   uintptr_t stream, cudaEvent_t done);

  EpShape shape_;
  LlBufferLayout layout_;
  char* block_;
  int device_;
  int sm_count_ = 0;
  uint64_t timeout_ns_;
  shmem::DeviceContext ctx_;
  // Host mirrors of what was enqueued, for the next half's launch (never read by
  // the kernels as state: the call counters are on the device).
  LlDispatchArgs dispatch_{};
  bool dispatch_deferred_ = false;
  LlCombineArgs combine_{};
  const int32_t* combine_total_ = nullptr;
  bool combine_deferred_ = false;
  int64_t num_tokens_ = 0;
  bool pre_reduce_ = false;
  bool copy_engine_ = false;
  char* stage_ = nullptr;  // private device memory: half 0 of the dispatch arrays + W flags,
                           // then half 0 of the combine arrays + W flags
  size_t stage_span_ = 0;  // bytes of the dispatch arrays part
  size_t comb_stage_at_ = 0, comb_stage_span_ = 0;
  cudaStream_t side_ = nullptr;
  cudaEvent_t sent_ = nullptr, copied_ = nullptr, comb_copied_ = nullptr;
  std::unique_ptr<KernelTimeline> timeline_;  // MORI_EP_TIMELINE: parts kLlPart*
  bool copies_pending_ = false;               // the dispatch receive must wait for `copied_`
  bool comb_copies_pending_ = false;          // the combine receive for `comb_copied_`
};

}  // namespace mori::ep
