// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The engine-facing RDMA backend. It owns one NIC port (chosen from the topology or
// named), the memory registrations of the engine's regions, a set of RC QPs per remote
// engine, and the CQ poll threads; the engine wires it to its registry and TCP control
// connection. This header needs no ibverbs header: without them the backend is
// compiled out and Create throws NotSupportedError("built without ibverbs headers").
//
// Engine hooks (what RdmaTransport calls for the engine), in order of use:
//   1. create_backend(RDMA, config): RdmaBackend::Create(config). NotSupportedError
//      carries the reason (no libibverbs, no device, no ACTIVE port, ...).
//   2. RegisterMemory: key = RegisterRegion(mem_id, addr, size); the encoded region key
//      (EncodeRegionKey) travels to peers with the region's MemoryDesc (or answers a
//      control request for it). DeregisterMemory: DeregisterRegion(mem_id) once the
//      engine's own use count allows it (it refuses while the backend has transfers
//      from or into the region in flight: InFlight(mem_id)).
//   3. Connecting to a peer (initiator, the side that calls read/write):
//        request = OpenInitiator(peer_key)            -> control message RdmaConnect
//        reply   = AcceptInitiator(initiator_key, request)  (at the target)
//                                                     -> control message RdmaConnectAck
//        CompleteInitiator(peer_key, reply)           (at the initiator)
//      Both payloads are EncodeEndpoints blobs of qp_per_transfer endpoints.
//   4. Transfers: Submit(op, local mem_id, peer_key, remote RegionKey, spans, uid, done);
//      `done` runs once, on a poll thread, with SUCCESS or the failure.
//   5. Inbound notifications: SetInboundHandler(fn): fn(peer_key, uid24, parts, read)
//      per WRITE_WITH_IMM received; the engine counts `parts` per (peer, uid24) and
//      completes its inbound status, matching a popped uid by uid & kImmUidMask.
//   6. DeregisterRemoteEngine / peer failure: DisconnectPeer(peer_key) fails that
//      peer's outstanding transfers and destroys its QPs (both roles).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ledger/transfer_state.hpp"
#include "mori/transport/verbs/endpoint_codec.hpp"
#include "mori/transport/verbs/qp_attributes.hpp"
#include "mori/transport/verbs/work_request_plan.hpp"

namespace mori::io::rdma {

// The verbs layer (QP attributes, plans, encodings, NIC/GID choice, the dlopen of
// libibverbs, device/MR/QP objects) lives in mori-core, shared with the proxy's verbs
// transport; the backend names it as its own.
using namespace mori::transport::verbs;  // NOLINT(google-build-using-namespace)

enum class PollCqMode : int { kPolling = 0, kEvent = 1 };

struct RdmaBackendConfig {
  int qp_per_transfer = 1;     // RC QPs per remote engine a transfer is spread over (1..127)
  int post_batch_size = -1;    // WRs per ibv_post_send; -1: min(32, max_send_wr)
  int num_worker_threads = 1;  // CQs, each with its poll thread (QPs round-robin), 1..64
  PollCqMode poll_cq_mode = PollCqMode::kPolling;
  bool enable_notification = true;  // WRITE_WITH_IMM at the end of each QP's part
  std::string device_name;          // "" = nearest to gpu_index; "mlx5_0" or "mlx5_0:1"
  int port = 0;                     // 0 = any ACTIVE port of the device
  int gid_index = -1;               // -1 = automatic (RoCE v2 IPv4-mapped first)
  int gpu_index = -1;               // locality hint for the automatic NIC choice
  QpConfig qp;                      // timeout, retry_cnt, rnr_retry, ... (qp_attributes.hpp)
  int max_send_wr = 1024;           // send-queue depth per QP
  int max_recv_wr = 1024;           // receives kept posted per QP (MORI's notif_per_qp)
  int max_sge = 0;                  // SGEs per WR; 0 = min(device, 16)
  uint64_t max_message_bytes = 0;   // bytes per WR; 0 = min(port max_msg_sz, 1 GiB)
  int signal_interval = 16;         // signal every Nth WR (and each batch's last)
  int cq_depth = 4096;
};

// Throws InvalidArgumentError naming the first bad field and its value.
void ValidateRdmaBackendConfig(const RdmaBackendConfig& config);
int EffectivePostBatchSize(const RdmaBackendConfig& config);
// DeregisterRegion's refusal while `busy` transfers still use memory `mem_id`.
void CheckRegionIdle(uint64_t mem_id, uint64_t busy);

struct RdmaProbe {
  bool available = false;
  std::string reason;
  std::vector<std::string> devices;  // names libibverbs lists
};

// Whether the backend can run here: built with the headers, libibverbs (or
// MORI_IO_IBVERBS_LIB) loads with every symbol, and it lists a device. Never throws.
RdmaProbe ProbeRdma();

enum class RdmaOp { kRead, kWrite };

using RdmaCompletion = std::function<void(StatusDetail code, const std::string& message)>;
using RdmaInboundHandler =
    std::function<void(const std::string& peer_key, uint32_t uid24, uint32_t parts, bool read)>;

class RdmaBackend {
 public:
  // Opens the chosen port; throws NotSupportedError with the reason when RDMA cannot
  // run here, InvalidArgumentError for a bad config, NotFoundError for a named device
  // that does not exist.
  static std::unique_ptr<RdmaBackend> Create(const RdmaBackendConfig& config);
  virtual ~RdmaBackend() = default;

  virtual std::string Describe() const = 0;

  // Registers [addr, addr+size) as `mem_id`; returns its EncodeRegionKey blob.
  virtual std::string RegisterRegion(uint64_t mem_id, uintptr_t addr, uint64_t size) = 0;
  virtual void DeregisterRegion(uint64_t mem_id) = 0;
  // Transfers in flight from or into the region.
  virtual uint64_t InFlight(uint64_t mem_id) const = 0;

  virtual std::string OpenInitiator(const std::string& peer_key) = 0;
  virtual std::string AcceptInitiator(const std::string& peer_key, const std::string& request) = 0;
  virtual void CompleteInitiator(const std::string& peer_key, const std::string& reply) = 0;
  virtual bool PeerReady(const std::string& peer_key) const = 0;
  virtual void DisconnectPeer(const std::string& peer_key, const std::string& reason) = 0;

  // Spans are offsets into the local region `local_mem` and the remote region `remote`.
  // Throws (before any WR is posted) for an unknown region or peer or a bad span;
  // otherwise `done` runs exactly once.
  virtual void Submit(RdmaOp op, uint64_t local_mem, const std::string& peer_key,
                      const RegionKey& remote, const PlanSpan* spans, size_t n, uint64_t uid,
                      RdmaCompletion done) = 0;
  virtual void SetInboundHandler(RdmaInboundHandler handler) = 0;
};

#if MORI_IO_TESTING
// Test builds only (MORI_IO_TESTING=ON): Create asks `factory` first and opens a NIC
// only when it returns nullptr. csrc/testing/ installs the loopback double here.
using RdmaBackendFactory = std::unique_ptr<RdmaBackend> (*)(const RdmaBackendConfig& config);
void SetRdmaBackendFactoryForTesting(RdmaBackendFactory factory);
#endif

}  // namespace mori::io::rdma
