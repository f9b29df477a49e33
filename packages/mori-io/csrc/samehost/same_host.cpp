// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "samehost/same_host.hpp"

#include <unistd.h>

#include <vector>

#include "control/control_handlers.hpp"
#include "control/reactor.hpp"
#include "host/transport_host.hpp"
#include "mori/core/logging.hpp"
#include "samehost/notice_ring.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

SameHost::SameHost(TransportHost* host) : host_(host) { RegisterHandlers(); }

SameHost::~SameHost() { FreeNoticeRings(); }

void SameHost::ChannelStarting() {
  try {
    liveness_ = std::make_unique<LivenessPage>();
  } catch (const std::exception& e) {
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': no liveness page (", e.what(),
                  "); same-host initiators poll its pidfd per copy instead");
  }
}

void SameHost::OnControlThread(bool starting) {
  if (liveness_ == nullptr) return;
  // Released before the thread ends, while the page is still mapped (liveness.hpp).
  starting ? liveness_->Hold() : liveness_->Release();
}

void SameHost::ChannelStopped() {
  liveness_.reset();  // its holder, the first reactor, has released it and ended
  FreeNoticeRings();
}

void SameHost::GrantLiveness(LivenessGrant* live) const {
  if (liveness_) *live = liveness_->Grant();
}

void SameHost::RegisterHandlers() {
  ControlHandlers& handlers = host_->channel().handlers();
  handlers.OnSideRequest(
      wire::MsgType::kNoticeRingReq, wire::MsgType::kNoticeRingGrant,
      [this](Conn& c, std::string* payload) { return NoticeRingFor(c.remote_key, payload); });
  // The initiator finished writing transfer `uid` into our memory (its transfer
  // completed then): record it. Not answered, so an announcement costs each side one
  // message, not two. From a same-host initiator it means that its notice ring was full
  // (our application is not popping): take the ring's records now, so the initiator's
  // next announcements find room there again.
  handlers.OnRequest(wire::MsgType::kP2pWriteDone, [this](Reactor& r, Conn& c, std::string*) {
    DrainInbound(&c.remote_key);
    const wire::Header& h = c.cur;
    std::vector<InboundPart> part{{h.uid, h.num_parts, wire::WireStatus::kOk, h.mem_id, 0, 0}};
    if (host_->grants().DropUngranted(c.remote_key, &part) != 0) {
      RefuseAnnouncements(c.remote_key, h.mem_id, 1);
      return true;  // not recorded; the connection stays (a revocation may have crossed it)
    }
    r.Account(c, h, static_cast<wire::WireStatus>(h.status));
    return true;
  });
}

void SameHost::DrainNoticesLocked(const std::string& key, GrantedRing& ring) {
  std::vector<NoticeRecord> records;
  while (NoticeRing::Drain(reinterpret_cast<void*>(ring.addr), ring.capacity, &ring.head, 4096,
                           &records) > 0) {
    std::vector<InboundPart> parts;
    parts.reserve(records.size());
    for (const NoticeRecord& r : records) {
      parts.push_back({r.uid, 1, wire::WireStatus::kOk, r.mem_id, 0, r.bytes});
    }
    const uint64_t first_mem = parts.front().mem_id;
    if (size_t n = host_->grants().DropUngranted(key, &parts)) {
      RefuseAnnouncements(key, first_mem, n);
    }
    host_->inbound().Record(key, parts.data(), parts.size());
    records.clear();
  }
}

// Announcements of writes into regions the initiator holds no grant of: it cannot have
// made them (a forged or stale announcement would make pop_inbound_transfer_status
// report a write that did not happen). Counted, logged at debug level, not recorded.
void SameHost::RefuseAnnouncements(const std::string& key, uint64_t mem_id, size_t n) {
  host_->CountRefusedAnnouncements(n);
  MORI_LOG_DEBUG(kIo, "engine '", host_->key(), "': refused ", n, " write announcement(s) of ",
                 LogSafe(key), " (into memory ", mem_id, " among others): it holds no grant");
}

void SameHost::DrainInbound(const std::string* key) {
  std::lock_guard<std::mutex> lock(notice_mu_);
  if (notice_rings_.empty()) return;
  if (key != nullptr) {
    auto it = notice_rings_.find(*key);
    if (it != notice_rings_.end()) DrainNoticesLocked(it->first, it->second);
    return;
  }
  for (auto& [k, ring] : notice_rings_) DrainNoticesLocked(k, ring);
}

void SameHost::FreeNoticeRings() {
  std::lock_guard<std::mutex> lock(notice_mu_);
  for (auto& [k, ring] : notice_rings_) FreeSharedHost(ring.addr);  // peers keep their pages
  notice_rings_.clear();
}

bool SameHost::KeepsInitiator(const std::string& key) {
  std::lock_guard<std::mutex> lock(notice_mu_);
  return notice_rings_.count(key) != 0;
}

size_t SameHost::notice_rings_granted() {
  std::lock_guard<std::mutex> lock(notice_mu_);
  return notice_rings_.size();
}

wire::WireStatus SameHost::NoticeRingFor(const std::string& initiator_key, std::string* payload) {
  const HotPathOptions& options = host_->options();
  const uint32_t slots = options.notice_ring_slots;
  // Rings carry announcements of one-sided same-host writes, which only SHM and P2P make.
  if (slots == 0 || (!host_->Created(kShmSlot) && !host_->Created(kP2pSlot))) {
    return wire::WireStatus::kNotShareable;
  }
  const size_t cap = options.max_notice_rings;
  // At the cap, rings of initiators with no connection left go first (drained): such an
  // initiator has failed its peer and asks again when it registers us again.
  std::vector<std::string> gone;
  {
    std::vector<std::string> others;
    {
      std::lock_guard<std::mutex> lock(notice_mu_);
      if (notice_rings_.count(initiator_key) == 0 && notice_rings_.size() >= cap) {
        for (const auto& kv : notice_rings_) others.push_back(kv.first);
      }
    }
    for (const std::string& k : others) {
      if (!host_->channel().LiveInbound(k)) gone.push_back(k);
    }
  }
  const uint64_t bytes = NoticeRing::BytesFor(slots);
  SharedHostBlock b;
  try {
    b = AllocateSharedHost(bytes);
  } catch (const std::exception& e) {
    uint64_t more = 0;
    if (ring_alloc_failed_log_.Due(&more)) {
      MORI_LOG_WARN(kIo, "engine '", host_->key(), "': no notice ring for ", LogSafe(initiator_key),
                    " (", e.what(), "): its announcements come over TCP (", more,
                    " more such since the last such message)");
    }
    return wire::WireStatus::kNotShareable;
  }
  NoticeRing::Init(reinterpret_cast<void*>(b.addr), bytes, slots);
  ShmMapGrant g;
  g.pid = static_cast<int32_t>(::getpid());
  g.fd = b.fd;
  g.block_size = b.size;
  g.region_offset = 0;
  g.region_size = b.size;
  GrantLiveness(&g.live);
  std::lock_guard<std::mutex> lock(notice_mu_);
  for (const std::string& k : gone) {
    auto it = notice_rings_.find(k);
    if (it == notice_rings_.end()) continue;
    DrainNoticesLocked(it->first, it->second);
    FreeSharedHost(it->second.addr);
    notice_rings_.erase(it);
  }
  auto it = notice_rings_.find(initiator_key);
  if (it == notice_rings_.end() && notice_rings_.size() >= cap) {
    FreeSharedHost(b.addr);
    uint64_t more = 0;
    if (ring_cap_log_.Due(&more)) {
      MORI_LOG_WARN(kIo, "engine '", host_->key(), "': no notice ring for ", LogSafe(initiator_key),
                    " (", notice_rings_.size(), " granted, MORI_IO_MAX_NOTICE_RINGS ", cap,
                    "): its announcements come over TCP (", more,
                    " more such since the last such message)");
    }
    return wire::WireStatus::kNotShareable;
  }
  if (it != notice_rings_.end()) {
    // The same engine key asks again (it re-registered us, or restarted): what its
    // previous ring holds is recorded before the ring goes.
    DrainNoticesLocked(it->first, it->second);
    FreeSharedHost(it->second.addr);
    notice_rings_.erase(it);
  }
  notice_rings_.emplace(initiator_key, GrantedRing{b.addr, slots, 0});
  *payload = PackShmMapGrant(g);
  return wire::WireStatus::kOk;
}

const std::shared_ptr<ShmMapping>& SameHost::NoticeRingOf(Peer& peer) {
  static const std::shared_ptr<ShmMapping> kNone;
  if (!host_->options().notice_ring) return kNone;
  PeerNoticeRing& s = peer.notice;
  // Every write asks: after the first, one acquire load and no lock.
  if (s.state.load(std::memory_order_acquire) != 0) return s.ring;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.state.load(std::memory_order_relaxed) != 0) return s.ring;
  std::string answer, error;
  StatusDetail code = StatusDetail::SUCCESS;
  wire::WireStatus status = wire::WireStatus::kOk;
  std::shared_ptr<ShmMapping> m;
  if (host_->channel().SideRequest(peer, wire::MsgType::kNoticeRingReq,
                                   wire::MsgType::kNoticeRingGrant, 0, 0, {}, &answer, &code,
                                   &error, &status)) {
    try {
      m = MapPeerRegion(UnpackShmMapGrant(answer), &error);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (m && !NoticeRing::Check(m->region, m->size, &error)) m.reset();
  }
  if (!m) {
    MORI_LOG_INFO(kIo, "engine '", host_->key(), "': write announcements to ", LogSafe(peer.key),
                  " go over TCP (no notice ring: ", error.empty() ? "not granted" : error, ")");
    s.state.store(-1, std::memory_order_release);
    return s.ring;  // null
  }
  s.ring = std::move(m);
  s.state.store(1, std::memory_order_release);
  return s.ring;
}

int SameHost::NoticeRingState(const std::string& remote_key) {
  if (!host_->options().notice_ring) return -1;
  std::shared_ptr<Peer> peer = host_->FindPeer(remote_key);
  if (!peer) return 0;
  return peer->notice.state.load(std::memory_order_acquire);
}

bool SameHost::PushNotice(Peer& peer, uint64_t uid, uint64_t mem_id, uint64_t bytes) {
  const std::shared_ptr<ShmMapping>& ring = NoticeRingOf(peer);
  return ring && NoticeRing::Push(ring->region, NoticeRecord{uid, mem_id, bytes});
}

void SameHost::PostNotice(Conn& conn, uint64_t uid, uint64_t mem_id, uint64_t bytes) {
  wire::Header d = wire::MakeHeader(wire::MsgType::kP2pWriteDone, mem_id);
  d.num_parts = 1;
  d.uid = uid;
  d.length = bytes;
  PostOnConn(conn, d, nullptr);  // not answered
}

void SameHost::AnnounceWrite(Peer& peer, const std::shared_ptr<Conn>& conn, uint64_t uid,
                             uint64_t mem_id, uint64_t bytes) {
  if (!PushNotice(peer, uid, mem_id, bytes)) PostNotice(*conn, uid, mem_id, bytes);
}

void SameHost::AnnounceWrite(Peer& peer, const PeerConnections& conns, uint64_t uid,
                             uint64_t mem_id, uint64_t bytes) {
  if (!PushNotice(peer, uid, mem_id, bytes)) PostNotice(*peer.NextConn(conns), uid, mem_id, bytes);
}

}  // namespace mori::io
