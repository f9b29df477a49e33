// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The collectives on a CUDA symmetric heap (protocol_cuda.hpp), enqueued on the
// caller's stream with no host synchronisation: the call counter lives in the
// block's device memory, so calls can be captured in a CUDA graph and replayed
// (every replay is a new call). Calls of one communicator must be ordered on the
// device (one stream, or streams the caller orders). Plain C++ (no CUDA types):
// streams cross as integers.
//
// Failures only the device sees end in a trap with a message (the process's CUDA
// context is then lost, as for mori-ep's kernels): a peer that does not arrive
// within the timeout (named), ranks whose calls differ (both descriptors printed),
// a peer whose inputs failed validation on its host (named), all-to-all splits
// that disagree or overflow.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "mori/shmem/context.hpp"
#include "protocol.hpp"
#include "protocol_cuda.hpp"
#include "reduce.hpp"
#include "team.hpp"

namespace mori::ccl {

class CommunicatorCuda {
 public:
  // Collective: zeroes this pe's signal words, synchronises the device, then a heap
  // barrier. `block`: a symmetric block of MakeCudaLayout(n_pes,
  // max_bytes).total_bytes on CUDA device `device`. `max_blocks` bounds the grid of
  // every call (the SMs a call occupies), at most kMaxBlocks. `pes`: the ranks
  // (TeamContext; empty: every pe of the heap); MakeCudaLayout takes their count.
  // `zero_copy`: inputs that lie in the heap are read by the peers where they lie
  // (protocol_cuda.hpp); false: every input is staged.
  CommunicatorCuda(void* block, size_t max_bytes, int device, std::chrono::milliseconds timeout,
                   int max_blocks, const std::vector<int>& pes = {}, bool zero_copy = true);
  ~CommunicatorCuda();
  CommunicatorCuda(const CommunicatorCuda&) = delete;
  CommunicatorCuda& operator=(const CommunicatorCuda&) = delete;

  // `max_blocks` <= 0: the communicator's. Pointers are device addresses.
  void AllReduce(const void* src, void* dst, size_t count, DataType dtype, ReduceOp op,
                 CudaAlgorithm algorithm, int max_blocks, uintptr_t stream);
  void AllGather(const void* src, void* dst, size_t bytes, DataType dtype, CudaAlgorithm algorithm,
                 int max_blocks, uintptr_t stream);
  void ReduceScatter(const void* src, void* dst, size_t count, DataType dtype, ReduceOp op,
                     int max_blocks, uintptr_t stream);
  // Rank s sends in_splits[d] rows to rank d (device int64 [W]; nullptr: src_rows / W
  // each) and receives out_splits[s] rows from s (nullptr: dst_rows / W). Checked on the
  // device: sum(in_splits) <= src_rows, sum(out_splits) <= dst_rows (capacities),
  // and in_splits[d] of every s == out_splits[s] of d. The copy engine takes equal
  // splits.
  void AllToAll(const void* src, void* dst, size_t row_bytes, int64_t src_rows, int64_t dst_rows,
                const int64_t* in_splits, const int64_t* out_splits, DataType dtype,
                CudaAlgorithm algorithm, int max_blocks, uintptr_t stream);
  void Broadcast(void* buf, size_t bytes, DataType dtype, int root, int max_blocks,
                 uintptr_t stream);
  void Barrier(uintptr_t stream);
  // Posts a rejection for the next call to every pe (their kernels trap naming this
  // rank), then throws InvalidArgumentError(reason).
  [[noreturn]] void Reject(const std::string& reason, uintptr_t stream);

  bool zero_copy() const { return zero_copy_; }
  // Calls enqueued so far that read their input in place (graph replays not counted).
  uint64_t zero_copy_calls() const { return zero_copy_calls_; }
  // Calls enqueued so far (the device's counter is authoritative: graph replays
  // advance it without the host).
  uint64_t calls() const { return calls_; }
  size_t max_bytes() const { return max_bytes_; }
  int max_blocks() const { return max_blocks_; }
  // The largest input of a one_shot_ll all-reduce.
  size_t ll_max_bytes() const { return layout_.ll_words * 4; }
  // The grid a call of `bytes` gets with `max_blocks` (<= 0: the communicator's).
  int BlocksFor(int64_t bytes, int max_blocks) const;

 private:
  struct Launch;
  void Enqueue(Launch& launch, uintptr_t stream);
  CallDesc Describe(CollectiveKind kind, DataType dtype, int op, CudaAlgorithm algorithm, int root,
                    int blocks, int64_t bytes, int64_t row_bytes, bool zero_copy = false) const;
  // Whether an SM call reads `src` (`bytes`) in place: the communicator allows it and
  // src lies in the heap outside the communicator's block. Sets the launch's
  // src_offset and counts the call.
  bool ZeroCopy(const void* src, size_t bytes, Launch& launch);
  void CopyEngineCall(const CallDesc& desc, const void* src, size_t bytes, void* dst,
                      size_t chunk_bytes, bool all_to_all, uintptr_t stream);

  char* block_;
  size_t max_bytes_;
  int device_;
  uint64_t timeout_ns_;
  int max_blocks_;
  int sm_count_ = 0;
  CudaLayout layout_;
  shmem::DeviceContext ctx_{};       // ranks, not heap pes, when the communicator is a team
  std::vector<int> pes_;             // heap pe of each rank
  char** team_bases_dev_ = nullptr;  // a team's peer bases, in device memory
  int world_, me_;
  uint64_t calls_ = 0;
  bool zero_copy_;
  uint64_t zero_copy_calls_ = 0;
};

}  // namespace mori::ccl
