// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The proxy's ibverbs transport (MORI_PROXY_TRANSPORT=verbs): one RC queue pair per
// pair of pes of different nodes, over an RdmaPort (rdma_port.hpp: a NIC through
// libibverbs, or the loopback test double). It has NOT run against a NIC.
//
//  - The whole symmetric heap is one memory registration (CUDA heaps: the NIC reads
//    and writes GPU memory by GPUDirect, where the driver allows registering it).
//  - PostWrite: RDMA WRITEs from this pe's heap into the peer's (cut at the port's
//    message size); it returns once the last one completed, since the proxy lets the
//    producer reuse the source when PostWrite returns.
//  - PostAtomicAdd / PostFence / PostNotify: a 32-byte record SENT on the same QP,
//    which the peer's proxy thread applies when it polls (adds as real atomics on its
//    heap: a host atomic, or the DeviceLane's kernel for CUDA heaps). An RC QP
//    delivers a SEND after the WRITEs posted before it have been placed, so an add
//    takes effect after every earlier write to that pe: the ordering contract of
//    transport.hpp. RDMA atomics are not used: they are atomic only against other
//    NIC atomics, not against the CPU/GPU atomics that the mapped and TCP paths apply
//    to the same signal words.
//  - Fences are answered with a fence-ack record on the same QP; notifies become
//    kNotify completions at the receiver.
//  - Receives: recv_depth buffers per QP, reposted as they are consumed; a sender
//    that outruns them waits in the NIC (RNR retry without limit). Send-queue slots
//    are freed by signaled completions (every signal_interval-th WR); staging slots
//    for records are indexed by the WR's number, so one is reused only after its WR
//    completed.
//  - Errors: a failed completion (peer gone, access error) or a wait past the timeout
//    throws TransportError naming the peer pe, its node and the stage.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_lane.hpp"
#include "heap_access.hpp"
#include "mori/bootstrap/bootstrap.hpp"
#include "mori/proxy/transport.hpp"
#include "mori/transport/verbs/rdma_port.hpp"

namespace mori::proxy::internal {

struct VerbsOptions {
  int timeout_ms = 120000;        // every wait for a completion or for send-queue room
  uint32_t send_depth = 256;      // WRs per QP in flight; a multiple of signal_interval
  uint32_t recv_depth = 256;      // receive buffers per QP
  uint32_t signal_interval = 16;  // every Nth WR is signaled
  transport::verbs::QpConfig qp;  // timeouts, retries (qp_attributes.hpp)
};

// Exported only so that the C++ unit tests (test_proxy_verbs.cpp) reach it; the header
// is private to libmori_core.
class MORI_API VerbsTransport final : public Transport {
 public:
  // `port` null: this pe could not open one, `open_error` says why; Connect then tells
  // every pe (a collective failure instead of a hang).
  VerbsTransport(const HeapAccess* heap, std::unique_ptr<transport::verbs::RdmaPort> port,
                 std::string open_error, const VerbsOptions& options);
  ~VerbsTransport() override;

  // Collective over `bootstrap` (every pe calls it, in the same order of collectives):
  // registers the heap and the record buffers, creates a QP to each pe with use[pe],
  // all-gathers endpoints and region keys, connects, posts receives, all-gathers the
  // outcome. Throws on every pe when any pe failed to open its port, to set up or to
  // connect, naming that pe and why.
  void Connect(bootstrap::Bootstrap& bootstrap, const std::vector<uint8_t>& use);

  // Completion-queue entries `peers` queue pairs can have outstanding at once: each
  // peer's signaled send WRs (every signal_interval-th of send_depth, a write's last,
  // the shutdown WRITE) and its posted receives. The port must have at least this many.
  static int CqEntriesNeeded(int peers, const VerbsOptions& options);

  const char* Name() const override { return "verbs"; }
  void PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) override;
  void PostAtomicAdd(int pe, uint64_t offset, uint64_t value) override;
  void PostFence(int pe, uint64_t token) override;
  void PostNotify(int pe, uint64_t value) override;
  void Poll(std::vector<Completion>* out) override;
  void Shutdown() override;

  std::string Describe() const;

 private:
  struct Peer;
  struct Record;
  void SendRecord(int pe, uint32_t kind, uint64_t a, uint64_t b);
  // Posts one WR to pe (waiting for room); returns its number.
  uint64_t Post(int pe, transport::verbs::SendOp op, bool signaled);
  void WaitRetired(int pe, uint64_t upto, const char* stage);
  void WaitRoom(int pe);
  // Polls the port once and handles what completed; true when anything did.
  bool Progress();
  void Handle(const transport::verbs::WorkCompletion& wc);
  void Apply(int pe, uint32_t slot, uint32_t byte_len);
  void SendPendingAcks();
  [[noreturn]] void Lost(int pe, const std::string& stage, const std::string& detail) const;

  const HeapAccess* heap_;
  std::unique_ptr<transport::verbs::RdmaPort> port_;
  std::string open_error_;
  VerbsOptions options_;
  std::vector<std::unique_ptr<Peer>> peers_;  // per pe; null when not used
  std::vector<char> records_;                 // per used pe: recv slots, then send slots
  transport::verbs::MemoryKeys heap_keys_{}, record_keys_{};
  uint64_t max_message_ = 0;
  std::vector<Completion> notices_;
  std::vector<std::pair<int, uint64_t>> acks_to_send_;  // (pe, token)
  std::unique_ptr<DeviceLane> lane_;                    // CUDA heaps: inbound adds
  bool shutting_down_ = false;
};

}  // namespace mori::proxy::internal
