// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/inbound_statuses.hpp"

#include "mori/core/logging.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

void InboundStatuses::Record(const std::string& remote_key, const InboundPart* parts, size_t n) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& by_uid = by_key_[remote_key];
  std::shared_ptr<const std::string>& shared_key = keys_[remote_key];
  if (!shared_key) shared_key = std::make_shared<const std::string>(remote_key);
  Entry* e = nullptr;
  uint64_t uid = 0;
  const size_t cap = max_held_;
  for (size_t i = 0; i < n; ++i) {
    const InboundPart& p = parts[i];
    // unordered_map references stay valid across inserts, so a run of one uid reuses it
    // (eviction removes only older entries: never the one just inserted).
    if (e == nullptr || p.uid != uid) {
      auto [it, inserted] = by_uid.try_emplace(p.uid);
      e = &it->second;
      uid = p.uid;
      if (inserted) {
        e->seq = ++seq_;
        order_.push_back({shared_key, p.uid, e->seq});
        ++count_;
        EvictLocked(cap);
      }
    }
    e->total = p.num_parts;
    ++e->seen;
    if (p.status != wire::WireStatus::kOk && !e->failed) {
      e->failed = true;
      e->message = StrCat("inbound transfer ", p.uid, " from ", LogSafe(remote_key), ": ", p.length,
                          " bytes at offset ", p.offset, " of memory ", p.mem_id,
                          " refused: ", wire::WireStatusText(p.status));
    }
  }
}

std::shared_ptr<TransferState> InboundStatuses::Pop(const std::string& remote_key, uint64_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.find(remote_key);
  if (it == by_key_.end()) return nullptr;
  auto e = it->second.find(uid);
  if (e == it->second.end() && uid_alias_mask_ != 0) e = it->second.find(uid & uid_alias_mask_);
  if (e == it->second.end() || e->second.seen < e->second.total) return nullptr;
  auto state = std::make_shared<TransferState>();
  state->Finish(e->second.failed ? StatusDetail::ERR_TRANSPORT : StatusDetail::SUCCESS,
                e->second.message);
  it->second.erase(e);
  --count_;
  // Popped entries leave stale order items; drop them once they outnumber live ones,
  // so the order queue stays within twice the held statuses (amortized O(1)).
  while (!order_.empty() && !Live(order_.front())) order_.pop_front();
  if (order_.size() > 2 * count_ + 64) {
    std::deque<Order> kept;
    for (Order& o : order_) {
      if (Live(o)) kept.push_back(std::move(o));
    }
    order_.swap(kept);
  }
  return state;
}

bool InboundStatuses::Live(const Order& o) const {
  auto k = by_key_.find(*o.key);
  if (k == by_key_.end()) return false;
  auto e = k->second.find(o.uid);
  return e != k->second.end() && e->second.seq == o.seq;
}

void InboundStatuses::EvictLocked(size_t cap) {
  while (count_ > cap && !order_.empty()) {
    Order o = std::move(order_.front());
    order_.pop_front();
    if (!Live(o)) continue;
    auto& by_uid = by_key_[*o.key];
    const Entry& e = by_uid[o.uid];
    MORI_LOG_DEBUG(kIo, "engine '", engine_key_,
                   "': dropping the unpopped inbound status of transfer ", o.uid, " from ",
                   LogSafe(*o.key), " (", e.seen, "/", e.total, " parts",
                   e.failed ? ", failed" : "", "): more than max_inbound_statuses ", cap, " held");
    by_uid.erase(o.uid);
    --count_;
    ++evicted_;
  }
}

size_t InboundStatuses::held() {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

uint64_t InboundStatuses::evicted() {
  std::lock_guard<std::mutex> lock(mu_);
  return evicted_;
}

}  // namespace mori::io
