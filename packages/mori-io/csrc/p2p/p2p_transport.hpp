// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "host/transport.hpp"
#include "p2p/p2p_backend.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class SameHost;
class TransportHost;

// Same host, GPU memory on both sides (CUDA IPC): the target exports a region once per
// initiator (kP2pOpenReq on a short-lived connection), the initiator maps it and its GPU
// copies with no message per transfer; writes are announced afterwards (ShmTransport's
// AnnounceWrite), exports revoked through RegionGrants on deregistration.
class P2pTransport : public Transport {
 public:
  P2pTransport(TransportHost* host, SameHost* same_host);
  BackendType type() const override { return BackendType::kP2P; }
  TransportSlot slot() const override { return kP2pSlot; }
  bool created() const override { return backend_ != nullptr; }
  void Adopt(std::unique_ptr<P2pBackend> backend) { backend_ = std::move(backend); }

  std::shared_ptr<TransferState> Submit(const TransferRequest& req) override;
  std::unique_ptr<PeerState> NewPeerState() override;
  void RegionWithdrawn(uint64_t id) override;
  void RemoteRegionRevoked(Peer& peer, uint64_t mem_id,
                           const std::shared_ptr<void>& released) override;
  // Finishes every copy in flight while the ledger and connections still exist.
  void Shutdown() override { backend_.reset(); }

  // Test hook: how remote region `mem_id` of `remote_key` is mapped here: -1 not (yet),
  // 0 directly (same process), else the P2pExport::Kind it was imported from.
  int MappingKind(const std::string& remote_key, uint64_t mem_id);

 private:
  // Its GPU regions mapped here, by (its memory id, the local GPU copying); opened on
  // first use by each local GPU.
  struct PeerP2p : PeerState {
    std::mutex mu;
    std::map<std::pair<uint64_t, int>, std::shared_ptr<P2pMapping>> maps;
  };
  // Target side of kP2pOpenReq: the packed export of registered GPU region `mem_id` into
  // *payload, or a refusal (with its text in *payload).
  wire::WireStatus Grant(uint64_t mem_id, uint64_t capability, const std::string& initiator_key,
                         std::string* payload);
  // The mapping of the peer's region `mem_id` for copies by `device`, asking the peer for
  // its export on first use; nullptr with *code/*error set if refused or failed.
  std::shared_ptr<P2pMapping> MappingFor(Peer& peer, const RemoteRegion& remote, int device,
                                         StatusDetail* code, std::string* error);

  TransportHost* host_;
  SameHost* same_host_;  // announces writes (notice rings, shared with SHM)
  std::unique_ptr<P2pBackend> backend_;
};

}  // namespace mori::io
