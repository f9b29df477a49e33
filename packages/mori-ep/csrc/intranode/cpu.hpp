// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Intra-node dispatch/combine (intranode/protocol.hpp) on a host symmetric heap: the CPU
// implementation of the protocol the CUDA kernels run. This class re-checks what
// the protocol's safety depends on (sizes against capacity, expert ids) before any
// byte moves.

#include <chrono>
#include <cstdint>
#include <string>

#include "common/args.hpp"
#include "intranode/protocol.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

class IntraNodeCpu {
 public:
  // Collective over the heap's pes: zeroes this pe's signal words and runs a heap
  // barrier, so no pe signals a peer before that peer has zeroed. `block` is this
  // pe's address of a symmetric block of MakeLayout(shape).total_bytes.
  IntraNodeCpu(const EpShape& shape, void* block, std::chrono::milliseconds timeout);

  // Routes, validates every expert id (before any byte moves), exchanges counts,
  // writes rows into the destination pes and waits for every source. Returns this
  // pe's total_recv. A bad expert id here, or a rejection from a peer, throws
  // InvalidArgumentError on every pe in the same call, with no data moved.
  int64_t Dispatch(const DispatchArgs& args);
  // Takes part in a dispatch epoch without data, marking this pe's inputs as
  // rejected (the caller found them invalid), then throws InvalidArgumentError
  // with `reason`. Peers fail the same call.
  [[noreturn]] void RejectDispatch(const std::string& reason);

  // Returns each received row to its source and reduces (fp32 accumulation in
  // ascending destination pe order, one rounding to the output dtype), by the last
  // dispatch's routing or args.routing's (a dispatch not yet combined, combined in
  // the order of the dispatches; a combine that follows a combine first runs a heap
  // barrier).
  void Combine(const CombineArgs& args);
  [[noreturn]] void RejectCombine(const std::string& reason,
                                  const RoutingSnapshot* routing = nullptr);

  const EpBufferLayout& layout() const { return layout_; }
  int64_t total_recv() const { return total_recv_; }
  int64_t num_tokens() const { return num_tokens_; }
  uint64_t epoch() const { return epoch_; }
  // Whether the last dispatch succeeded and has not been combined yet.
  bool combine_pending() const { return order_.Pending(epoch_); }
  // The epoch of the last combine (its words in combine_done).
  uint64_t combined_epoch() const { return order_.combined_epoch(); }

 private:
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(block_ + offset);
  }
  void PostCounts(uint64_t epoch, const uint64_t* counts, uint32_t row_tag);
  // Waits for every pe's count row of `epoch`; returns the first rejecting pe or -1.
  int WaitCounts(uint64_t epoch);
  // Signals dispatch_done to every pe and waits for every pe's, also in a rejected
  // epoch: that is what lets the next epoch's count words overwrite this one's.
  void FinishDispatchEpoch(uint64_t epoch);
  // Posts this pe's combine words (its input's dtype `tag` and whether it combines
  // `weights`, or a rejection) and waits for every pe's; a rejection, a peer's other
  // dtype or other weights bit throws InvalidArgumentError.
  void FinishCombine(uint64_t epoch, bool rejected, uint32_t tag, bool weights);
  // The last dispatch's routing: the block's regions (CombineOrder picks it or a
  // snapshot).
  RoutingSnapshot LastRouting() const;

  EpShape shape_;
  EpBufferLayout layout_;
  char* block_;
  shmem::DeviceContext ctx_;
  std::chrono::milliseconds timeout_;
  uint64_t epoch_ = 0;
  int64_t total_recv_ = 0;
  int64_t num_tokens_ = 0;
  CombineOrder order_;
};

}  // namespace mori::ep
