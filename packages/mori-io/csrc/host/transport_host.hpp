// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "control/control_channel.hpp"
#include "control/control_host.hpp"
#include "host/region_grants.hpp"
#include "host/transport.hpp"
#include "registry/backend_select.hpp"

namespace mori::io {

// What a transport sees of the engine that routes to it (nixl's rule: a backend never
// calls the agent): what the control channel sees (ControlHost: key, options, ledger,
// registries, inbound statuses, transfer bookkeeping), the control channel itself, the
// region grants, the transports as their interface (for the events one of them relays
// to all), and the inputs of the backend rule. The engine (IoEngine, in engine/) is
// the one TransportHost; it gets the transports from the factory
// (engine/transport_factory.hpp) and routes requests to them.
class TransportHost : public ControlHost {
 public:
  TransportHost(std::string key, HotPathOptions options, size_t ledger_limit);
  ~TransportHost() override;

  ControlChannel& channel() { return channel_; }
  const ControlChannel& channel() const { return channel_; }
  RegionGrants& grants() { return grants_; }
  const std::string& host_id() const { return host_id_; }

  // The transports, by slot (set once, before any reactor runs).
  void SetTransports(const std::array<Transport*, kTransportSlots>& by_slot) { by_slot_ = by_slot; }
  Transport& transport(TransportSlot slot) const { return *by_slot_[slot]; }
  void ForEachTransport(const std::function<void(Transport&)>& fn);
  // Whether create_backend made the transport in `slot`.
  bool Created(TransportSlot slot) const { return by_slot_[slot]->created(); }
  // The local CMA probe's result, at create_backend(SHM) (the rule's cma_ok).
  void SetCmaProbe(bool ok, std::string reason) {
    cma_ok_ = ok;
    cma_reason_ = std::move(reason);
  }

  void SetBackendOverride(BackendOverride o) { override_.store(o, std::memory_order_relaxed); }
  BackendOverride backend_override() const { return override_.load(std::memory_order_relaxed); }
  // What the route of (peer, local_loc, remote_loc) depends on, for ChooseBackend.
  BackendChoiceInput ChoiceInput(const Peer& peer, MemoryLocationType local_loc,
                                 MemoryLocationType remote_loc) const;

  // A peer of `desc` with each transport's state of it.
  std::shared_ptr<Peer> NewPeer(const PeerDesc& desc);
  // Closes the peer's control connections: their reactors see a hang-up and fail what
  // was pending on them.
  static void ShutDownConnections(Peer& peer);

  // ControlHost's events.
  bool InitiatorAccepted(const std::string& key, const std::string& credential,
                         std::string* why_not) override;
  void ReconnectLater(const std::shared_ptr<Peer>& old, const std::string& why) override;
  bool InitiatorIdleClosable(const std::string& key) override;
  void InboundClosed(const std::string& key) override;
  void ConnectionsScanned() override;

 protected:
  std::string host_id_;

 private:
  ControlChannel channel_;
  RegionGrants grants_;
  std::array<Transport*, kTransportSlots> by_slot_{};
  std::atomic<BackendOverride> override_{BackendOverride::kAuto};
  bool cma_ok_ = false;
  std::string cma_reason_;
};

}  // namespace mori::io
