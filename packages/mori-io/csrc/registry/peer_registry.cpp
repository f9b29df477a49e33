// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "registry/peer_registry.hpp"

namespace mori::io {

void Peer::MarkFailed(const std::string& reason) {
  std::lock_guard<std::mutex> lock(fail_mu);
  if (failed.load(std::memory_order_relaxed)) return;
  fail_reason = reason;
  failed.store(true, std::memory_order_release);
}

std::string Peer::FailReason() {
  std::lock_guard<std::mutex> lock(fail_mu);
  return fail_reason;
}

std::shared_ptr<Peer> PeerRegistry::Put(std::shared_ptr<Peer> peer) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  peer->generation = next_generation_++;
  auto& slot = peers_[peer->key];
  std::shared_ptr<Peer> old = std::move(slot);
  slot = std::move(peer);
  return old;
}

bool PeerRegistry::Replace(const std::shared_ptr<Peer>& old, std::shared_ptr<Peer> fresh) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = peers_.find(old->key);
  if (it == peers_.end() || it->second != old) return false;
  fresh->generation = next_generation_++;
  it->second = std::move(fresh);
  return true;
}

std::shared_ptr<Peer> PeerRegistry::Take(const std::string& key) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = peers_.find(key);
  if (it == peers_.end()) return nullptr;
  std::shared_ptr<Peer> old = std::move(it->second);
  peers_.erase(it);
  return old;
}

std::shared_ptr<Peer> PeerRegistry::Find(const std::string& key) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = peers_.find(key);
  return it == peers_.end() ? nullptr : it->second;
}

}  // namespace mori::io
