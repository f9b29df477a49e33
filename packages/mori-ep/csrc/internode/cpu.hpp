// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Inter-node dispatch/combine (internode/protocol.hpp: InterNode, InterNodeV1,
// InterNodeV1LL) on a host symmetric heap: pes of one node through the heap, pes of
// other nodes through a CrossNodeLink (internode/link.hpp). Takes DispatchArgs and
// CombineArgs (common/args.hpp) as the intra-node implementation does.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/args.hpp"
#include "common/peer_wait.hpp"
#include "internode/link.hpp"
#include "internode/protocol.hpp"
#include "internode/proxy_link.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep {

// Bytes of the last dispatch or combine of this pe, as DeepEP and MORI count them:
// `algo_*` counts a token row once per destination node it reaches, this node
// included (flat: once per destination pe), `physical_*` only the crossings to other
// nodes; `link` is what this pe put on its CrossNodeLink, `moved` what the link's
// transport reports it moved during the call.
struct InterNodeBytes {
  uint64_t algo_token = 0;
  uint64_t physical_token = 0;
  uint64_t physical_rows = 0;   // token rows (or partials) sent to other nodes
  uint64_t forwarded_rows = 0;  // rows this pe forwarded as a gateway (V1, V1LL)
  LinkBytes link;
  uint64_t moved = 0;
};

class InterNodeCpu {
 public:
  // Collective over the heap's pes: zeroes this pe's signal words, then a heap
  // barrier. `local_size`: pes per node (the caller's min(gpu_per_node, local group)).
  // `use_proxy`: the inter-node leg through mori-core's proxy (ProxyLink; the first
  // op of the process builds the proxy), else HeapCopyLink (every pe load/store
  // reachable).
  InterNodeCpu(const EpShape& shape, void* block, std::chrono::milliseconds timeout,
               InterNodeKind kind, int local_size, bool use_proxy);

  int64_t Dispatch(const DispatchArgs& args);
  [[noreturn]] void RejectDispatch(const std::string& reason);
  // By the last dispatch's routing or args.routing's (a routing handle's snapshot:
  // src_pos, token_ranks, total_recv, num_tokens and epochs are read; combined in the
  // order of the dispatches, once each, as IntraNode).
  void Combine(const CombineArgs& args);
  [[noreturn]] void RejectCombine(const std::string& reason,
                                  const RoutingSnapshot* routing = nullptr);

  const InterNodeLayout& layout() const { return layout_; }
  const NodeMap& nodes() const { return nodes_; }
  InterNodeKind kind() const { return kind_; }
  const char* link_name() const { return link_->name(); }
  int64_t total_recv() const { return total_recv_; }
  int64_t num_tokens() const { return num_tokens_; }
  uint64_t epoch() const { return epoch_; }
  bool combine_pending() const { return order_.Pending(epoch_); }
  uint64_t combined_epoch() const { return order_.combined_epoch(); }
  const InterNodeBytes& dispatch_bytes() const { return dispatch_bytes_; }
  const InterNodeBytes& combine_bytes() const { return combine_bytes_; }
  // The inter-node leg of the last dispatch (or combine) alone: collective; replays the
  // writes and signals this pe put on its link in that call (same peers, offsets and
  // sizes, in the same order; payload from a scratch buffer of their total size, signals
  // with the values they set, so no word changes), from a heap barrier to Quiet and a
  // second barrier (everything landed everywhere). Returns its wall-clock seconds. The
  // op's buffers that the writes reach hold scratch bytes afterwards: call it between a
  // combine and the next dispatch (a benchmark's tool).
  double ReplayLink(bool combine);

 private:
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(block_ + offset);
  }
  bool SameNode(int pe) const { return nodes_.NodeOf(pe) == nodes_.NodeOf(shape_.rank); }
  // Copies into pe's block at `offset`: through the heap on this node, else the link.
  void Put(int pe, size_t offset, const void* src, size_t bytes, LinkPayload what,
           InterNodeBytes& count);
  void PutSignal(int pe, size_t offset, uint64_t value, InterNodeBytes& count);
  // Waits for this pe's word at `offset` >= floor, posted by `peer`; a timeout names
  // this rank, the peer, the peer's node and the stage.
  uint64_t Wait(size_t offset, uint64_t floor, int peer, const PeerStage& at) const;

  // The count exchange (flat, V1): returns the first rejecting pe or -1.
  void PostCounts(uint64_t epoch, const std::vector<uint64_t>& counts, uint32_t tag);
  int WaitCounts(uint64_t epoch);
  void FinishDispatchEpoch(uint64_t epoch);
  // V1LL: this pe's flags to every pe (its own node directly, the gateways for the
  // rest) with `counts` (kRejectedCount: a rejection); returns the first rejecting pe.
  int DispatchLowLatency(uint64_t epoch, const DispatchArgs& a, const std::vector<uint64_t>& counts,
                         bool rejected);
  // Writes my rows (flat: everywhere; V1: my node) and stages the rest at the gateways.
  void SendRows(uint64_t epoch, const DispatchArgs& a, const std::vector<int64_t>& base_of_me);
  // As a gateway: forwards the rows staged by the pe with my local index on every
  // other node (V1: to their final rows; V1LL: to the fixed slots) and posts flags.
  void ForwardStaged(uint64_t epoch, const std::vector<std::vector<int64_t>>* base);
  // The combine vote: throws on a rejection, a dtype or a weights mismatch (not when
  // `rejected`).
  void Vote(uint64_t epoch, uint32_t tag, bool weights, bool rejected);
  RoutingSnapshot LastRouting() const;

  EpShape shape_;
  NodeMap nodes_;
  InterNodeKind kind_;
  InterNodeLayout layout_;
  char* block_;
  shmem::DeviceContext ctx_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<CrossNodeLink> link_;
  ProxyLink* proxy_link_ = nullptr;  // link_, when it is the proxy
  uint64_t epoch_ = 0;
  int64_t total_recv_ = 0;
  int64_t num_tokens_ = 0;
  CombineOrder order_;
  // V1LL has no count exchange and no done words: a dispatch that follows a dispatch
  // (no combine between, or a rejected call) first exchanges done words for the
  // previous epoch, so no pe's new flags overwrite words a peer has not read.
  bool last_call_dispatch_ = false;
  uint64_t combine_calls_ = 0;  // the call number combine's signal words carry
  InterNodeBytes dispatch_bytes_, combine_bytes_;
  // What Put and PutSignal gave the link in the last dispatch / combine (ReplayLink).
  struct LinkOp {
    int pe;
    size_t offset;
    size_t bytes;  // 0: a signal of `value`
    uint64_t value;
  };
  std::vector<LinkOp> dispatch_link_ops_, combine_link_ops_;
};

}  // namespace mori::ep
