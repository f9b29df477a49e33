// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The proxy's same-host transports. A write has landed before anything posted after
// it over the pair's TCP stream (adds, fences, notifies) takes effect, so the ordering
// contract holds across the two.
//   MappedTransport: the pe's heap is mapped here (shmem's local group): copies and
//     real atomics through the mapping; fences complete at once. CUDA heaps: through
//     the proxy thread's DeviceLane, shared with the TCP sender (one non-blocking
//     stream, device_lane.hpp): writes, the adds behind them and the TCP sender's
//     staging copies run in posting order; a round with a copy is waited for once in
//     Poll (adds alone retire without a wait), and every fence, notify and barrier
//     (Settle) waits.
//   Host heaps complete a write before PostWrite returns.
//   CmaTransport: another local group on this host (emulated nodes), host heaps:
//     writes with process_vm_writev into the peer's heap; adds, fences and notifies
//     over the TCP stream, applied by the peer's receiver as real atomics.

#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "device_lane.hpp"
#include "heap_access.hpp"
#include "mori/proxy/transport.hpp"
#include "tcp_transport.hpp"

namespace mori::proxy::internal {

class MappedTransport final : public Transport {
 public:
  MappedTransport(const HeapAccess* heap, TcpTransport* control);
  const char* Name() const override { return "mapped"; }
  void PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) override;
  void PostAtomicAdd(int pe, uint64_t offset, uint64_t value) override;
  void PostFence(int pe, uint64_t token) override;
  void PostNotify(int pe, uint64_t value) override;
  void Poll(std::vector<Completion>* out) override;
  void Shutdown() override {}
  // CUDA heaps: waits until every write and add posted so far has landed (a barrier
  // covers the adds a pe posted to itself, which no notify passes through).
  void Settle() {
    if (lane_) lane_->Sync();
  }

 private:
  const HeapAccess* heap_;
  TcpTransport* control_;
  std::vector<char*> bases_;  // per pe: its heap mapped here, or nullptr
  std::vector<Completion> acks_;
  DeviceLane* lane_ = nullptr;  // CUDA heaps: control_->sender_lane()
};

class CmaTransport final : public Transport {
 public:
  CmaTransport(const HeapAccess* heap, TcpTransport* control);
  // Whether this process may write into pe's heap with process_vm_writev (a harmless
  // process_vm_readv of its first word); *why says why not.
  static bool Probe(const HeapAccess& heap, int pe, std::string* why);
  const char* Name() const override { return "cma"; }
  void PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) override;
  void PostAtomicAdd(int pe, uint64_t offset, uint64_t value) override;
  void PostFence(int pe, uint64_t token) override;
  void PostNotify(int pe, uint64_t value) override;
  void Poll(std::vector<Completion>* out) override {}
  void Shutdown() override {}

 private:
  const HeapAccess* heap_;
  TcpTransport* control_;
};

}  // namespace mori::proxy::internal
