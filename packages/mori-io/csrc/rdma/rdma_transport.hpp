// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "host/transport.hpp"
#include "rdma/rdma_backend.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class TransportHost;

// One-sided verbs between engines with an RDMA NIC each (rdma_backend.hpp; never run on
// a NIC here): the QPs are connected and each remote region's key fetched with one
// request/answer on a short-lived control connection (kRdmaConnect, kRdmaRegionReq);
// completed inbound transfers are announced by WRITE_WITH_IMM.
class RdmaTransport : public Transport {
 public:
  explicit RdmaTransport(TransportHost* host);
  BackendType type() const override { return BackendType::kRdma; }
  TransportSlot slot() const override { return kRdmaSlot; }
  bool created() const override { return backend_ != nullptr; }
  // Registers every region already registered (no region is registered meanwhile).
  void Adopt(std::unique_ptr<rdma::RdmaBackend> backend);

  std::shared_ptr<TransferState> Submit(const TransferRequest& req) override;
  std::unique_ptr<PeerState> NewPeerState() override;
  void PeerLost(const std::string& key, const std::string& why) override;
  // Queue pairs are not tracked per initiator here: with RDMA created, none is idle.
  bool KeepsInitiator(const std::string& /*key*/) override { return backend_ != nullptr; }
  void RegionRegistered(const MemoryRegion& r) override;
  uint64_t RegionInFlight(uint64_t id) override;
  void RegionWithdrawn(uint64_t id) override;

 private:
  // QPs connected, and the keys of its regions used so far (under mu).
  struct PeerRdma : PeerState {
    std::mutex mu;
    bool connected = false;
    std::unordered_map<uint64_t, rdma::RegionKey> keys;
  };
  // Target side of kRdmaConnect / kRdmaRegionReq: the answer payload, or a refusal with
  // its text in *answer.
  wire::WireStatus Accept(const std::string& initiator_key, const std::string& request,
                          std::string* answer);
  wire::WireStatus RegionKey(uint64_t mem_id, uint64_t capability, std::string* answer);

  TransportHost* host_;
  std::unique_ptr<rdma::RdmaBackend> backend_;
  std::mutex keys_mu_;
  std::unordered_map<uint64_t, std::string> keys_;  // local region id -> its key blob
};

}  // namespace mori::io
