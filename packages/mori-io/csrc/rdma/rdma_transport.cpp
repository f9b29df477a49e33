// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "rdma/rdma_transport.hpp"

#include "control/control_handlers.hpp"
#include "control/reactor.hpp"
#include "host/transport_host.hpp"
#include "mori/core/logging.hpp"
#include "wire/log_safe.hpp"

namespace mori::io {

RdmaTransport::RdmaTransport(TransportHost* host) : host_(host) {
  ControlHandlers& handlers = host->channel().handlers();
  handlers.OnRequest(
      wire::MsgType::kRdmaConnect,
      [](Reactor& r, Conn& c, std::string* why) {
        return r.ReceiveRequestPayload(c, 1u << 16, why);  // the initiator's endpoints
      },
      [this](Reactor& r, Conn& c) {
        std::string answer;
        wire::WireStatus st = Accept(c.remote_key, c.request_payload, &answer);
        r.SideAnswer(c, c.cur, wire::MsgType::kRdmaConnectAck, st, std::move(answer));
      });
  handlers.OnSideRequest(wire::MsgType::kRdmaRegionReq, wire::MsgType::kRdmaRegionKey,
                         [this](Conn& c, std::string* payload) {
                           return RegionKey(c.cur.mem_id, c.cur.capability, payload);
                         });
}

std::unique_ptr<PeerState> RdmaTransport::NewPeerState() { return std::make_unique<PeerRdma>(); }

void RdmaTransport::Adopt(std::unique_ptr<rdma::RdmaBackend> backend) {
  // Completed inbound RDMA transfers: `parts` notifications per (peer, uid & 24 bits).
  InboundStatuses& inbound = host_->inbound();
  inbound.AlsoMatchUidBits(rdma::kImmUidMask);
  backend->SetInboundHandler(
      [&inbound](const std::string& peer_key, uint32_t uid24, uint32_t parts, bool) {
        InboundPart part{uid24, parts, wire::WireStatus::kOk, 0, 0, 0};
        inbound.Record(peer_key, &part, 1);
      });
  host_->memory().WithAllExclusive([&](const auto& regions) {
    std::lock_guard<std::mutex> lock(keys_mu_);
    for (const auto& [id, r] : regions) keys_[id] = backend->RegisterRegion(id, r.addr, r.size);
    backend_ = std::move(backend);
  });
  MORI_LOG_INFO(kIo, "engine '", host_->key(), "': RDMA backend on ", backend_->Describe());
}

void RdmaTransport::RegionRegistered(const MemoryRegion& r) {
  if (!backend_) return;
  std::string key = backend_->RegisterRegion(r.id, r.addr, r.size);  // may throw
  std::lock_guard<std::mutex> lock(keys_mu_);
  keys_[r.id] = std::move(key);
}

uint64_t RdmaTransport::RegionInFlight(uint64_t id) {
  // Remote RDMA reads and writes into the region are the NIC's: its count says.
  return backend_ ? backend_->InFlight(id) : 0;
}

void RdmaTransport::RegionWithdrawn(uint64_t id) {
  if (!backend_) return;
  {
    std::lock_guard<std::mutex> lock(keys_mu_);
    keys_.erase(id);
  }
  backend_->DeregisterRegion(id);
}

void RdmaTransport::PeerLost(const std::string& key, const std::string& why) {
  if (backend_) backend_->DisconnectPeer(key, why);
}

wire::WireStatus RdmaTransport::Accept(const std::string& initiator_key, const std::string& request,
                                       std::string* answer) {
  if (!backend_) return wire::WireStatus::kNoRdma;
  try {
    *answer = backend_->AcceptInitiator(initiator_key, request);
  } catch (const std::exception& e) {
    *answer = e.what();
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': RDMA connect from ", LogSafe(initiator_key),
                  " refused: ", e.what());
    return wire::WireStatus::kExportFailed;
  }
  return wire::WireStatus::kOk;
}

wire::WireStatus RdmaTransport::RegionKey(uint64_t mem_id, uint64_t capability,
                                          std::string* answer) {
  if (!backend_) return wire::WireStatus::kNoRdma;
  MemoryRegion r;
  if (!host_->memory().FindNamed(mem_id, capability, &r)) return wire::WireStatus::kUnknownMemory;
  std::lock_guard<std::mutex> lock(keys_mu_);
  auto it = keys_.find(mem_id);
  if (it == keys_.end()) return wire::WireStatus::kUnknownMemory;
  *answer = it->second;
  return wire::WireStatus::kOk;
}

std::shared_ptr<TransferState> RdmaTransport::Submit(const TransferRequest& req) {
  Peer& peer = *req.peer;
  const uint64_t remote_mem = req.remote.mem_id;
  ControlChannel& channel = host_->channel();
  rdma::RegionKey key;
  {
    PeerRdma& s = peer.StateOf<PeerRdma>(kRdmaSlot);
    std::lock_guard<std::mutex> lock(s.mu);
    StatusDetail code = StatusDetail::SUCCESS;
    std::string error;
    if (!s.connected) {
      std::string reply;
      try {
        std::string request = backend_->OpenInitiator(peer.key);
        if (!channel.SideRequest(peer, wire::MsgType::kRdmaConnect, wire::MsgType::kRdmaConnectAck,
                                 0, 0, request, &reply, &code, &error)) {
          return ControlHost::Finished(code, StrCat("RDMA: cannot connect to remote engine ",
                                                    LogSafe(peer.key), ": ", error));
        }
        backend_->CompleteInitiator(peer.key, reply);
      } catch (const std::exception& e) {
        return ControlHost::Finished(
            StatusDetail::ERR_TRANSPORT,
            StrCat("RDMA: cannot connect to remote engine ", LogSafe(peer.key), ": ", e.what()));
      }
      s.connected = true;
    }
    auto it = s.keys.find(remote_mem);
    if (it == s.keys.end()) {
      std::string blob;
      if (!channel.SideRequest(peer, wire::MsgType::kRdmaRegionReq, wire::MsgType::kRdmaRegionKey,
                               remote_mem, req.remote.capability, {}, &blob, &code, &error)) {
        return ControlHost::Finished(
            code, StrCat("RDMA: no key for memory ", remote_mem, " of remote engine ",
                         LogSafe(peer.key), ": ", error));
      }
      try {
        it = s.keys.emplace(remote_mem, rdma::DecodeRegionKey(blob)).first;
      } catch (const std::exception& e) {
        return ControlHost::Finished(StatusDetail::ERR_TRANSPORT, e.what());
      }
    }
    key = it->second;
  }
  // The target's registered length (from its key) bounds the transfer, not the
  // caller's MemoryDesc; the NIC enforces it again (remote access error).
  if (auto err = ControlHost::RemoteBoundsError(req, key.length)) return err;
  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state = host_->BeginTransfer(req.local, 1, false, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;
  static_assert(sizeof(TransferSpan) == sizeof(rdma::PlanSpan), "one span layout");
  try {
    backend_->Submit(
        req.op == Op::kWrite ? rdma::RdmaOp::kWrite : rdma::RdmaOp::kRead, req.local.id, peer.key,
        key, reinterpret_cast<const rdma::PlanSpan*>(req.spans), req.n, req.uid,
        [this, rid, weak = std::weak_ptr<Peer>(req.peer)](StatusDetail c, const std::string& m) {
          if (c != StatusDetail::SUCCESS) {
            // A failed work request leaves its RC QP in the error state (a stale key after
            // the target deregistered, a lost link): forget the QPs and keys so the next
            // transfer reconnects instead of every later transfer to this peer failing
            // behind the one bad request.
            if (std::shared_ptr<Peer> p = weak.lock()) {
              PeerRdma& s = p->StateOf<PeerRdma>(kRdmaSlot);
              std::lock_guard<std::mutex> lock(s.mu);
              s.connected = false;
              s.keys.clear();
            }
          }
          host_->CompletePart(rid, c, m);
        });
  } catch (const std::exception& e) {
    host_->CompletePart(rid, StatusDetail::ERR_INVALID_ARGS, StrCat("RDMA: ", e.what()));
  }
  return state;
}

}  // namespace mori::io
