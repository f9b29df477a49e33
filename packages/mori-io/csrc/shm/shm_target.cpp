// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// The target side of SHM: the CMA probe, per-part grants, and the grants of whole
// regions (a mapping of shared host memory, or an absolute range for CMA).
#include <unistd.h>

#include <deque>

#include "control/control_handlers.hpp"
#include "control/reactor.hpp"
#include "host/transport_host.hpp"
#include "samehost/same_host.hpp"
#include "shm/shm_transport.hpp"

namespace mori::io {

namespace {

// The per-part grants an inbound connection holds for its initiator: each holds the
// region (deregistration waits) until the initiator's kShmWriteDone / kShmReadDone
// says its copy into / out of it ended (the initiator answers each grant with one done,
// in grant order).
struct ShmGrantsHeld : ConnExtension {
  std::deque<RegionUse*> writes;
  std::deque<RegionUse*> reads;
  bool Busy() const override { return !writes.empty() || !reads.empty(); }
  // An initiator that already holds a grant may still be copying; with its connection
  // gone, the target cannot learn when it stops (a known limit of CMA).
  void Release() override {
    for (RegionUse* u : writes) u->Leave();
    writes.clear();
    for (RegionUse* u : reads) u->Leave();
    reads.clear();
  }
};

}  // namespace

void ShmTransport::RegisterTargetHandlers() {
  ControlHandlers& handlers = host_->channel().handlers();
  auto held = [slot = conn_slot_](Conn& c) -> ShmGrantsHeld& {
    if (!c.ext[slot]) c.ext[slot] = std::make_unique<ShmGrantsHeld>();
    return static_cast<ShmGrantsHeld&>(*c.ext[slot]);
  };
  handlers.OnRequest(wire::MsgType::kShmProbe, [this](Reactor& r, Conn& c, std::string*) {
    wire::Header a = c.cur;
    a.type = static_cast<uint8_t>(wire::MsgType::kShmProbeAck);
    a.status = static_cast<uint8_t>(created() ? wire::WireStatus::kOk : wire::WireStatus::kNoShm);
    a.mem_id = static_cast<uint64_t>(::getpid());
    a.offset = reinterpret_cast<uintptr_t>(&cookie_);
    a.uid = cookie_;
    r.Answer(c, {a, nullptr, 0, 0, nullptr});
    return true;
  });
  // The same check as a TCP request; the grant names the absolute address, so the
  // initiator's copy lands only where this registry allowed it.
  auto part = [this, held](Reactor& r, Conn& c, std::string* why) {
    const wire::Header& h = c.cur;
    wire::WireStatus refused;
    if (!r.ExtentVerdict(c, h, &refused, why)) return false;
    const bool write = static_cast<wire::MsgType>(h.type) == wire::MsgType::kShmWriteReq;
    RegionLookup lk = !created() ? RegionLookup{wire::WireStatus::kNoShm, nullptr}
                      : refused != wire::WireStatus::kOk ? RegionLookup{refused, nullptr}
                                                         : r.Target(c, h, true);
    if (lk.use != nullptr) {
      ShmGrantsHeld& g = held(c);
      (write ? g.writes : g.reads).push_back(lk.use);
    }
    const bool ok = lk.status == wire::WireStatus::kOk;
    wire::Header a = h;
    a.type = static_cast<uint8_t>(wire::MsgType::kShmGrant);
    a.status = static_cast<uint8_t>(lk.status);
    a.offset = ok ? reinterpret_cast<uintptr_t>(lk.base + h.offset) : 0;
    r.Answer(c, {a, nullptr, 0, 0, nullptr});
    // A granted write is accounted when its kShmWriteDone says the bytes are in place.
    if (!write || !ok) r.Account(c, h, lk.status);
    return true;
  };
  handlers.OnRequest(wire::MsgType::kShmWriteReq, part);
  handlers.OnRequest(wire::MsgType::kShmReadReq, part);
  handlers.OnRequest(wire::MsgType::kShmReadDone, [held](Reactor&, Conn& c, std::string* why) {
    ShmGrantsHeld& g = held(c);
    if (g.reads.empty()) {
      *why = "an SHM read done without a granted read";
      return false;
    }
    g.reads.front()->Leave();
    g.reads.pop_front();
    return true;  // not answered
  });
  handlers.OnRequest(wire::MsgType::kShmWriteDone, [held](Reactor& r, Conn& c, std::string* why) {
    ShmGrantsHeld& g = held(c);
    if (g.writes.empty()) {
      *why = "an SHM write done without a granted write";
      return false;
    }
    g.writes.front()->Leave();
    g.writes.pop_front();
    r.Account(c, c.cur, static_cast<wire::WireStatus>(c.cur.status));
    wire::Header a = c.cur;
    a.type = static_cast<uint8_t>(wire::MsgType::kShmDoneAck);
    a.status = static_cast<uint8_t>(wire::WireStatus::kOk);
    r.Answer(c, {a, nullptr, 0, 0, nullptr});
    return true;
  });
  handlers.OnSideRequest(wire::MsgType::kShmMapReq, wire::MsgType::kShmMapGrant,
                         [this](Conn& c, std::string* payload) {
                           return MapGrantFor(c.cur.mem_id, c.cur.capability, c.remote_key,
                                              payload);
                         });
  handlers.OnSideRequest(wire::MsgType::kShmCmaReq, wire::MsgType::kShmCmaGrant,
                         [this](Conn& c, std::string* payload) {
                           return CmaGrantFor(c.cur.mem_id, c.cur.capability, c.remote_key,
                                              payload);
                         });
}

wire::WireStatus ShmTransport::MapGrantFor(uint64_t mem_id, uint64_t capability,
                                           const std::string& initiator_key, std::string* payload) {
  if (!created()) return wire::WireStatus::kNoShm;
  MemoryRegion r;
  SharedHostBlock b;
  if (host_->memory().FindNamed(mem_id, capability, &r) && r.loc == MemoryLocationType::CPU &&
      !FindSharedHost(r.addr, r.size, &b)) {
    return wire::WireStatus::kNotShareable;
  }
  bool added = false;
  wire::WireStatus st =
      host_->grants().RecordChecked(mem_id, capability, initiator_key, &r, &added);
  if (st != wire::WireStatus::kOk) return st;
  if (!FindSharedHost(r.addr, r.size, &b)) {  // its block was freed meanwhile
    // Only the record this request made: one it held before (a CMA grant) stays.
    if (added) host_->grants().Forget(mem_id, initiator_key);
    return wire::WireStatus::kNotShareable;
  }
  ShmMapGrant g;
  g.pid = static_cast<int32_t>(::getpid());
  g.fd = b.fd;
  g.block_size = b.size;
  g.region_offset = r.addr - b.addr;
  g.region_size = r.size;
  same_host_->GrantLiveness(&g.live);
  *payload = PackShmMapGrant(g);
  return wire::WireStatus::kOk;
}

wire::WireStatus ShmTransport::CmaGrantFor(uint64_t mem_id, uint64_t capability,
                                           const std::string& initiator_key, std::string* payload) {
  if (!created()) return wire::WireStatus::kNoShm;
  MemoryRegion r;
  bool added = false;
  wire::WireStatus st =
      host_->grants().RecordChecked(mem_id, capability, initiator_key, &r, &added);
  if (st != wire::WireStatus::kOk) return st;
  CmaGrant g;
  g.pid = static_cast<int32_t>(::getpid());
  g.addr = r.addr;
  g.size = r.size;
  same_host_->GrantLiveness(&g.live);
  *payload = PackCmaGrant(g);
  return wire::WireStatus::kOk;
}

}  // namespace mori::io
