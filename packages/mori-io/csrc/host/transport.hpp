// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ledger/transfer_state.hpp"
#include "registry/backend_select.hpp"
#include "registry/memory_registry.hpp"
#include "registry/peer_registry.hpp"
#include "registry/transfer_request.hpp"

namespace mori::io {

// One way of moving bytes between this engine and another (ROCm/mori's Backend). The
// engine asks the transport its rule (ChooseBackend) names for a pair once and caches
// the answer; CanHandle then says whether it serves the pair now (conditions the rule
// cannot see: a probe, a refusal met on use), TCP being asked next.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual BackendType type() const = 0;
  virtual TransportSlot slot() const = 0;
  // Whether create_backend made it (and so whether the rule may name it).
  virtual bool created() const = 0;

  virtual bool CanHandle(const Peer& /*peer*/, MemoryLocationType /*local*/,
                         MemoryLocationType /*remote*/) const {
    return true;
  }
  // Why this transfer cannot be moved by this transport, found before the spans are
  // checked and the peer connected (a finished state), or nullptr.
  virtual std::shared_ptr<TransferState> Precheck(const TransferRequest& /*req*/) {
    return nullptr;
  }
  virtual std::shared_ptr<TransferState> Submit(const TransferRequest& req) = 0;
  // backend_for's answer for a pair routed here (the rule's `choice`), with what only the
  // transport knows (for SHM: which copy moves the region, mapped memcpy or CMA).
  virtual BackendChoice Explain(const std::shared_ptr<Peer>& /*peer*/,
                                const RemoteRegion& /*remote*/, BackendChoice choice) {
    return choice;
  }

  // Peers: the state kept per remote engine (made at registration); the peer's control
  // connections are open but not yet published or served; the peer was registered again
  // or deregistered (its connections are closing).
  virtual std::unique_ptr<PeerState> NewPeerState() { return nullptr; }
  virtual void PeerConnecting(Peer& /*peer*/, PeerConnections& /*pc*/) {}
  virtual void PeerLost(const std::string& /*key*/, const std::string& /*why*/) {}
  // Target side: initiator `key` holds something of this transport (a notice ring, queue
  // pairs) that its connections keep valid, so they are not closed as idle.
  virtual bool KeepsInitiator(const std::string& /*key*/) { return false; }

  // Local regions: registered (under the registry's lock; may throw, refusing it), uses
  // the registry cannot see, withdrawn by deregistration (under the registry's lock).
  virtual void RegionRegistered(const MemoryRegion& /*r*/) {}
  virtual uint64_t RegionInFlight(uint64_t /*id*/) { return 0; }
  virtual void RegionWithdrawn(uint64_t /*id*/) {}
  // A remote region this engine mapped or holds a grant of was revoked by its target:
  // drop it; `released` is held until the last copy using it ended.
  virtual void RemoteRegionRevoked(Peer& /*peer*/, uint64_t /*mem_id*/,
                                   const std::shared_ptr<void>& /*released*/) {}

  // The control channel's reactors are about to start; the first one's thread started
  // (`starting`) or is about to end; they were all stopped and joined.
  virtual void ChannelStarting() {}
  virtual void OnControlThread(bool /*starting*/) {}
  virtual void ChannelStopped() {}

  // Inbound announcements kept outside the inbound statuses (from `key`, or all when
  // null) are recorded there now.
  virtual void DrainInbound(const std::string* /*key*/) {}
  // The engine shuts down: finish what is in flight while the ledger and connections
  // still exist.
  virtual void Shutdown() {}
};

}  // namespace mori::io
