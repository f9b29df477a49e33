// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "registry/inbound_statuses.hpp"

#include "mori/core/logging.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

bool InboundStatuses::Recorded(wire::WireStatus s) {
  switch (s) {
    case wire::WireStatus::kUnknownMemory:  // no region of ours under that id and capability
    case wire::WireStatus::kNoShm:          // a path this engine does not serve
    case wire::WireStatus::kNoP2p:
    case wire::WireStatus::kNoRdma:
      return false;
    default:
      return true;
  }
}

void InboundStatuses::Record(const std::string& remote_key, const InboundPart* parts, size_t n) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  // Found (or made) at the first recorded part; evictions erase only other initiators
  // (this one holds the status just recorded), so the iterator stays valid.
  ByKey::iterator ini = by_key_.end();
  Entry* e = nullptr;
  uint64_t uid = 0;
  for (size_t i = 0; i < n; ++i) {
    const InboundPart& p = parts[i];
    if (!Recorded(p.status) && !HasEntryLocked(remote_key, p.uid)) {
      // A refusal starts no status. One of a transfer whose earlier parts were recorded
      // (a region withdrawn in the middle of a multi-part write reads as unknown) is
      // recorded, so that status still completes, as a failure.
      ++unrecorded_;
      continue;
    }
    if (ini == by_key_.end()) {
      auto [it, inserted] = by_key_.try_emplace(remote_key);
      if (inserted) {
        it->second.id = next_initiator_++;
        by_id_.emplace(it->second.id, &*it);
        bytes_ += remote_key.size() + kInitiatorBytes;
      }
      ini = it;
    }
    // unordered_map references stay valid across inserts, so a run of one uid reuses it
    // (eviction removes only older entries: never the one just inserted).
    if (e == nullptr || p.uid != uid) {
      auto [it, inserted] = ini->second.by_uid.try_emplace(p.uid);
      e = &it->second;
      uid = p.uid;
      if (inserted) {
        e->seq = ++seq_;
        order_.push_back({ini->second.id, p.uid, e->seq});
        ++count_;
        bytes_ += kStatusBytes;
        EvictLocked();
      }
    }
    e->total = p.num_parts;
    ++e->seen;
    if (p.status != wire::WireStatus::kOk && e->failure == wire::WireStatus::kOk) {
      e->failure = p.status;
      e->mem_id = p.mem_id;
      e->offset = p.offset;
      e->length = p.length;
    }
  }
}

bool InboundStatuses::HasEntryLocked(const std::string& remote_key, uint64_t uid) const {
  auto it = by_key_.find(remote_key);
  return it != by_key_.end() && it->second.by_uid.count(uid) != 0;
}

std::shared_ptr<TransferState> InboundStatuses::Pop(const std::string& remote_key, uint64_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.find(remote_key);
  if (it == by_key_.end()) return nullptr;
  auto& by_uid = it->second.by_uid;
  auto e = by_uid.find(uid);
  if (e == by_uid.end() && uid_alias_mask_ != 0) e = by_uid.find(uid & uid_alias_mask_);
  if (e == by_uid.end() || e->second.seen < e->second.total) return nullptr;
  auto state = std::make_shared<TransferState>();
  const Entry& en = e->second;
  if (en.failure == wire::WireStatus::kOk) {
    state->Finish(StatusDetail::SUCCESS, {});
  } else {
    // The code the initiator was given for the same refusal (wire_status.cpp): a bad
    // range is ERR_OUT_OF_BOUNDS (an invalid argument in MORI's codes), not a failed
    // transport operation.
    state->Finish(wire::WireStatusCode(en.failure),
                  StrCat("inbound transfer ", uid, " from ", LogSafe(remote_key), ": ", en.length,
                         " bytes at offset ", en.offset, " of memory ", en.mem_id,
                         " failed: ", wire::WireStatusText(en.failure)));
  }
  EraseLocked(it, e);
  // Popped entries leave stale order items; drop them once they outnumber live ones,
  // so the order queue stays within twice the held statuses (amortized O(1)).
  while (!order_.empty() && !Live(order_.front())) order_.pop_front();
  if (order_.size() > 2 * count_ + 64) {
    std::deque<Order> kept;
    for (Order& o : order_) {
      if (Live(o)) kept.push_back(o);
    }
    order_.swap(kept);
  }
  return state;
}

void InboundStatuses::EraseLocked(ByKey::iterator it,
                                  std::unordered_map<uint64_t, Entry>::iterator e) {
  it->second.by_uid.erase(e);
  --count_;
  bytes_ -= kStatusBytes;
  if (!it->second.by_uid.empty()) return;
  // Its last status: the key goes too (an initiator's key is held only while it has one).
  bytes_ -= it->first.size() + kInitiatorBytes;
  by_id_.erase(it->second.id);
  by_key_.erase(it);
}

bool InboundStatuses::Live(const Order& o) const {
  auto k = by_id_.find(o.initiator);
  if (k == by_id_.end()) return false;
  const auto& by_uid = k->second->second.by_uid;
  auto e = by_uid.find(o.uid);
  return e != by_uid.end() && e->second.seq == o.seq;
}

void InboundStatuses::EvictLocked() {
  while ((count_ > max_held_ || bytes_ > max_bytes_) && !order_.empty()) {
    const Order o = order_.front();
    if (o.seq == seq_) break;  // the status just recorded stays (it alone fits kMinBytes)
    order_.pop_front();
    auto k = by_id_.find(o.initiator);
    if (k == by_id_.end()) continue;
    const std::string& key = k->second->first;
    auto& by_uid = k->second->second.by_uid;
    auto e = by_uid.find(o.uid);
    if (e == by_uid.end() || e->second.seq != o.seq) continue;
    MORI_LOG_DEBUG(kIo, "engine '", engine_key_,
                   "': dropping the unpopped inbound status of transfer ", o.uid, " from ",
                   LogSafe(key), " (", e->second.seen, "/", e->second.total, " parts",
                   e->second.failure != wire::WireStatus::kOk ? ", failed" : "", "): ", count_,
                   " held (max_inbound_statuses ", max_held_, "), ", bytes_,
                   " bytes (max_inbound_status_bytes ", max_bytes_, ")");
    ++evicted_;
    EraseLocked(by_key_.find(key), e);
  }
}

InboundStatuses::Stats InboundStatuses::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.held = count_;
  s.initiators = by_key_.size();
  s.bytes = bytes_;
  s.evicted = evicted_;
  s.unrecorded = unrecorded_;
  return s;
}

}  // namespace mori::io
