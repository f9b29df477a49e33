// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "host/region_grants.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "control/control_handlers.hpp"
#include "control/reactor.hpp"
#include "host/transport_host.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

void RegionGrants::RegisterHandlers(ControlHandlers& handlers) {
  handlers.OnRequest(wire::MsgType::kP2pRevokeAck, [this](Reactor&, Conn& c, std::string*) {
    OnRevokeAck(c.remote_key, c.cur.mem_id);
    return true;  // not answered
  });
  // The target's request to let go of a mapping or grant (answers nothing): every
  // transport drops what it holds of the region, and the acknowledgement leaves once
  // the last copy using any of it ended (here if none is in flight).
  handlers.OnNotice(wire::MsgType::kP2pRevoke, [this](Reactor& r, Conn& c, std::string*) {
    const uint64_t mem_id = c.cur.mem_id;
    std::weak_ptr<Conn> conn = r.SharedOf(c);
    auto released = std::shared_ptr<void>(nullptr, [conn, mem_id](void*) {
      if (std::shared_ptr<Conn> live = conn.lock()) {
        PostOnConn(*live, wire::MakeHeader(wire::MsgType::kP2pRevokeAck, mem_id), nullptr);
      }
    });
    if (std::shared_ptr<Peer> peer = host_->FindPeer(c.remote_key)) {
      host_->ForEachTransport(
          [&](Transport& t) { t.RemoteRegionRevoked(*peer, mem_id, released); });
    }
    return true;
  });
}

namespace {

// Up to three keys, quoted, and how many more: a log line about many holders stays short.
std::string SomeKeys(const std::vector<std::string>& keys) {
  std::string names;
  for (size_t i = 0; i < keys.size() && i < 3; ++i) {
    names += (i == 0 ? "" : ", ") + LogSafe(keys[i]);
  }
  if (keys.size() > 3) names += StrCat(" and ", keys.size() - 3, " more");
  return names;
}

}  // namespace

bool RegionGrants::Record(uint64_t mem_id, const std::string& initiator_key, bool* added) {
  std::lock_guard<std::mutex> lock(mu_);
  if (added != nullptr) *added = false;
  auto it = holders_.find(initiator_key);
  if (it != holders_.end()) {
    // It asked on a connection that is open now: whatever marked it gone is past.
    SetGoneLocked(it->second, 0);
    auto& regions = it->second.regions;
    if (std::find(regions.begin(), regions.end(), mem_id) != regions.end()) return true;
  }
  if (grants_ >= max_grants_ || (it == holders_.end() && holders_.size() >= max_holders_)) {
    ++refused_;
    return false;
  }
  if (it == holders_.end()) it = holders_.try_emplace(initiator_key).first;
  it->second.regions.push_back(mem_id);
  ++holders_of_[mem_id];
  ++grants_;
  if (added != nullptr) *added = true;
  return true;
}

bool RegionGrants::Has(uint64_t mem_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return holders_of_.count(mem_id) != 0;
}

bool RegionGrants::HoldsAny(const std::string& initiator_key) {
  std::lock_guard<std::mutex> lock(mu_);
  return holders_.count(initiator_key) != 0;
}

size_t RegionGrants::DropUngranted(const std::string& initiator_key,
                                   std::vector<InboundPart>* parts) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holders_.find(initiator_key);
  auto held = [&](const InboundPart& p) {
    if (it == holders_.end()) return false;
    const auto& regions = it->second.regions;
    return std::find(regions.begin(), regions.end(), p.mem_id) != regions.end();
  };
  const size_t before = parts->size();
  parts->erase(
      std::remove_if(parts->begin(), parts->end(), [&](const auto& p) { return !held(p); }),
      parts->end());
  return before - parts->size();
}

void RegionGrants::SetGoneLocked(Holder& h, int64_t since_ns) {
  if (h.gone_since_ns == 0 && since_ns != 0) gone_.fetch_add(1, std::memory_order_relaxed);
  if (h.gone_since_ns != 0 && since_ns == 0) gone_.fetch_sub(1, std::memory_order_relaxed);
  h.gone_since_ns = since_ns;
}

void RegionGrants::EraseLocked(Holders::iterator it, uint64_t mem_id) {
  auto& regions = it->second.regions;
  auto r = std::find(regions.begin(), regions.end(), mem_id);
  if (r == regions.end()) return;
  regions.erase(r);
  --grants_;
  auto n = holders_of_.find(mem_id);
  if (n != holders_of_.end() && --n->second == 0) holders_of_.erase(n);
  if (!regions.empty()) return;
  SetGoneLocked(it->second, 0);
  holders_.erase(it);
}

void RegionGrants::Forget(uint64_t mem_id, const std::string& initiator_key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holders_.find(initiator_key);
  if (it != holders_.end()) EraseLocked(it, mem_id);
}

void RegionGrants::ConnectionClosed(const std::string& initiator_key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool revoking = std::any_of(revoking_.begin(), revoking_.end(),
                                      [&](const auto& r) { return r.first == initiator_key; });
    if (!revoking && holders_.count(initiator_key) == 0) return;
  }
  if (host_->channel().LiveInbound(initiator_key)) return;
  const int64_t now = NowNs();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holders_.find(initiator_key);
  if (it != holders_.end()) SetGoneLocked(it->second, now);
  const size_t before = revoking_.size();
  revoking_.erase(std::remove_if(revoking_.begin(), revoking_.end(),
                                 [&](const auto& r) { return r.first == initiator_key; }),
                  revoking_.end());
  if (revoking_.size() != before) cv_.notify_all();
}

void RegionGrants::DropGone() {
  if (gone_.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::pair<std::string, int64_t>> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, h] : holders_) {
      if (h.gone_since_ns != 0 && host_->channel().HellosSettledSince(h.gone_since_ns)) {
        due.emplace_back(key, h.gone_since_ns);
      }
    }
  }
  size_t holders = 0;
  size_t dropped = 0;
  for (const auto& [key, since] : due) {
    const bool live = host_->channel().LiveInbound(key) != nullptr;
    // Announcements it made under its grants (a notice ring) count before they go.
    if (!live) host_->ForEachTransport([&](Transport& t) { t.DrainInbound(&key); });
    std::lock_guard<std::mutex> lock(mu_);
    auto it = holders_.find(key);
    if (it == holders_.end() || it->second.gone_since_ns != since) continue;  // changed
    if (live) {
      SetGoneLocked(it->second, 0);  // connected again
      continue;
    }
    // The holder and all its grants in one pass (EraseLocked per region would be
    // quadratic in a holder's grants, under mu_, on a reactor thread).
    const std::vector<uint64_t>& regions = it->second.regions;
    for (uint64_t id : regions) {
      auto n = holders_of_.find(id);
      if (n != holders_of_.end() && --n->second == 0) holders_of_.erase(n);
    }
    grants_ -= regions.size();
    dropped_ += regions.size();
    dropped += regions.size();
    SetGoneLocked(it->second, 0);
    holders_.erase(it);
    ++holders;
  }
  if (holders > 0) {
    MORI_LOG_DEBUG(kIo, "engine '", host_->key(), "': dropped ", dropped, " grant(s) of ", holders,
                   " initiator(s) with no connection left");
  }
}

RegionGrants::Stats RegionGrants::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.holders = holders_.size();
  s.grants = grants_;
  s.refused = refused_;
  s.dropped = dropped_;
  return s;
}

// A grant of `mem_id` to `initiator_key`, for map and CMA grants: the region is checked,
// the grant recorded, and the region checked again. A deregistration sets `withdrawn`
// and then looks for records (under mu_); so either it finds this record and revokes
// the grant, or the second check sees the withdrawal and the grant is refused.
// Refused requests leave no record (a peer asking for many ids costs no memory).
wire::WireStatus RegionGrants::RecordChecked(uint64_t mem_id, uint64_t capability,
                                             const std::string& initiator_key, MemoryRegion* r,
                                             bool* added) {
  *added = false;
  MemoryRegistry& memory = host_->memory();
  if (!memory.FindNamed(mem_id, capability, r) ||
      r->use->withdrawn.load(std::memory_order_seq_cst)) {
    return wire::WireStatus::kUnknownMemory;
  }
  if (r->loc != MemoryLocationType::CPU) return wire::WireStatus::kNotHostMemory;
  if (!Record(mem_id, initiator_key, added)) return wire::WireStatus::kTooManyGrants;
  MemoryRegion again;
  if (!memory.Find(mem_id, &again)) {
    if (*added) Forget(mem_id, initiator_key);  // deregistered already: no revoke will come
    *added = false;
    return wire::WireStatus::kUnknownMemory;
  }
  // Withdrawn: the deregistration in progress revokes the record (and drops it).
  if (again.use->withdrawn.load(std::memory_order_seq_cst)) return wire::WireStatus::kUnknownMemory;
  return wire::WireStatus::kOk;
}

void RegionGrants::Revoke(uint64_t id) {
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (holders_of_.count(id) == 0) return;
    for (const auto& [key, h] : holders_) {
      if (std::find(h.regions.begin(), h.regions.end(), id) != h.regions.end()) {
        keys.push_back(key);
      }
    }
  }
  std::vector<std::string> unreachable;
  for (const std::string& key : keys) {
    // Recorded before the liveness check: a connection that closes after it finds the
    // record (ConnectionClosed clears it), one closed before it fails the check. The
    // other order let a close in between leave a record nobody clears, and this
    // deregistration waited out the transfer timeout for an acknowledgement.
    {
      std::lock_guard<std::mutex> lock(mu_);
      revoking_.emplace_back(key, id);
    }
    std::shared_ptr<Conn> conn = host_->channel().LiveInbound(key);
    if (!conn) {
      // No connection from it is left: its engine is gone or disconnected, and its
      // transfers to us have failed; a process that died holds no mapping.
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find(revoking_.begin(), revoking_.end(), std::make_pair(key, id));
      if (it != revoking_.end()) revoking_.erase(it);
      unreachable.push_back(key);
      continue;
    }
    PostOnConn(*conn, wire::MakeHeader(wire::MsgType::kP2pRevoke, id), nullptr);
  }
  if (!unreachable.empty()) {  // one line however many (DropGone drops them soon anyway)
    MORI_LOG_WARN(
        kIo, "engine '", host_->key(), "': deregistering memory ", id, ": ", unreachable.size(),
        " initiator(s) holding a grant of it (P2P, shared-memory ",
        "map or CMA) have no connection left to be asked to let go of it: ", SomeKeys(unreachable));
  }
  std::unique_lock<std::mutex> lock(mu_);
  auto pending = [&] {
    return std::any_of(revoking_.begin(), revoking_.end(),
                       [&](const auto& r) { return r.second == id; });
  };
  const int timeout_ms = host_->tcp_config().transfer_timeout_ms;
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !pending(); })) {
    // A holder that does not confirm is cut off: its connections are closed (its
    // transfers to us fail, it is a lost peer until it registers us again) and its grant
    // of this region is dropped, so it cannot make every deregistration wait. This call
    // still raises, naming it, because a copy it may yet make under the grant is not
    // stopped by closing its connections; the next deregister_memory completes.
    std::vector<std::string> late;
    for (auto it = revoking_.begin(); it != revoking_.end();) {
      if (it->second == id) {
        late.push_back(it->first);
        it = revoking_.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::string& key : late) {
      auto held = holders_.find(key);
      if (held != holders_.end()) EraseLocked(held, id);
    }
    lock.unlock();
    for (const std::string& key : late) host_->channel().CutOff(key);
    const std::string names = SomeKeys(late);
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': deregistering memory ", id, ": ", names,
                  " did not confirm letting go of it within ", timeout_ms,
                  " ms; its connections were closed and its grant dropped");
    MORI_THROW(TimeoutError, "deregister_memory: memory ", id, " of engine '", host_->key(),
               "' is still held (a P2P or shared-memory mapping, or a CMA grant) by ", names,
               ", which did not confirm letting go of it within ", timeout_ms,
               " ms; it stays registered for now, that holder's connections were closed and "
               "its grant dropped, and deregister_memory again completes");
  }
  // Every holder let go (or has no connection left): the region's grants go.
  for (auto it = holders_.begin(); it != holders_.end();) {
    auto next = std::next(it);
    EraseLocked(it, id);
    it = next;
  }
}

void RegionGrants::OnRevokeAck(const std::string& initiator_key, uint64_t mem_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(revoking_.begin(), revoking_.end(),
                      std::pair<std::string, uint64_t>(initiator_key, mem_id));
  if (it == revoking_.end()) return;  // late (after a timeout) or unasked
  revoking_.erase(it);
  cv_.notify_all();
}

}  // namespace mori::io
