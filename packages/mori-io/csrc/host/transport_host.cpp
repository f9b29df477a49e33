// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "host/transport_host.hpp"

#include <sys/socket.h>

#include "control/connection.hpp"
#include "mori/core/logging.hpp"
#include "wire/secret.hpp"

namespace mori::io {

TransportHost::TransportHost(std::string key, HotPathOptions options, size_t ledger_limit)
    : ControlHost(std::move(key), options, ledger_limit), channel_(this), grants_(this) {
  host_id_ = LocalHostIdentity();
}

TransportHost::~TransportHost() = default;

std::shared_ptr<Peer> TransportHost::NewPeer(const PeerDesc& desc) {
  auto peer = std::make_shared<Peer>();
  static_cast<PeerDesc&>(*peer) = desc;
  ForEachTransport([&](Transport& t) { peer->state[t.slot()] = t.NewPeerState(); });
  return peer;
}

void TransportHost::ShutDownConnections(Peer& peer) {
  if (PeerConnections* pc = peer.published.load(std::memory_order_acquire)) {
    for (auto& c : pc->conns) {
      std::lock_guard<std::mutex> lock(c->mu);
      if (!c->dead) ::shutdown(c->fd, SHUT_RDWR);
    }
  }
}

void TransportHost::ForEachTransport(const std::function<void(Transport&)>& fn) {
  for (Transport* t : by_slot_) {
    if (t != nullptr) fn(*t);
  }
}

BackendChoiceInput TransportHost::ChoiceInput(const Peer& peer, MemoryLocationType local_loc,
                                              MemoryLocationType remote_loc) const {
  BackendChoiceInput in;
  in.local_host_id = host_id_;
  in.remote_host_id = peer.host_id;
  in.local_loc = local_loc;
  in.remote_loc = remote_loc;
  in.local_shm = Created(kShmSlot);
  in.remote_shm = peer.remote_shm && peer.pid > 0;
  in.local_p2p = Created(kP2pSlot);
  in.remote_p2p = peer.remote_p2p;
  in.local_rdma = Created(kRdmaSlot);
  in.remote_rdma = peer.remote_rdma;
  in.cma_ok = cma_ok_;
  in.cma_reason = cma_reason_;
  in.override_choice = backend_override();
  return in;
}

void TransportHost::ReconnectLater(const std::shared_ptr<Peer>& old, const std::string& why) {
  std::shared_ptr<Peer> fresh = NewPeer(*old);
  if (!peers_.Replace(old, fresh)) return;  // registered again or deregistered meanwhile
  old->MarkFailed(why);
  ForEachTransport([&](Transport& t) { t.PeerLost(old->key, why); });
  ShutDownConnections(*old);
}

void TransportHost::InboundClosed(const std::string& key) { grants_.ConnectionClosed(key); }

bool TransportHost::InitiatorIdleClosable(const std::string& key) {
  if (grants_.HoldsAny(key)) return false;
  bool closable = true;
  ForEachTransport([&](Transport& t) { closable = closable && !t.KeepsInitiator(key); });
  return closable;
}

bool TransportHost::InitiatorAccepted(const std::string& key, const std::string& credential,
                                      std::string* why_not) {
  std::shared_ptr<Peer> peer = FindPeer(key);
  if (peer && !peer->secret.empty()) {
    // Registered here: its EngineDesc's secret is known, so its hellos must prove it.
    std::string expected = InitiatorCredential(peer->secret, secret_, key);
    if (SecretEqual(expected, credential.data(), credential.size())) return true;
    *why_not = credential.empty() ? "no credential, and that engine is registered here"
                                  : "its credential is not that of the registered EngineDesc";
    return false;
  }
  // Not registered (MORI's flows need not register the reading side): the first
  // connection of the key binds its credential while any of its connections is open.
  if (channel_.CredentialConflicts(key, credential)) {
    *why_not = "another credential than that of its connections already open here";
    return false;
  }
  return true;
}

void TransportHost::ConnectionsScanned() { grants_.DropGone(); }

}  // namespace mori::io
