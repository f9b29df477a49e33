// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The low-latency protocol (low_latency/protocol.hpp) on a host symmetric heap: the
// CPU implementation of what kernels/dispatch.cu and kernels/combine.cu run, split as AsyncLL
// splits it (send, then receive); IntraNodeLL calls both halves in one call. This class re-checks
// what the protocol's safety depends on (token counts, expert ids, distinct experts per token in
// the expert-major layout) before any byte moves.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "low_latency/args.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

class LowLatencyCpu {
 public:
  // Collective over the heap's pes: zeroes this pe's signal words, then a heap
  // barrier. `block` is this pe's address of a symmetric block of
  // MakeLlLayout(shape).total_bytes.
  LowLatencyCpu(const EpShape& shape, void* block, std::chrono::milliseconds timeout);

  // Checks and routes, writes every token into its destinations' slots and posts
  // the flags (call order: DispatchSend, DispatchRecv, CombineSend, CombineRecv; a
  // dispatch may follow a dispatch). A failed check rejects the call: the flags carry
  // the rejection, every pe's DispatchRecv throws, this one throws here.
  void DispatchSend(const LlDispatchArgs& args);
  [[noreturn]] void RejectDispatch(const std::string& reason);
  // The message every pe gives for a call `from` rejected over the receive cap.
  std::string OverCapMessage(int from, int dest, int64_t count) const;
  // Waits for every pe's flag of the pending dispatch and lays the rows out.
  // Returns total_recv (token-major) or the number of expert rows (expert-major).
  int64_t DispatchRecv(const LlRecvArgs& out);

  void CombineSend(const LlCombineArgs& args);
  [[noreturn]] void RejectCombine(const std::string& reason);
  void CombineRecv();

  const LlBufferLayout& layout() const { return layout_; }
  uint64_t dispatch_calls() const { return dispatch_calls_; }
  uint64_t combine_calls() const { return combine_calls_; }
  bool dispatch_recv_pending() const { return dispatch_recv_pending_; }
  bool combine_recv_pending() const { return combine_recv_pending_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Whether combine_standard_moe pre-reduces per rank (LlPreReduce).
  bool pre_reduce() const { return pre_reduce_; }

 private:
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(block_ + offset);
  }
  void PostDispatchFlags(uint64_t call, const uint64_t* counts, uint32_t tag);
  // Rejects the call (RejectDispatch) after writing the over-the-cap note into every
  // pe: this pe routes `count` tokens to pe `dest`, more than the receive slots.
  [[noreturn]] void RejectOverCap(int dest, int64_t count);
  void PostCombineFlags(uint64_t call, bool rejected, uint32_t tag, bool weights);
  void CombineSendTokenMajor(const LlCombineArgs& a, int half);
  void CombineSendExpertMajor(const LlCombineArgs& a, int half);
  void CombineSendPartials(int half);

  EpShape shape_;
  int64_t slots_;  // receive slots per source pe (LlRecvSlots)
  LlBufferLayout layout_;
  char* block_;
  shmem::DeviceContext ctx_;
  std::chrono::milliseconds timeout_;
  uint64_t dispatch_calls_ = 0;
  uint64_t combine_calls_ = 0;
  bool dispatch_recv_pending_ = false;
  bool combine_recv_pending_ = false;
  bool dispatch_rejected_ = false;
  bool combine_rejected_ = false;
  LlLayout dispatch_layout_ = LlLayout::kTokenMajor;
  bool fp8_cast_ = false;
  int64_t token_row_bytes_ = 0;
  uint32_t dispatch_tag_ = 0;  // the last dispatch's wire tag (LlDispatchTag)
  int64_t num_tokens_ = 0;
  bool pre_reduce_ = false;
  // The last received dispatch: its half and its count per source pe (what a
  // pre-reduced combine reads back from the dispatch area).
  size_t recv_half_ = 0;
  std::vector<int64_t> recv_counts_;
  LlCombineArgs combine_{};
};

}  // namespace mori::ep
