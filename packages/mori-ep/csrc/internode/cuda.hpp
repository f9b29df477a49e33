// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Inter-node dispatch/combine (internode/protocol.hpp) on a CUDA symmetric heap: the
// same protocol as InterNodeCpu, run by kernels (internode/kernels/) on the caller's
// stream. Pes of this node are written with load/store through the heap's peer
// mappings; every byte to a pe of another node is staged in this pe's block and
// handed to mori-core's proxy as commands pushed by the kernel (a write, then an add
// to the signal word it covers: mori/proxy/queue_device.cuh); receivers wait on their
// signal words, bounded, and trap naming the rank, its node and the stage (a failed
// proxy's error included) as the other mode's kernels do.
//
// Kernel types: InterNode (flat), InterNodeV1 (hierarchical) and InterNodeV1LL (V1's
// combine; its dispatch without the count exchange). One block of warp_per_block warps per call and
// one proxy queue: the protocol first, the speed later (MORI spreads the rows over rdma_block_num
// blocks and num_qp_per_pe queues). Plain C++ (no CUDA types): streams cross as integers.
//
// CUDA graphs. Nothing here synchronises with the device, and the kernels number
// their calls themselves (internode/kernel_params.hpp's DeviceState in the op's
// block), so a dispatch and a combine of any kind can be captured into a graph and
// replayed: every replay is a new call on every pe (its signal words carry new
// epochs; V1LL's dispatch knows from the device whether a dispatch preceded it), and
// the proxy serves the replayed kernels' commands as any others (its queues are
// device-side: nothing on the host per replay). The host's own count of the calls
// (epoch(), the combine order, routing handles' epochs) sees a captured call once,
// when it is captured, so what it checks holds for the captured sequence, not per
// replay: the combine-after-dispatch rule and a routing handle's order are checked
// at capture time; epoch() stops counting the replays (the kernels' traps print the
// device's numbers); Bytes()'s counts are the last replay's, but its `moved` is what
// the proxy moved since the captured call was enqueued (every replay since). A graph
// must be replayed by every pe the same number of times, as eager calls must be made.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/args.hpp"
#include "common/launch_shape.hpp"
#include "internode/cpu.hpp"  // InterNodeBytes
#include "internode/protocol.hpp"
#include "mori/proxy/proxy.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

class InterNodeCuda {
 public:
  // Collective over the heap's pes: zeroes this pe's signal words and private state,
  // builds the process's proxy for kernel producers (the first inter-node op of the
  // process; collective over the heap's bootstrap), then a heap barrier. `block`: this
  // pe's address of a symmetric block of MakeInterNodeLayout(..., device=true) on CUDA
  // device `device`.
  InterNodeCuda(const EpShape& shape, void* block, int device, std::chrono::milliseconds timeout,
                InterNodeKind kind, int local_size);
  InterNodeCuda(const InterNodeCuda&) = delete;
  InterNodeCuda& operator=(const InterNodeCuda&) = delete;

  // Enqueues the dispatch kernel on `stream`. Expert ids are checked in the kernel: a
  // bad id makes this pe post a rejection (its peers' kernels trap naming it), print
  // the id and trap. A call that would deliver more rows than the receive capacity to
  // some pe traps on every pe before any row moves.
  void Dispatch(const DispatchArgs& args, LaunchShape launch, uintptr_t stream);
  // Enqueues a kernel posting a rejected count row for the next call (the peers'
  // kernels trap naming this pe), then throws InvalidArgumentError(reason).
  [[noreturn]] void RejectDispatch(const std::string& reason, uintptr_t stream);
  void Combine(const CombineArgs& args, LaunchShape launch, uintptr_t stream);
  [[noreturn]] void RejectCombine(const std::string& reason, uintptr_t stream,
                                  const RoutingSnapshot* routing = nullptr);

  // This pe's bytes of its last dispatch or combine (synchronises the stream of the
  // last call enqueued: after graph replays, synchronise the replaying stream first):
  // the kernel's counts, as InterNodeCpu's; `moved` is what the proxy moved since the
  // call was enqueued (exact when the caller had synchronised before the call; after
  // graph replays, since the capture).
  InterNodeBytes Bytes(bool dispatch);

  const InterNodeLayout& layout() const { return layout_; }
  const NodeMap& nodes() const { return nodes_; }
  const char* link_name() const { return link_name_.c_str(); }
  int64_t num_tokens() const { return num_tokens_; }
  uint64_t epoch() const { return epoch_; }
  bool combine_pending() const { return order_.Pending(epoch_); }
  uint64_t combined_epoch() const { return order_.combined_epoch(); }

 private:
  RoutingSnapshot LastRouting() const;
  uint64_t ProxyMoved() const;
  void LaunchCombine(const CombineArgs* args, const RoutingSnapshot* r, LaunchShape launch,
                     uintptr_t stream);

  EpShape shape_;
  NodeMap nodes_;
  InterNodeKind kind_;
  InterNodeLayout layout_;
  char* block_;
  int device_;
  uint64_t timeout_ns_;
  shmem::DeviceContext ctx_;
  std::shared_ptr<proxy::Proxy> proxy_;
  proxy::QueueView queue_{};
  std::string link_name_;
  uint64_t epoch_ = 0;  // dispatches enqueued (captured ones once): the host's checks
  int64_t num_tokens_ = 0;
  CombineOrder order_;
  uint64_t moved_at_dispatch_ = 0, moved_at_combine_ = 0;
  uintptr_t last_stream_ = 0;
};

}  // namespace mori::ep
