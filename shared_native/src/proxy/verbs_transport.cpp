// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The proxy's ibverbs transport: see verbs_transport.hpp. Tested with the loopback
// double (shared_native/tests/test_proxy_verbs.cpp); NOT run against a NIC.
#include "verbs_transport.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "backoff.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/transport/socket.hpp"
#include "mori/transport/verbs/endpoint_codec.hpp"

namespace mori::proxy::internal {

namespace tv = transport::verbs;

namespace {

using Clock = std::chrono::steady_clock;

enum RecordKind : uint32_t { kAdd = 1, kFence = 2, kFenceAck = 3, kNotify = 4 };

constexpr uint64_t kRecvBit = uint64_t{1} << 63;
constexpr int kPeShift = 40;
constexpr uint64_t kLowMask = (uint64_t{1} << kPeShift) - 1;
constexpr int kMaxPes = 1 << 23;
constexpr size_t kKeyBlob = tv::kCodecHeaderBytes + tv::kRegionKeyEntryBytes;
constexpr size_t kEndpointBlob = tv::kCodecHeaderBytes + tv::kEndpointEntryBytes;

const char* KindName(uint32_t kind) {
  switch (kind) {
    case kAdd:
      return "add";
    case kFence:
      return "fence";
    case kFenceAck:
      return "fence ack";
    case kNotify:
      return "notify";
  }
  return "unknown record";
}

}  // namespace

struct VerbsTransport::Record {
  uint32_t kind;
  uint32_t from;
  uint64_t a;
  uint64_t b;
  uint64_t seq;
};

struct VerbsTransport::Peer {
  std::unique_ptr<tv::RdmaQueuePair> qp;
  tv::RegionKey heap;     // the peer's heap: address, length, rkey
  uint32_t depth = 0;     // send-queue slots used (<= the QP's)
  uint64_t posted = 0;    // WRs posted
  uint64_t retired = 0;   // WRs known complete
  uint64_t sent = 0;      // records sent (their sequence numbers)
  uint64_t received = 0;  // records received
  size_t recv_base = 0;   // offsets into records_
  size_t send_base = 0;
};

VerbsTransport::VerbsTransport(const HeapAccess* heap, std::unique_ptr<tv::RdmaPort> port,
                               std::string open_error, const VerbsOptions& options)
    : heap_(heap), port_(std::move(port)), open_error_(std::move(open_error)), options_(options) {
  MORI_CHECK_ARG(options.signal_interval >= 1 && options.send_depth >= options.signal_interval &&
                     options.recv_depth >= 1,
                 "proxy verbs transport: send_depth ", options.send_depth, ", recv_depth ",
                 options.recv_depth, ", signal_interval ", options.signal_interval,
                 " (need send_depth >= signal_interval >= 1, recv_depth >= 1)");
  if (port_ == nullptr && open_error_.empty()) open_error_ = "no RDMA port was opened";
}

VerbsTransport::~VerbsTransport() {
  peers_.clear();  // the QPs before the port
}

std::string VerbsTransport::Describe() const {
  return port_ ? port_->Describe() : StrCat("no port (", open_error_, ")");
}

void VerbsTransport::Lost(int pe, const std::string& stage, const std::string& detail) const {
  MORI_THROW(TransportError, heap_->Self(), ": ", heap_->PeName(pe), " lost over RDMA while ",
             stage, ": ", detail);
}

int VerbsTransport::CqEntriesNeeded(int peers, const VerbsOptions& o) {
  const uint64_t per_peer = o.send_depth / o.signal_interval + 2 + o.recv_depth;
  return static_cast<int>(std::min<uint64_t>(uint64_t(peers) * per_peer, INT32_MAX));
}

void VerbsTransport::Connect(bootstrap::Bootstrap& bootstrap, const std::vector<uint8_t>& use) {
  const int n = heap_->n_pes();
  const int me = heap_->my_pe();
  MORI_CHECK_ARG(static_cast<int>(use.size()) == n && n <= kMaxPes,
                 "proxy verbs transport: ", use.size(), " pe flags for ", n, " pes");
  peers_.clear();
  peers_.resize(n);
  std::string error = open_error_;
  std::vector<tv::EndpointInfo> endpoints(n);
  if (error.empty()) {
    try {
      try {
        heap_keys_ = port_->Register(heap_->my_base(), heap_->heap_size());
      } catch (const std::exception& e) {
        if (!heap_->cuda()) throw;
        // No staging path: a CUDA heap needs the NIC to reach GPU memory itself.
        MORI_THROW(NotSupportedError, "registering the CUDA heap with the NIC failed (", e.what(),
                   "): GPUDirect RDMA is not available (nvidia-peermem or dma-buf support); "
                   "MORI_PROXY_TRANSPORT=tcp stages CUDA heaps through host memory instead");
      }
      int used = 0;
      for (int pe = 0; pe < n; ++pe) used += use[pe] && pe != me;
      const size_t per_peer = (options_.recv_depth + options_.send_depth) * sizeof(Record);
      records_.assign(std::max<size_t>(1, used * per_peer), 0);
      record_keys_ = port_->Register(records_.data(), records_.size());
      max_message_ = port_->max_message_bytes();
      if (port_->cq_depth() < CqEntriesNeeded(used, options_)) {
        MORI_THROW(InvalidArgumentError, "the completion queue of ", port_->Describe(), " has ",
                   port_->cq_depth(), " entries, ", used, " queue pairs need up to ",
                   CqEntriesNeeded(used, options_));
      }
      size_t at = 0;
      for (int pe = 0; pe < n; ++pe) {
        if (!use[pe] || pe == me) continue;
        auto p = std::make_unique<Peer>();
        p->qp = port_->CreateQp(options_.send_depth, options_.recv_depth);
        p->depth = std::min(options_.send_depth, p->qp->send_depth());
        MORI_CHECK(
            p->depth >= options_.signal_interval && p->qp->recv_depth() >= options_.recv_depth,
            "RDMA QP capacities ", p->qp->send_depth(), "/", p->qp->recv_depth(),
            " below what the proxy needs");
        p->recv_base = at;
        p->send_base = at + options_.recv_depth * sizeof(Record);
        at += per_peer;
        endpoints[pe] = p->qp->LocalEndpoint();
        peers_[pe] = std::move(p);
      }
      if (heap_->cuda() && used > 0) {
        lane_ = std::make_unique<DeviceLane>(heap_->device(), 0,
                                             StrCat(heap_->Self(), " verbs receiver"));
      }
    } catch (const std::exception& e) {
      error = e.what();
      peers_.clear();
      peers_.resize(n);
    }
  }
  // ok: 0, heap key, one endpoint blob per pe (the QP that pe connects to); else 1, why.
  std::string blob;
  if (error.empty()) {
    blob.push_back('\0');
    blob += tv::EncodeRegionKey(
        {reinterpret_cast<uint64_t>(heap_->my_base()), heap_->heap_size(), heap_keys_.rkey});
    for (int pe = 0; pe < n; ++pe) blob += tv::EncodeEndpoints({endpoints[pe]});
  } else {
    blob.push_back('\1');
    blob += error;
  }
  auto all = bootstrap::AllGatherBytes(bootstrap, std::vector<uint8_t>(blob.begin(), blob.end()));
  std::string failed;
  for (int pe = 0; pe < n; ++pe) {
    const std::vector<uint8_t>& b = all[pe];
    if (!b.empty() && b[0] == 0 && b.size() == 1 + kKeyBlob + n * kEndpointBlob) continue;
    std::string why = b.size() > 1 && b[0] == 1
                          ? std::string(b.begin() + 1, b.end())
                          : StrCat("a malformed blob of ", b.size(), " bytes");
    failed += StrCat(failed.empty() ? "" : "; ", heap_->PeName(pe), ": ", why);
  }
  if (!failed.empty()) {
    MORI_THROW(NotSupportedError, heap_->Self(),
               ": MORI_PROXY_TRANSPORT=verbs cannot be used: ", failed);
  }
  // Connect every QP and post its receives; then a second all-gather, so a pe whose
  // QP failed to connect fails every pe (instead of leaving them in a barrier), and so
  // every QP is ready to receive before anyone sends.
  std::string connect_error;
  try {
    for (int pe = 0; pe < n; ++pe) {
      Peer* p = peers_[pe].get();
      if (p == nullptr) continue;
      const std::vector<uint8_t>& b = all[pe];
      const char* data = reinterpret_cast<const char*>(b.data()) + 1;
      p->heap = tv::DecodeRegionKey(std::string(data, kKeyBlob));
      MORI_CHECK(p->heap.length == heap_->heap_size(), heap_->PeName(pe), "'s heap has ",
                 p->heap.length, " bytes, this pe's ", heap_->heap_size());
      const tv::EndpointInfo ep =
          tv::DecodeEndpoints(std::string(data + kKeyBlob + me * kEndpointBlob, kEndpointBlob))
              .at(0);
      MORI_CHECK(ep.qpn != 0, heap_->PeName(pe), " has no queue pair for pe ", me,
                 " (the pes disagree on which pairs use RDMA)");
      p->qp->Connect(options_.qp, ep);
      std::vector<tv::RecvOp> recvs(options_.recv_depth);
      for (uint32_t i = 0; i < options_.recv_depth; ++i) {
        recvs[i] = {kRecvBit | (uint64_t(pe) << kPeShift) | i,
                    reinterpret_cast<uint64_t>(records_.data() + p->recv_base + i * sizeof(Record)),
                    sizeof(Record), record_keys_.lkey};
      }
      if (int rc = p->qp->PostRecv(recvs.data(), recvs.size()); rc != 0) {
        MORI_THROW(TransportError, "posting receives for ", heap_->PeName(pe), ": ",
                   transport::ErrnoText(rc));
      }
    }
  } catch (const std::exception& e) {
    connect_error = e.what();
  }
  auto connected = bootstrap::AllGatherBytes(
      bootstrap, std::vector<uint8_t>(connect_error.begin(), connect_error.end()));
  for (int pe = 0; pe < n; ++pe) {
    if (connected[pe].empty()) continue;
    failed += StrCat(failed.empty() ? "" : "; ", heap_->PeName(pe), ": ",
                     std::string(connected[pe].begin(), connected[pe].end()));
  }
  if (!failed.empty()) {
    MORI_THROW(TransportError, heap_->Self(), ": connecting the RDMA queue pairs failed: ", failed);
  }
  if (port_ != nullptr) MORI_LOG_INFO(kCore, heap_->Self(), ": RDMA over ", port_->Describe());
}

void VerbsTransport::WaitRoom(int pe) {
  Peer& p = *peers_[pe];
  if (p.posted - p.retired < p.depth) return;
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  Backoff idle;
  while (p.posted - p.retired >= p.depth) {
    if (Progress()) {
      idle.Reset();
      continue;
    }
    if (Clock::now() > deadline) {
      Lost(pe, "waiting for send-queue room",
           StrCat(p.posted - p.retired, " work requests not completed within ", options_.timeout_ms,
                  " ms"));
    }
    idle.Pause();
  }
}

uint64_t VerbsTransport::Post(int pe, tv::SendOp op, bool signaled) {
  Peer& p = *peers_[pe];
  WaitRoom(pe);
  const uint64_t number = p.posted;
  op.wr_id = (uint64_t(pe) << kPeShift) | (number & kLowMask);
  // Every signal_interval-th WR is signaled, so a full queue always has a completion due.
  op.signaled = signaled || (number + 1) % options_.signal_interval == 0;
  if (int rc = p.qp->PostSend(&op, 1); rc != 0) {
    Lost(pe, StrCat("posting work request ", number), transport::ErrnoText(rc));
  }
  ++p.posted;
  return number;
}

void VerbsTransport::WaitRetired(int pe, uint64_t upto, const char* stage) {
  Peer& p = *peers_[pe];
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  Backoff idle;
  while (p.retired < upto) {
    if (Progress()) {
      idle.Reset();
      continue;
    }
    if (Clock::now() > deadline) {
      Lost(pe, stage, StrCat("not completed within ", options_.timeout_ms, " ms"));
    }
    idle.Pause();
  }
}

void VerbsTransport::PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) {
  MORI_CHECK(peers_.at(pe) != nullptr, heap_->Self(), ": ", heap_->PeName(pe),
             " is not reached over RDMA");
  if (nbytes == 0) return;
  const Peer& p = *peers_[pe];
  const uint64_t src = reinterpret_cast<uint64_t>(heap_->my_base()) + src_offset;
  const uint64_t dst = p.heap.addr + dst_offset;
  uint64_t last = 0;
  for (uint64_t done = 0; done < nbytes;) {
    const uint64_t len = std::min(nbytes - done, max_message_);
    tv::SendOp op;
    op.opcode = tv::WrOpcode::kWrite;
    op.local_addr = src + done;
    op.length = static_cast<uint32_t>(len);
    op.lkey = heap_keys_.lkey;
    op.remote_addr = dst + done;
    op.rkey = p.heap.rkey;
    done += len;
    last = Post(pe, op, done == nbytes);
  }
  // The proxy retires the command (the producer may reuse the source) on return.
  WaitRetired(pe, last + 1, StrCat("an RDMA WRITE of ", nbytes, " bytes").c_str());
}

void VerbsTransport::SendRecord(int pe, uint32_t kind, uint64_t a, uint64_t b) {
  MORI_CHECK(peers_.at(pe) != nullptr, heap_->Self(), ": ", heap_->PeName(pe),
             " is not reached over RDMA");
  WaitRoom(pe);
  Peer& p = *peers_[pe];
  // Indexed by the WR's number: the slot's previous WR (depth WRs earlier) has
  // completed, since the queue had room.
  char* slot = records_.data() + p.send_base + (p.posted % p.depth) * sizeof(Record);
  static_assert(sizeof(Record) == 32, "records are 32 bytes");
  Record r{kind, static_cast<uint32_t>(heap_->my_pe()), a, b, p.sent++};
  std::memcpy(slot, &r, sizeof(r));
  tv::SendOp op;
  op.opcode = tv::WrOpcode::kSend;
  op.local_addr = reinterpret_cast<uint64_t>(slot);
  op.length = sizeof(Record);
  op.lkey = record_keys_.lkey;
  Post(pe, op, false);
}

void VerbsTransport::PostAtomicAdd(int pe, uint64_t offset, uint64_t value) {
  SendRecord(pe, kAdd, offset, value);
}

void VerbsTransport::PostFence(int pe, uint64_t token) { SendRecord(pe, kFence, token, 0); }

void VerbsTransport::PostNotify(int pe, uint64_t value) { SendRecord(pe, kNotify, value, 0); }

bool VerbsTransport::Progress() {
  if (port_ == nullptr) return false;
  tv::WorkCompletion wcs[32];
  const int got = port_->Poll(wcs, 32);
  for (int i = 0; i < got; ++i) Handle(wcs[i]);
  return got > 0;
}

void VerbsTransport::Handle(const tv::WorkCompletion& wc) {
  const int pe = static_cast<int>((wc.wr_id & ~kRecvBit) >> kPeShift);
  const uint64_t low = wc.wr_id & kLowMask;
  if (pe < 0 || pe >= heap_->n_pes() || peers_[pe] == nullptr) {
    MORI_THROW(InternalError, heap_->Self(), ": RDMA completion with unknown wr_id 0x", std::hex,
               wc.wr_id);
  }
  Peer& p = *peers_[pe];
  // From our wr_id, not wc.recv: a failed completion's opcode is undefined in ibverbs.
  const bool recv = (wc.wr_id & kRecvBit) != 0;
  if (wc.status != tv::kWcSuccess) {
    if (shutting_down_) {
      p.retired = p.posted;  // the QP is in error: everything on it was flushed
      return;
    }
    Lost(pe, recv ? "receiving a record" : StrCat("RDMA work request ", low),
         StrCat(tv::WcStatusName(wc.status), ": ", tv::WcStatusHint(wc.status)));
  }
  if (!recv) {
    // In-order completion: this WR and every unsignaled one before it are done. (WR
    // numbers are carried in 40 bits: 2^40 WRs to one pe are not reached.)
    p.retired = std::max(p.retired, low + 1);
    return;
  }
  Apply(pe, static_cast<uint32_t>(low), wc.byte_len);
  tv::RecvOp again{wc.wr_id,
                   reinterpret_cast<uint64_t>(records_.data() + p.recv_base + low * sizeof(Record)),
                   sizeof(Record), record_keys_.lkey};
  if (int rc = p.qp->PostRecv(&again, 1); rc != 0) {
    Lost(pe, "reposting a receive", transport::ErrnoText(rc));
  }
}

void VerbsTransport::Apply(int pe, uint32_t slot, uint32_t byte_len) {
  Peer& p = *peers_[pe];
  MORI_CHECK(slot < options_.recv_depth, "RDMA receive slot ", slot);
  Record r;
  std::memcpy(&r, records_.data() + p.recv_base + slot * sizeof(Record), sizeof(r));
  if (byte_len != sizeof(Record) || r.from != static_cast<uint32_t>(pe) || r.seq != p.received) {
    Lost(pe, "receiving a record",
         StrCat("a record of ", byte_len, " bytes from pe ", r.from, " with sequence ", r.seq,
                " (expected 32 bytes from pe ", pe, ", sequence ", p.received, ")"));
  }
  ++p.received;
  switch (r.kind) {
    case kAdd:
      if (r.a % 8 != 0 || !heap_->InHeap(r.a, 8)) {
        Lost(pe, "applying an add",
             StrCat("signal offset ", r.a, " is not an 8-byte aligned word of the heap of ",
                    heap_->heap_size(), " bytes"));
      }
      if (lane_) {
        lane_->Add(reinterpret_cast<uint64_t*>(heap_->my_base() + r.a), r.b);
      } else {
        heap_->HostAtomicAdd(r.a, r.b);
      }
      return;
    case kFence:
      if (lane_ && lane_->pending()) lane_->Sync();
      acks_to_send_.emplace_back(pe, r.a);
      return;
    case kFenceAck:
      notices_.push_back({Completion::Kind::kFenceAck, pe, r.a});
      return;
    case kNotify:
      if (lane_ && lane_->pending()) lane_->Sync();
      notices_.push_back({Completion::Kind::kNotify, pe, r.a});
      return;
    default:
      Lost(pe, "receiving a record",
           StrCat("unknown record kind ", r.kind, " (", KindName(r.kind), ")"));
  }
}

void VerbsTransport::SendPendingAcks() {
  while (!acks_to_send_.empty()) {
    std::vector<std::pair<int, uint64_t>> acks;
    acks.swap(acks_to_send_);
    for (const auto& [pe, token] : acks) SendRecord(pe, kFenceAck, token, 0);
  }
}

void VerbsTransport::Poll(std::vector<Completion>* out) {
  for (int k = 0; k < 4 && Progress(); ++k) {
  }
  if (!shutting_down_) SendPendingAcks();
  out->insert(out->end(), notices_.begin(), notices_.end());
  notices_.clear();
}

void VerbsTransport::Shutdown() {
  // Destroying a QP drops the WRs it still holds: wait until the NIC has delivered
  // what was posted (the close barrier's notifies included). A zero-length signaled
  // WRITE covers the unsignaled WRs before it. Failures now are flushes of peers that
  // went first; they retire everything (Handle).
  shutting_down_ = true;
  for (int pe = 0; pe < static_cast<int>(peers_.size()); ++pe) {
    Peer* p = peers_[pe].get();
    if (p == nullptr || p->retired >= p->posted) continue;
    try {
      tv::SendOp op;
      op.opcode = tv::WrOpcode::kWrite;
      op.local_addr = reinterpret_cast<uint64_t>(heap_->my_base());
      op.lkey = heap_keys_.lkey;
      op.remote_addr = p->heap.addr;
      op.rkey = p->heap.rkey;
      const uint64_t last = Post(pe, op, true);
      WaitRetired(pe, last + 1, "delivering its last records at shutdown");
    } catch (const std::exception& e) {
      MORI_LOG_WARN(kCore, e.what());
    }
  }
}

}  // namespace mori::proxy::internal
