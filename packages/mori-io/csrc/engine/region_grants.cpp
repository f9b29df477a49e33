// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/region_grants.hpp"

#include <algorithm>
#include <chrono>
#include <memory>

#include "engine/io_engine.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "tcp/control_handlers.hpp"
#include "tcp/reactor.hpp"
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
    if (std::shared_ptr<Peer> peer = engine_->FindPeer(c.remote_key)) {
      engine_->ForEachTransport(
          [&](Transport& t) { t.RemoteRegionRevoked(*peer, mem_id, released); });
    }
    return true;
  });
}

void RegionGrants::Record(uint64_t mem_id, const std::string& initiator_key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& keys = granted_[mem_id];
  if (std::find(keys.begin(), keys.end(), initiator_key) == keys.end()) {
    keys.push_back(initiator_key);
  }
}

bool RegionGrants::Has(uint64_t mem_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return granted_.count(mem_id) != 0;
}

bool RegionGrants::HoldsAny(const std::string& initiator_key) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, keys] : granted_) {
    if (std::find(keys.begin(), keys.end(), initiator_key) != keys.end()) return true;
  }
  return false;
}

size_t RegionGrants::DropUngranted(const std::string& initiator_key,
                                   std::vector<InboundPart>* parts) {
  std::lock_guard<std::mutex> lock(mu_);
  auto held = [&](const InboundPart& p) {
    auto it = granted_.find(p.mem_id);
    return it != granted_.end() &&
           std::find(it->second.begin(), it->second.end(), initiator_key) != it->second.end();
  };
  const size_t before = parts->size();
  parts->erase(
      std::remove_if(parts->begin(), parts->end(), [&](const auto& p) { return !held(p); }),
      parts->end());
  return before - parts->size();
}

void RegionGrants::Forget(uint64_t mem_id, const std::string& initiator_key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = granted_.find(mem_id);
  if (it == granted_.end()) return;
  auto& keys = it->second;
  keys.erase(std::remove(keys.begin(), keys.end(), initiator_key), keys.end());
  if (keys.empty()) granted_.erase(it);
}

// A grant of `mem_id` to `initiator_key`, for map and CMA grants: the region is checked,
// the grant recorded, and the region checked again. A deregistration sets `withdrawn`
// and then looks for records (under mu_); so either it finds this record and revokes
// the grant, or the second check sees the withdrawal and the grant is refused.
// Refused requests leave no record (a peer asking for many ids costs no memory).
wire::WireStatus RegionGrants::RecordChecked(uint64_t mem_id, uint64_t capability,
                                             const std::string& initiator_key, MemoryRegion* r) {
  MemoryRegistry& memory = engine_->memory();
  if (!memory.FindNamed(mem_id, capability, r) ||
      r->use->withdrawn.load(std::memory_order_seq_cst)) {
    return wire::WireStatus::kUnknownMemory;
  }
  if (r->loc != MemoryLocationType::CPU) return wire::WireStatus::kNotHostMemory;
  Record(mem_id, initiator_key);
  MemoryRegion again;
  if (!memory.Find(mem_id, &again)) {
    Forget(mem_id, initiator_key);  // deregistered already: no revoke will come
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
    auto it = granted_.find(id);
    if (it == granted_.end()) return;
    keys = it->second;
  }
  std::vector<std::string> unreachable;
  for (const std::string& key : keys) {
    std::shared_ptr<Conn> conn = engine_->channel().LiveInbound(key);
    if (!conn) {
      // No connection from it is left: its engine is gone or disconnected, and its
      // transfers to us have failed; a process that died holds no mapping.
      unreachable.push_back(key);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      revoking_.emplace_back(key, id);
    }
    PostOnConn(*conn, wire::MakeHeader(wire::MsgType::kP2pRevoke, id), nullptr);
  }
  for (const std::string& key : unreachable) {
    MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': deregistering memory ", id, ": ",
                  LogSafe(key),
                  " holds a grant of it (P2P, shared-memory map or CMA) but has no connection "
                  "left to be asked to let go of it");
  }
  std::unique_lock<std::mutex> lock(mu_);
  auto pending = [&] {
    return std::any_of(revoking_.begin(), revoking_.end(),
                       [&](const auto& r) { return r.second == id; });
  };
  const int timeout_ms = engine_->tcp_config().transfer_timeout_ms;
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
    auto held = granted_.find(id);
    std::string names;
    for (const std::string& key : late) {
      names += (names.empty() ? "" : ", ") + LogSafe(key);
      if (held != granted_.end()) {
        auto& keys = held->second;
        keys.erase(std::remove(keys.begin(), keys.end(), key), keys.end());
      }
    }
    if (held != granted_.end() && held->second.empty()) granted_.erase(held);
    lock.unlock();
    for (const std::string& key : late) engine_->channel().CutOff(key);
    MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': deregistering memory ", id, ": ", names,
                  " did not confirm letting go of it within ", timeout_ms,
                  " ms; its connections were closed and its grant dropped");
    MORI_THROW(TimeoutError, "deregister_memory: memory ", id, " of engine '", engine_->key(),
               "' is still held (a P2P or shared-memory mapping, or a CMA grant) by ", names,
               ", which did not confirm letting go of it within ", timeout_ms,
               " ms; it stays registered for now, that holder's connections were closed and "
               "its grant dropped, and deregister_memory again completes");
  }
  granted_.erase(id);
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
