// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// The reactor's read path: headers, payloads (received in place or staged for GPU
// memory), the target's checks, requests (TCP's kWrite/kRead here, every other type
// through ControlHandlers) and the initiator's answers.
#include "control/reactor.hpp"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "control/answer_reader.hpp"
#include "control/control_channel.hpp"
#include "control/control_handlers.hpp"
#include "control/control_host.hpp"
#include "control/reactor_limits.hpp"
#include "control/socket_io.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/telemetry.hpp"
#include "registry/gpu_staging.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

using namespace reactor_limits;  // NOLINT(build/namespaces)

void Reactor::PaceRequests(Conn& c) {
  if (c.outbound || c.dead) return;
  const bool pause = c.sendq.size() > kPauseQueuedItems || c.queued_bytes > kPauseQueuedBytes;
  const bool resume = c.sendq.size() <= kResumeQueuedItems && c.queued_bytes <= kResumeQueuedBytes;
  if ((!c.in_paused && pause) || (c.in_paused && resume)) {
    c.in_paused = !c.in_paused;
    ArmOut(c, c.out_armed);
  }
}

void Reactor::StartPayload(Conn& c, uint64_t length, char* dst) {
  if (length < kDirectRecvMin || dst == nullptr) c.header_only = false;
  c.in_payload = true;
  c.payload_left = length;
  c.payload_dst = dst;
  if (!c.outbound) {  // its pace is checked (CloseStuck)
    c.payload_since_ns = NowNs();
    c.payload_bytes = length;
  }
  // An empty payload is never a hello (HandleHeader refused it), so this cannot fail.
  if (length == 0) FinishPayload(c);
}

bool Reactor::ReceiveRequestPayload(Conn& c, uint64_t max, std::string* why) {
  if (c.cur.length > max || !SideAnswerRoom(c)) {
    *why = StrCat("a request of type ", int(c.cur.type), " with ", c.cur.length,
                  " payload bytes (at most ", max, "), or too many on one connection");
    return false;
  }
  c.request_payload.resize(c.cur.length);
  StartPayload(c, c.cur.length, c.request_payload.data());
  return true;
}

// Receives the next payload of `length` bytes for GPU memory at dst (device dev) into a
// staging buffer; FinishPayload copies it over.
void Reactor::StagePayload(Conn& c, uint64_t length, char* dst, int dev) {
  c.stage_in = staging::Buffer(length);
  c.stage_dst = dst;
  c.stage_dev = dev;
  StartPayload(c, length, c.stage_in.get());
}

// Copies a staged payload to its GPU destination; "" or why it failed.
std::string Reactor::Unstage(Conn& c, uint64_t length) {
  if (c.stage_dst == nullptr) return {};
  std::string error;
  try {
    staging::ToDevice(c.stage_dst, c.stage_in.get(), length, c.stage_dev);
  } catch (const std::exception& e) {
    error = StrCat("copying ", length, " staged bytes to GPU ", c.stage_dev, " failed: ", e.what());
  }
  c.stage_in.reset();
  c.stage_dst = nullptr;
  c.stage_dev = -1;
  return error;
}

// False: the connection must be closed (a hello without our secret).
bool Reactor::FinishPayload(Conn& c) {
  c.in_payload = false;
  const wire::Header& h = c.cur;
  std::string stage_error = Unstage(c, c.cur.length);
  if (c.outbound) {
    host_->CompletePart(c.cur_pending.record_id,
                        stage_error.empty() ? StatusDetail::SUCCESS : StatusDetail::ERR_GPU_OP,
                        stage_error);
    return true;
  }
  if (!c.hello_done) return FinishHello(c);
  if (const ControlHandlers::Payload* handler = handlers_.payload(h.type)) {
    (*handler)(*this, c);
    std::string().swap(c.request_payload);
    return true;
  }
  if (!stage_error.empty()) {
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': inbound write from ", LogSafe(c.remote_key),
                  ": ", stage_error);
    c.cur_status = wire::WireStatus::kCopyFailed;
  }
  if (c.cur_use != nullptr) {
    c.cur_use->Leave();
    c.cur_use = nullptr;
  }
  // A write's bytes are in place: acknowledge, then account the inbound part, so a
  // notification never precedes its data.
  wire::Header ack{};
  ack.type = static_cast<uint8_t>(wire::MsgType::kWriteAck);
  ack.status = static_cast<uint8_t>(c.cur_status);
  ack.version = wire::kVersion;
  ack.num_parts = h.num_parts;
  ack.uid = h.uid;
  ack.mem_id = h.mem_id;
  ack.offset = h.offset;
  ack.length = h.length;
  c.out_local.push_back({ack, nullptr, 0, 0, nullptr});
  Account(c, h, c.cur_status);
  return true;
}

RegionLookup Reactor::Target(Conn&, const wire::Header& h, bool enter, bool allow_gpu) {
  return host_->memory().Check(h.mem_id, h.capability, h.offset, h.length, enter, allow_gpu);
}

// Recorded at once, before the part's answer leaves (answers are queued for the end of
// the read pass): an initiator that saw its write acked may tell the target's
// application, which then finds the inbound status.
void Reactor::Account(Conn& c, const wire::Header& h, wire::WireStatus status) {
  InboundPart part{h.uid, h.num_parts, status, h.mem_id, h.offset, h.length};
  host_->inbound().Record(c.remote_key, &part, 1);
}

std::string Reactor::Refusal(const Conn& c, const Pending& p, wire::WireStatus s) {
  return StrCat(p.write ? "write" : "read", " of ", p.length, " bytes at offset ", p.offset,
                " of memory ", p.mem_id, " of remote engine ", LogSafe(c.remote_key),
                " refused by the target: ", wire::WireStatusText(s));
}

bool Reactor::SideAnswerRoom(const Conn& c) { return c.side_answers.size() < kMaxSideAnswers; }

void Reactor::SideAnswer(Conn& c, const wire::Header& h, wire::MsgType type, wire::WireStatus st,
                         std::string payload) {
  c.side_answers.push_back(std::move(payload));
  const std::string& g = c.side_answers.back();
  wire::Header r = h;
  r.type = static_cast<uint8_t>(type);
  r.status = static_cast<uint8_t>(st);
  r.length = g.size();
  c.out_local.push_back({r, g.data(), g.size(), 0, nullptr});
}

bool Reactor::ExtentVerdict(const Conn& c, const wire::Header& h, wire::WireStatus* refused,
                            std::string* why) {
  *refused = wire::WireStatus::kOk;
  if (h.num_parts <= 1) return true;  // the part is the whole transfer
  if (!c.extent_set || c.extent_uid != h.uid || c.extent_mem != h.mem_id) {
    *why = StrCat("part of transfer ", h.uid, " (", h.num_parts, " parts) into memory ", h.mem_id,
                  " without its extent");
    return false;
  }
  *refused = c.extent_status;
  return true;
}

// Returns false on a protocol violation (the connection is then closed).
bool Reactor::HandleHeader(Conn& c, std::string* why) {
  const wire::Header& h = c.cur;
  if (h.version != wire::kVersion) {
    *why = StrCat("wire version ", h.version, " (this engine speaks ", wire::kVersion, ")");
    return false;
  }
  if (c.outbound) return HandleResponse(c, why);
  if (!c.hello_done) {
    if (static_cast<wire::MsgType>(h.type) != wire::MsgType::kHello ||
        h.length < wire::kSecretBytes || h.length > 2 * wire::kSecretBytes + 4096 ||
        (h.num_parts > 0 && h.length != 2 * wire::kSecretBytes + h.num_parts)) {
      *why = StrCat("first message is not a hello (type ", int(h.type), ", ", h.length, " bytes)");
      host_->CountRefusedHello();
      return false;
    }
    c.hello.resize(h.length);
    StartPayload(c, h.length, c.hello.data());
    return true;
  }
  return HandleRequest(c, why);
}

// Target side: TCP's own requests here, every other through its transport's handler.
bool Reactor::HandleRequest(Conn& c, std::string* why) {
  const wire::Header& h = c.cur;
  auto type = static_cast<wire::MsgType>(h.type);
  if (type == wire::MsgType::kTransferExtent) {
    MemoryRegion r{};
    wire::WireStatus st = wire::WireStatus::kOk;
    if (!host_->memory().FindNamed(h.mem_id, h.capability, &r)) {
      st = wire::WireStatus::kUnknownMemory;
    } else if (h.length > r.size || h.offset > r.size - h.length) {
      st = wire::WireStatus::kOutOfBounds;
    }
    c.extent_set = true;
    c.extent_uid = h.uid;
    c.extent_mem = h.mem_id;
    c.extent_status = st;
    return true;  // not answered
  }
  if (type == wire::MsgType::kWrite) {
    wire::WireStatus refused;
    if (!ExtentVerdict(c, h, &refused, why)) return false;
    RegionLookup lk = refused != wire::WireStatus::kOk ? RegionLookup{refused, nullptr}
                                                       : Target(c, h, true, true);
    c.cur_use = lk.use;
    c.cur_status = lk.status;
    if (lk.status == wire::WireStatus::kOk && lk.gpu_device >= 0) {
      StagePayload(c, h.length, lk.base + h.offset, lk.gpu_device);
      return true;
    }
    StartPayload(c, h.length, lk.status == wire::WireStatus::kOk ? lk.base + h.offset : nullptr);
    return true;
  }
  if (type == wire::MsgType::kRead) {
    wire::WireStatus refused;
    if (!ExtentVerdict(c, h, &refused, why)) return false;
    RegionLookup lk = refused != wire::WireStatus::kOk ? RegionLookup{refused, nullptr}
                                                       : Target(c, h, true, true);
    std::shared_ptr<char> staged;
    if (lk.status == wire::WireStatus::kOk && lk.gpu_device >= 0) {
      // Served from a host copy: the region is free again once it is taken.
      try {
        staged = staging::Buffer(h.length);
        staging::ToHost(staged.get(), lk.base + h.offset, h.length, lk.gpu_device);
      } catch (const std::exception& e) {
        MORI_LOG_WARN(kIo, "engine '", host_->key(), "': read by ", LogSafe(c.remote_key),
                      " of GPU memory ", h.mem_id, ": ", e.what());
        lk.status = wire::WireStatus::kCopyFailed;
      }
      lk.use->Leave();
      lk.use = nullptr;
    }
    bool ok = lk.status == wire::WireStatus::kOk;
    wire::Header r = h;
    r.type = static_cast<uint8_t>(wire::MsgType::kReadData);
    r.status = static_cast<uint8_t>(lk.status);
    r.length = ok ? h.length : 0;
    const char* src = !ok ? nullptr : staged ? staged.get() : lk.base + h.offset;
    c.out_local.push_back({r, src, ok ? h.length : 0, 0, lk.use, std::move(staged)});
    Account(c, h, lk.status);
    return true;
  }
  if (const ControlHandlers::Request* handler = handlers_.request(h.type)) {
    return (*handler)(*this, c, why);
  }
  *why = StrCat("unexpected message type ", int(h.type), " from an initiator");
  return false;
}

// Initiator side: a target's notice, or the response to our oldest pending request.
bool Reactor::HandleResponse(Conn& c, std::string* why) {
  const wire::Header& h = c.cur;
  auto type = static_cast<wire::MsgType>(h.type);
  if (const ControlHandlers::Notice* notice = handlers_.notice(h.type)) {
    return (*notice)(*this, c, why);
  }
  Pending p;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.pending.empty()) {
      *why = "a response with no request pending";
      return false;
    }
    p = c.pending.front();
    c.pending.pop_front();
  }
  auto status = static_cast<wire::WireStatus>(h.status);
  bool ok = status == wire::WireStatus::kOk;
  if (type == wire::MsgType::kWriteAck && p.type == wire::MsgType::kWrite) {
    host_->CompletePart(p.record_id, wire::WireStatusCode(status), ok ? "" : Refusal(c, p, status));
    return true;
  }
  if (type == wire::MsgType::kReadData && p.type == wire::MsgType::kRead) {
    c.cur_pending = p;
    if (!ok) {
      host_->CompletePart(p.record_id, wire::WireStatusCode(status), Refusal(c, p, status));
      return true;
    }
    if (h.length != p.length) {
      *why = StrCat("read response of ", h.length, " bytes for a request of ", p.length);
      c.in_payload = true;  // so Close fails this part too
      return false;
    }
    if (p.gpu_device >= 0) {
      StagePayload(c, h.length, p.local, p.gpu_device);
    } else {
      StartPayload(c, h.length, p.local);
    }
    return true;
  }
  if (const ControlHandlers::Response* handler = handlers_.response(h.type, p.type)) {
    return (*handler)(*this, c, p, why);
  }
  *why = StrCat("response type ", int(h.type), " does not match the pending request");
  // Put it back so Close fails it.
  std::lock_guard<std::mutex> lock(c.mu);
  c.pending.push_front(p);
  return false;
}

bool Reactor::OnReadable(Conn& c) {
  int owner = kRxFree;
  if (!c.rx_owner.compare_exchange_strong(owner, kRxReactor, std::memory_order_acquire)) {
    // A waiting thread reads this connection's answers (its EPOLLIN is off meanwhile; an
    // event from before that, or a hang-up, comes back once it hands the socket back).
    if (owner != kRxLent) return true;
    // Lent to a waiter that has not come: read as before (a hang-up, a stale event).
    std::lock_guard<std::mutex> lock(c.mu);
    RevokeLend(c);
    owner = kRxFree;
    if (!c.rx_owner.compare_exchange_strong(owner, kRxReactor, std::memory_order_acquire)) {
      return true;
    }
  }
  struct Release {
    Conn& c;
    ~Release() { c.rx_owner.store(kRxFree, std::memory_order_release); }
  } release{c};
  MORI_SCOPED_TIMER(kIo, "io.tcp.on_readable");
  c.rx_ns = NowNs();
  size_t budget = kReadBudget;
  // A recv that returned less than it asked for emptied the socket: if the buffered
  // bytes then end at a message boundary, the pass ends without another recv (it would
  // return EAGAIN; level-triggered epoll reports bytes that arrive later). Within a
  // message its next bytes are on their way (a payload streaming in): read on.
  bool drained = false;
  std::string why;
  for (;;) {
    if (c.in_payload) {
      size_t avail = c.rlen - c.rpos;
      if (avail > 0) {
        size_t k = static_cast<size_t>(std::min<uint64_t>(avail, c.payload_left));
        if (c.payload_dst != nullptr) {
          std::memcpy(c.payload_dst, c.rbuf.data() + c.rpos, k);
          c.payload_dst += k;
        }
        c.rpos += k;
        c.payload_left -= k;
        if (c.payload_left == 0 && !FinishPayload(c)) {
          Close(c, "hello refused");
          return false;
        }
        continue;
      }
      if (c.payload_left >= kDirectRecvMin && c.payload_dst != nullptr && budget > 0) {
        ssize_t n = ::recv(c.fd, c.payload_dst, c.payload_left, 0);
        if (n > 0) {
          c.payload_dst += n;
          c.payload_left -= static_cast<uint64_t>(n);
          budget -= std::min(budget, static_cast<size_t>(n));
          if (c.payload_left == 0) {
            c.header_only = true;
            if (!FinishPayload(c)) {
              Close(c, "hello refused");
              return false;
            }
          }
          continue;
        }
        if (!HandleRecvResult(c, n)) return false;
        break;
      }
    } else {
      size_t avail = c.rlen - c.rpos;
      if (avail >= kHdr) {
        std::memcpy(&c.cur, c.rbuf.data() + c.rpos, kHdr);
        c.rpos += kHdr;
        c.header_since_ns = 0;
        if (!HandleHeader(c, &why)) {
          Close(c, StrCat("protocol error: ", why));
          return false;
        }
        if (!c.in_payload) c.header_only = false;  // acks and read requests come in runs
        continue;
      }
      if (c.rpos > 0) {
        std::memmove(c.rbuf.data(), c.rbuf.data() + c.rpos, avail);
        c.rlen = avail;
        c.rpos = 0;
      }
    }
    if (budget == 0) break;
    if (c.rpos == c.rlen) c.rpos = c.rlen = 0;
    size_t want = c.rbuf.size() - c.rlen;
    const bool whole = !(c.header_only && !c.in_payload && c.rlen - c.rpos < kHdr);
    if (!whole) want = kHdr - (c.rlen - c.rpos);
    if (drained && !c.in_payload && c.rpos == c.rlen) break;
    ssize_t n = ::recv(c.fd, c.rbuf.data() + c.rlen, want, 0);
    if (n > 0) {
      drained = static_cast<size_t>(n) < want;
      c.rlen += static_cast<size_t>(n);
      budget -= std::min(budget, static_cast<size_t>(n));
      // Traffic filled the buffer: it grows, once the peer proved who it is.
      if (whole && !drained && !c.rbuf.large() && (c.outbound || c.hello_done) &&
          c.rbuf.Grow(c.rpos, c.rlen)) {
        c.rlen -= c.rpos;
        c.rpos = 0;
      }
      continue;
    }
    if (!HandleRecvResult(c, n)) return false;
    break;
  }
  // A header left incomplete starts its clock (inbound; CloseStuck).
  if (!c.outbound && !c.in_payload && c.rlen > c.rpos && c.header_since_ns == 0) {
    c.header_since_ns = c.rx_ns;
  }
  return FlushResponses(c);
}

// n <= 0 from recv: false when the connection was closed.
bool Reactor::HandleRecvResult(Conn& c, ssize_t n) {
  if (n == 0) {
    Close(c, "connection closed by the peer");
    return false;
  }
  if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return true;
  Close(c, StrCat("receive failed: ", ErrnoText(errno)));
  return false;
}

bool Reactor::FlushResponses(Conn& c) {
  if (c.out_local.empty() && !c.need_flush) return true;
  int err;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.sendq.empty()) c.progress_ns = NowNs();
    for (SendItem& it : c.out_local) {
      c.sendq.push_back(it);
      if (!c.outbound) c.queued_bytes += it.len;
    }
    c.need_flush = false;
    if (c.dead) {
      LeaveAll(c.sendq);
      err = 0;
    } else {
      err = FlushLocked(c);
      PaceRequests(c);
    }
  }
  c.out_local.clear();
  if (err != 0) {
    Close(c, StrCat("send failed: ", ErrnoText(err)));
    return false;
  }
  return true;
}

}  // namespace mori::io
