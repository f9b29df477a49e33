// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// Write announcements of same-host transfers (SHM and P2P writes, which move no message
// the target would see): through a ring in shared host memory the target granted for
// this engine (notice_ring.hpp), else as a kP2pWriteDone message.
#include <unistd.h>

#include <vector>

#include "engine/io_engine.hpp"
#include "mori/core/logging.hpp"
#include "p2p/p2p_transport.hpp"
#include "samehost/notice_ring.hpp"
#include "shm/shm_transport.hpp"
#include "control/control_handlers.hpp"
#include "control/reactor.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

void ShmTransport::RegisterNoticeHandlers() {
  ControlHandlers& handlers = engine_->channel().handlers();
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
    if (engine_->grants().DropUngranted(c.remote_key, &part) != 0) {
      RefuseAnnouncements(c.remote_key, h.mem_id, 1);
      return true;  // not recorded; the connection stays (a revocation may have crossed it)
    }
    r.Account(c, h, static_cast<wire::WireStatus>(h.status));
    return true;
  });
}

void ShmTransport::DrainNoticesLocked(const std::string& key, GrantedRing& ring) {
  std::vector<NoticeRecord> records;
  while (NoticeRing::Drain(reinterpret_cast<void*>(ring.addr), ring.capacity, &ring.head, 4096,
                           &records) > 0) {
    std::vector<InboundPart> parts;
    parts.reserve(records.size());
    for (const NoticeRecord& r : records) {
      parts.push_back({r.uid, 1, wire::WireStatus::kOk, r.mem_id, 0, r.bytes});
    }
    const uint64_t first_mem = parts.front().mem_id;
    if (size_t n = engine_->grants().DropUngranted(key, &parts)) {
      RefuseAnnouncements(key, first_mem, n);
    }
    engine_->inbound().Record(key, parts.data(), parts.size());
    records.clear();
  }
}

// Announcements of writes into regions the initiator holds no grant of: it cannot have
// made them (a forged or stale announcement would make pop_inbound_transfer_status
// report a write that did not happen). Counted, logged at debug level, not recorded.
void ShmTransport::RefuseAnnouncements(const std::string& key, uint64_t mem_id, size_t n) {
  engine_->CountRefusedAnnouncements(n);
  MORI_LOG_DEBUG(kIo, "engine '", engine_->key(), "': refused ", n, " write announcement(s) of ",
                 LogSafe(key), " (into memory ", mem_id, " among others): it holds no grant");
}

void ShmTransport::DrainInbound(const std::string* key) {
  std::lock_guard<std::mutex> lock(notice_mu_);
  if (notice_rings_.empty()) return;
  if (key != nullptr) {
    auto it = notice_rings_.find(*key);
    if (it != notice_rings_.end()) DrainNoticesLocked(it->first, it->second);
    return;
  }
  for (auto& [k, ring] : notice_rings_) DrainNoticesLocked(k, ring);
}

void ShmTransport::FreeNoticeRings() {
  std::lock_guard<std::mutex> lock(notice_mu_);
  for (auto& [k, ring] : notice_rings_) FreeSharedHost(ring.addr);  // peers keep their pages
  notice_rings_.clear();
}

bool ShmTransport::KeepsInitiator(const std::string& key) {
  std::lock_guard<std::mutex> lock(notice_mu_);
  return notice_rings_.count(key) != 0;
}

size_t ShmTransport::notice_rings_granted() {
  std::lock_guard<std::mutex> lock(notice_mu_);
  return notice_rings_.size();
}

wire::WireStatus ShmTransport::NoticeRingFor(const std::string& initiator_key,
                                             std::string* payload) {
  const HotPathOptions& options = engine_->options();
  const uint32_t slots = options.notice_ring_slots;
  // Rings carry announcements of one-sided same-host writes, which only SHM and P2P make.
  if (slots == 0 || (!created() && !engine_->p2p().created())) {
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
      if (!engine_->channel().LiveInbound(k)) gone.push_back(k);
    }
  }
  const uint64_t bytes = NoticeRing::BytesFor(slots);
  SharedHostBlock b;
  try {
    b = AllocateSharedHost(bytes);
  } catch (const std::exception& e) {
    MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': no notice ring for ", LogSafe(initiator_key),
                  " (", e.what(), "): its announcements come over TCP");
    return wire::WireStatus::kNotShareable;
  }
  NoticeRing::Init(reinterpret_cast<void*>(b.addr), bytes, slots);
  ShmMapGrant g;
  g.pid = static_cast<int32_t>(::getpid());
  g.fd = b.fd;
  g.block_size = b.size;
  g.region_offset = 0;
  g.region_size = b.size;
  if (liveness_) g.live = liveness_->Grant();
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
    MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': no notice ring for ", LogSafe(initiator_key),
                  " (", notice_rings_.size(), " granted, MORI_IO_MAX_NOTICE_RINGS ", cap,
                  "): its announcements come over TCP");
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

const std::shared_ptr<ShmMapping>& ShmTransport::NoticeRingOf(Peer& peer) {
  static const std::shared_ptr<ShmMapping> kNone;
  if (!engine_->options().notice_ring) return kNone;
  PeerShm& s = StateOf(peer);
  // Every write asks: after the first, one acquire load and no lock.
  if (s.notice_state.load(std::memory_order_acquire) != 0) return s.notice_ring;
  std::lock_guard<std::mutex> lock(s.notice_mu);
  if (s.notice_state.load(std::memory_order_relaxed) != 0) return s.notice_ring;
  std::string answer, error;
  StatusDetail code = StatusDetail::SUCCESS;
  wire::WireStatus status = wire::WireStatus::kOk;
  std::shared_ptr<ShmMapping> m;
  if (engine_->channel().SideRequest(peer, wire::MsgType::kNoticeRingReq,
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
    MORI_LOG_INFO(kIo, "engine '", engine_->key(), "': write announcements to ", LogSafe(peer.key),
                  " go over TCP (no notice ring: ", error.empty() ? "not granted" : error, ")");
    s.notice_state.store(-1, std::memory_order_release);
    return s.notice_ring;  // null
  }
  s.notice_ring = std::move(m);
  s.notice_state.store(1, std::memory_order_release);
  return s.notice_ring;
}

int ShmTransport::NoticeRingState(const std::string& remote_key) {
  if (!engine_->options().notice_ring) return -1;
  std::shared_ptr<Peer> peer = engine_->FindPeer(remote_key);
  if (!peer) return 0;
  return StateOf(*peer).notice_state.load(std::memory_order_acquire);
}

bool ShmTransport::PushNotice(Peer& peer, uint64_t uid, uint64_t mem_id, uint64_t bytes) {
  const std::shared_ptr<ShmMapping>& ring = NoticeRingOf(peer);
  return ring && NoticeRing::Push(ring->region, NoticeRecord{uid, mem_id, bytes});
}

void ShmTransport::PostNotice(Conn& conn, uint64_t uid, uint64_t mem_id, uint64_t bytes) {
  wire::Header d = wire::MakeHeader(wire::MsgType::kP2pWriteDone, mem_id);
  d.num_parts = 1;
  d.uid = uid;
  d.length = bytes;
  PostOnConn(conn, d, nullptr);  // not answered
}

void ShmTransport::AnnounceWrite(Peer& peer, const std::shared_ptr<Conn>& conn, uint64_t uid,
                                 uint64_t mem_id, uint64_t bytes) {
  if (!PushNotice(peer, uid, mem_id, bytes)) PostNotice(*conn, uid, mem_id, bytes);
}

void ShmTransport::AnnounceWrite(Peer& peer, const PeerConnections& conns, uint64_t uid,
                                 uint64_t mem_id, uint64_t bytes) {
  if (!PushNotice(peer, uid, mem_id, bytes)) PostNotice(*peer.NextConn(conns), uid, mem_id, bytes);
}

}  // namespace mori::io
