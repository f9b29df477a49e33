// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The collectives on a host symmetric heap (protocol.hpp), run by the calling
// thread. Every call is collective over the communicator's ranks (every pe of the
// heap, or a team of them: team.hpp); every wait is bounded by the communicator's
// timeout.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mori/shmem/context.hpp"
#include "protocol.hpp"
#include "reduce.hpp"
#include "team.hpp"

namespace mori::ccl {

class CommunicatorCpu {
 public:
  // `block`: a symmetric block of MakeBlockLayout(ranks, max_bytes).total_bytes on a
  // host heap. `pes`: the ranks (TeamContext; empty: every pe). Collective over every
  // pe of the heap: zeroes this pe's signal words, then a heap barrier. `zero_copy`:
  // inputs that lie in the heap are read by the peers in place; false: always staged.
  CommunicatorCpu(void* block, size_t max_bytes, std::chrono::milliseconds timeout,
                  const std::vector<int>& pes = {}, bool zero_copy = true);

  // dst = op over ranks (ascending) of every rank's src, `count` elements; dst may be src.
  void AllReduce(const void* src, void* dst, size_t count, DataType dtype, ReduceOp op,
                 AllReduceAlgorithm algorithm);
  // dst[r * bytes, (r + 1) * bytes) = rank r's src.
  void AllGather(const void* src, void* dst, size_t bytes, DataType dtype);
  // dst (count elements) = op over ranks of their src[rank * count, (rank + 1) * count).
  void ReduceScatter(const void* src, void* dst, size_t count, DataType dtype, ReduceOp op);
  // Rank s sends in_rows[d] rows of `row_bytes` to rank d, in rank order from src;
  // dst holds the rows from each rank in rank order (out_rows[s] from rank s).
  void AllToAll(const void* src, void* dst, size_t row_bytes, const int64_t* in_rows,
                const int64_t* out_rows, DataType dtype);
  // buf (bytes) on every rank = buf of rank `root`.
  void Broadcast(void* buf, size_t bytes, DataType dtype, int root);
  void Barrier();
  // Take part in a call of `kind` as a rank whose inputs failed validation: every
  // rank fails that call; this one raises InvalidArgumentError(reason).
  void Reject(CollectiveKind kind, const std::string& reason);

  uint64_t epoch() const { return epoch_; }
  size_t max_bytes() const { return max_bytes_; }

 private:
  struct Call {
    CallHeader header{};
    const void* src = nullptr;  // input of `header.bytes` bytes
    const int64_t* in_rows = nullptr;
    const int64_t* out_rows = nullptr;
  };

  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(block_ + offset);
  }
  const char* PeerSource(int pe) const;
  // Waits until words[pe] >= value (bounded); a timeout or a peer's failure mark
  // fails the call in progress (protocol.hpp) with TimeoutError.
  void Wait(uint64_t* words, int pe, uint64_t value, const char* what);
  // Posts `epoch` into this rank's word on every pe; raises TimeoutError when a pe
  // had given up waiting for it (`what`: what that pe waited for).
  void PostAll(size_t words_offset, uint64_t epoch, const char* what);
  // Marks this rank's signal words on every peer with the failure of call epoch_.
  void FailCall();
  // Steps 1-3 of protocol.hpp; returns whether the input is read in place.
  bool Begin(Call& call);
  void CheckAgreement(const Call& call);
  void End(bool in_place_input);
  void ReduceRange(DataType dtype, ReduceOp op, size_t src_offset, size_t first, size_t count,
                   void* dst);

  std::vector<char*> team_bases_;  // ctx_.peer_bases of a team (before ctx_)
  shmem::DeviceContext ctx_;       // ranks, not heap pes, when the communicator is a team
  char* block_;
  size_t max_bytes_;
  BlockLayout layout_;
  std::chrono::milliseconds timeout_;
  bool zero_copy_;
  uint64_t epoch_ = 0;
  CollectiveKind kind_ = CollectiveKind::kBarrier;  // the call in progress
  std::vector<CallHeader> headers_;                 // every rank's, this call
  std::vector<const void*> srcs_;
};

const char* CollectiveKindName(CollectiveKind kind);

}  // namespace mori::ccl
