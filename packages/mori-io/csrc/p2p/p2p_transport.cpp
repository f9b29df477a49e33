// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "p2p/p2p_transport.hpp"

#include <cstddef>
#include <vector>

#include "control/control_handlers.hpp"
#include "control/reactor.hpp"
#include "host/transport_host.hpp"
#include "mori/core/logging.hpp"
#include "samehost/same_host.hpp"
#include "wire/log_safe.hpp"

namespace mori::io {

static_assert(sizeof(TransferSpan) == sizeof(P2pSpan) &&
                  offsetof(TransferSpan, local_offset) == offsetof(P2pSpan, local_offset) &&
                  offsetof(TransferSpan, remote_offset) == offsetof(P2pSpan, remote_offset) &&
                  offsetof(TransferSpan, size) == offsetof(P2pSpan, size),
              "TransferSpan and P2pSpan share one layout");

P2pTransport::P2pTransport(TransportHost* host, SameHost* same_host)
    : host_(host), same_host_(same_host) {
  host->channel().handlers().OnSideRequest(
      wire::MsgType::kP2pOpenReq, wire::MsgType::kP2pGrant, [this](Conn& c, std::string* payload) {
        return Grant(c.cur.mem_id, c.cur.capability, c.remote_key, payload);
      });
}

std::unique_ptr<PeerState> P2pTransport::NewPeerState() { return std::make_unique<PeerP2p>(); }

wire::WireStatus P2pTransport::Grant(uint64_t mem_id, uint64_t capability,
                                     const std::string& initiator_key, std::string* payload) {
  if (!backend_) return wire::WireStatus::kNoP2p;
  MemoryRegistry& memory = host_->memory();
  MemoryRegion r;
  if (!memory.FindNamed(mem_id, capability, &r) ||
      r.use->withdrawn.load(std::memory_order_seq_cst)) {
    return wire::WireStatus::kUnknownMemory;
  }
  if (r.loc != MemoryLocationType::GPU) return wire::WireStatus::kNotGpuMemory;
  // Recorded before the export leaves (a deregistration from then on revokes it);
  // refused requests leave no record.
  bool added = false;
  if (!host_->grants().Record(mem_id, initiator_key, &added)) {
    return wire::WireStatus::kTooManyGrants;
  }
  try {
    *payload = backend_->Export(r.id, r.addr, r.size, r.device_id);
  } catch (const std::exception& e) {
    if (added) host_->grants().Forget(mem_id, initiator_key);  // one held before stays
    *payload = e.what();
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': P2P export of memory ", mem_id,
                  " failed: ", e.what());
    return wire::WireStatus::kExportFailed;
  }
  // Deregistered meanwhile: do not hand out a mapping of memory the caller may free.
  if (!memory.Find(mem_id, &r) || r.use->withdrawn.load(std::memory_order_seq_cst)) {
    backend_->Forget(mem_id);
    payload->clear();
    return wire::WireStatus::kUnknownMemory;
  }
  return wire::WireStatus::kOk;
}

void P2pTransport::RegionWithdrawn(uint64_t id) {
  if (backend_) backend_->Forget(id);
}

std::shared_ptr<P2pMapping> P2pTransport::MappingFor(Peer& peer, const RemoteRegion& remote,
                                                     int device, StatusDetail* code,
                                                     std::string* error) {
  const uint64_t mem_id = remote.mem_id;
  PeerP2p& s = peer.StateOf<PeerP2p>(kP2pSlot);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.maps.find({mem_id, device});
  if (it != s.maps.end()) return it->second;
  const std::string what =
      StrCat("P2P: cannot map memory ", mem_id, " of remote engine ", LogSafe(peer.key), ": ");
  std::string payload;
  if (!host_->channel().SideRequest(peer, wire::MsgType::kP2pOpenReq, wire::MsgType::kP2pGrant,
                                    mem_id, remote.capability, {}, &payload, code, error)) {
    *error = what + *error;
    return nullptr;
  }
  std::shared_ptr<P2pMapping> m;
  try {
    m = backend_->Import(UnpackP2pExport(payload.data(), payload.size()), device);
  } catch (const std::exception& e) {
    *code = StatusDetail::ERR_TRANSPORT;
    *error = what + e.what();
    return nullptr;
  }
  s.maps.emplace(std::make_pair(mem_id, device), m);
  return m;
}

void P2pTransport::RemoteRegionRevoked(Peer& peer, uint64_t mem_id,
                                       const std::shared_ptr<void>& released) {
  std::vector<std::shared_ptr<P2pMapping>> maps;  // one per local GPU that mapped it
  {
    PeerP2p& s = peer.StateOf<PeerP2p>(kP2pSlot);
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto it = s.maps.begin(); it != s.maps.end();) {
      if (it->first.first == mem_id) {
        maps.push_back(std::move(it->second));
        it = s.maps.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Acknowledged once the last copy holding one ended and all are unmapped.
  for (auto& m : maps) m->released = [released] {};
}

int P2pTransport::MappingKind(const std::string& remote_key, uint64_t mem_id) {
  std::shared_ptr<Peer> peer = host_->FindPeer(remote_key);
  if (!peer) return -1;
  PeerP2p& s = peer->StateOf<PeerP2p>(kP2pSlot);
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [key, m] : s.maps) {
    if (key.first == mem_id) return m->kind;
  }
  return -1;
}

std::shared_ptr<TransferState> P2pTransport::Submit(const TransferRequest& req) {
  StatusDetail code = StatusDetail::SUCCESS;
  std::string error;
  std::shared_ptr<P2pMapping> remote =
      MappingFor(*req.peer, req.remote, req.local.device_id, &code, &error);
  if (!remote) return ControlHost::Finished(code, std::move(error));
  // The target's registered size, not the caller's MemoryDesc, bounds the copy: a
  // forged or stale descriptor cannot reach past what the target exported.
  if (auto err = ControlHost::RemoteBoundsError(req, remote->size)) return err;
  uint64_t bytes = 0;
  for (size_t i = 0; i < req.n; ++i) bytes += req.spans[i].size;
  if (bytes == 0) return ControlHost::Finished(StatusDetail::SUCCESS, {});
  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state = host_->BeginTransfer(req.local, 1, true, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;
  std::shared_ptr<Conn> conn;
  std::shared_ptr<Peer> peer;
  if (req.op == Op::kWrite) {
    conn = req.peer->NextConn(*req.conns);
    peer = req.peer;
    same_host_->NoticeRingOf(*peer);  // asked here, not on the completion thread
  }
  const uint64_t uid = req.uid;
  const uint64_t remote_mem = req.remote.mem_id;
  backend_->Submit(req.op == Op::kWrite, req.local.device_id,
                   reinterpret_cast<char*>(req.local.addr), std::move(remote),
                   reinterpret_cast<const P2pSpan*>(req.spans), req.n,
                   [this, rid, conn, peer, uid, remote_mem, bytes](StatusDetail c, std::string m) {
                     // Announced first: once the write's status completes, a pop at the
                     // target finds it (when the ring took it; a TCP announcement follows
                     // shortly).
                     if (conn && c == StatusDetail::SUCCESS) {
                       same_host_->AnnounceWrite(*peer, conn, uid, remote_mem, bytes);
                     }
                     host_->CompletePart(rid, c, m);
                   });
  return state;
}

}  // namespace mori::io
