// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "tcp_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/transport/socket.hpp"

namespace mori::proxy::internal {
namespace {

// Staging regions start at multiples of this (whole cache lines for the copies).
constexpr size_t kStagingAlign = 64;
size_t AlignUp(size_t n) { return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

using Clock = std::chrono::steady_clock;

constexpr uint32_t kFrameMagic = 0x5852506d;  // "mPRX"
constexpr uint64_t kHelloMagic = 0x6f6c6c6568787270ull;

enum FrameOp : uint32_t {
  kFrameWrite = 1,     // offset, arg = nbytes; payload follows
  kFrameAdd = 2,       // offset, arg = value
  kFrameFence = 3,     // arg = token; answered with kFrameFenceAck
  kFrameNotify = 4,    // arg = value
  kFrameBye = 5,       // the sender's proxy closes in order: EOF after it is no error
  kFrameFenceAck = 6,  // receiver -> sender, arg = token
};

struct Hello {
  uint64_t magic;
  uint64_t session;
  int32_t src_pe;
  int32_t dst_pe;
};

// Small writes travel in the send buffer with their header; a buffer is sent when it
// reaches kFlushBytes or at the end of the proxy's round (Poll).
constexpr uint64_t kInlinePayload = 4096;
constexpr size_t kFlushBytes = 256 << 10;
// The receiver reads up to kInBufBytes at a time; the rest of a payload that is at
// least kDirectRecv bytes is received straight into its destination.
constexpr size_t kInBufBytes = 64 << 10;
constexpr uint64_t kDirectRecv = 4096;
// Frames a receiver turn applies from one peer before looking at the others.
constexpr int kFramesPerTurn = 256;

}  // namespace

struct TcpTransport::Frame {
  uint32_t magic;
  uint32_t op;
  uint64_t offset;
  uint64_t arg;
};

TcpTransport::TcpTransport(const HeapAccess* heap, const TcpOptions& options)
    : heap_(heap), options_(options) {
  if (heap_->cuda()) {
    // Made here, on the thread that builds the proxy: see the rule in device_lane.cpp.
    send_lane_ =
        std::make_unique<DeviceLane>(heap_->device(), options_.staging_bytes,
                                     StrCat(heap_->Self(), " stream (tcp sender, mapped)"));
    recv_lane_ = std::make_unique<DeviceLane>(heap_->device(), options_.staging_bytes,
                                              StrCat(heap_->Self(), " tcp receiver"));
  }
  const int n = heap_->n_pes();
  out_fds_.assign(n, -1);
  in_fds_.assign(n, -1);
  out_buf_.resize(n);
  staged_.resize(n);
  in_buf_.resize(n);
  for (InBuf& b : in_buf_) b.data.resize(kInBufBytes);
  for (int i = 0; i < n; ++i) bye_from_.push_back(std::make_unique<std::atomic<bool>>(false));
  listen_fd_ =
      transport::ListenOn("0.0.0.0", 0, StrCat("the proxy of pe ", heap_->my_pe()), &port_);
  if (::pipe2(wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    MORI_THROW(TransportError, "proxy: pipe2 failed: ", transport::ErrnoText(errno));
  }
}

TcpTransport::~TcpTransport() {
  stop_.store(true);
  if (wake_fds_[1] >= 0) {
    char c = 1;
    (void)!::write(wake_fds_[1], &c, 1);
  }
  if (receiver_.joinable()) receiver_.join();
  for (int fd : out_fds_)
    if (fd >= 0) ::close(fd);
  for (int fd : in_fds_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_fds_)
    if (fd >= 0) ::close(fd);
}

std::string TcpTransport::Lost(int pe, const std::string& stage, const std::string& detail) const {
  return StrCat(heap_->Self(), ": ", heap_->PeName(pe), " lost while ", stage, ": ", detail);
}

void TcpTransport::Connect(bootstrap::Bootstrap& bootstrap) {
  const int n = heap_->n_pes();
  const int me = heap_->my_pe();
  const auto& peers = heap_->peers();
  transport::SocketOptions so;
  so.peer_timeout_ms = options_.timeout_ms;
  // Outbound: the kernel completes the handshake from the peer's backlog, so every pe
  // connects first and accepts after.
  for (int pe = 0; pe < n; ++pe) {
    if (pe == me) continue;
    const bool same_host = peers[pe].host_id == peers[me].host_id;
    const std::string host = same_host ? "127.0.0.1" : peers[pe].address;
    std::string error;
    int fd = transport::ConnectTo(host, peers[pe].port, options_.timeout_ms, &error);
    if (fd < 0) {
      MORI_THROW(TransportError, "proxy of pe ", me, ": cannot connect to ", heap_->PeName(pe),
                 " at ", host, ":", peers[pe].port, ": ", error,
                 same_host ? "" : " (set MORI_PROXY_HOST on that pe to an address reachable here)");
    }
    transport::SetSocketOptions(fd, so);
    out_fds_[pe] = fd;
    Hello h{kHelloMagic, options_.session, me, pe};
    if (!transport::SendAll(fd, reinterpret_cast<const char*>(&h), sizeof(h), options_.timeout_ms,
                            &error)) {
      MORI_THROW(TransportError, "proxy of pe ", me, ": hello to ", heap_->PeName(pe),
                 " failed: ", error);
    }
  }
  // Inbound: one stream from every other pe, each waits bounded.
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  int missing = n - 1;
  while (missing > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      std::string who;
      for (int pe = 0; pe < n; ++pe)
        if (pe != me && in_fds_[pe] < 0) who += StrCat(who.empty() ? "" : ", ", heap_->PeName(pe));
      MORI_THROW(TimeoutError, "proxy of pe ", me, ": no stream from ", who, " within ",
                 options_.timeout_ms, " ms");
    }
    pollfd p{listen_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    Hello h{};
    std::string error;
    if (!transport::RecvAll(fd, reinterpret_cast<char*>(&h), sizeof(h), options_.timeout_ms,
                            &error) ||
        h.magic != kHelloMagic || h.session != options_.session || h.dst_pe != me || h.src_pe < 0 ||
        h.src_pe >= n || h.src_pe == me || in_fds_[h.src_pe] >= 0) {
      MORI_LOG_WARN(kCore, "proxy of pe ", me, ": dropping a connection that is not a stream of ",
                    "this job's proxies", error.empty() ? "" : ": ", error);
      ::close(fd);
      continue;
    }
    transport::SetSocketOptions(fd, so);
    in_fds_[h.src_pe] = fd;
    --missing;
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  receiver_ = std::thread([this] { ReceiverLoop(); });
}

void TcpTransport::SetError(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = why;
  failed_.store(true, std::memory_order_release);
}

void TcpTransport::ThrowError() {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = error_;
  }
  MORI_THROW(TransportError, why);
}

void TcpTransport::SendRaw(int pe, const char* data, uint64_t nbytes) {
  std::string error;
  if (!transport::SendAll(out_fds_[pe], data, nbytes, options_.timeout_ms, &error)) {
    SetError(Lost(pe, "sending to it", error));
    ThrowError();
  }
}

void TcpTransport::Flush(int pe) {
  std::vector<char>& buf = out_buf_[pe];
  std::vector<StagedPiece>& pieces = staged_[pe];
  if (pieces.empty()) {
    if (buf.empty()) return;
    SendRaw(pe, buf.data(), buf.size());
    buf.clear();
    return;
  }
  // The staged payloads are sent only once their copies completed: one wait for every
  // copy enqueued so far (the lane's stream runs them in order).
  try {
    send_lane_->Sync();
  } catch (const CudaError& e) {
    MORI_THROW(CudaError, "staging this round's writes (tcp and mapped): ", e.what());
  }
  iov_.clear();
  size_t from = 0;
  for (const StagedPiece& p : pieces) {
    if (p.buf_end > from) iov_.push_back(iovec{buf.data() + from, p.buf_end - from});
    iov_.push_back(iovec{send_lane_->staging() + p.at, p.len});
    from = p.buf_end;
  }
  if (buf.size() > from) iov_.push_back(iovec{buf.data() + from, buf.size() - from});
  SendVec(pe, iov_.data(), iov_.size());
  buf.clear();
  staged_count_ -= pieces.size();
  pieces.clear();
  if (staged_count_ == 0) send_used_ = 0;
}

void TcpTransport::FlushAll() {
  for (int pe = 0; pe < heap_->n_pes(); ++pe) {
    if (out_fds_[pe] >= 0) Flush(pe);
  }
}

void TcpTransport::SendWithPayload(int pe, const char* payload, uint64_t nbytes) {
  std::vector<char>& buf = out_buf_[pe];
  iovec iov[2] = {{buf.data(), buf.size()}, {const_cast<char*>(payload), nbytes}};
  SendVec(pe, iov, 2);
  buf.clear();
}

void TcpTransport::SendVec(int pe, iovec* iov, size_t count) {
  const int fd = out_fds_[pe];
  size_t first = 0;
  for (;;) {
    while (first < count && iov[first].iov_len == 0) ++first;
    if (first == count) return;
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = std::min<size_t>(count - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      size_t left = static_cast<size_t>(n);
      while (left > 0) {
        if (left >= iov[first].iov_len) {
          left -= iov[first].iov_len;
          ++first;
        } else {
          iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
          iov[first].iov_len -= left;
          left = 0;
        }
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    std::string error;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, options_.timeout_ms) == 1) continue;
      error = StrCat("no progress sending within ", options_.timeout_ms, " ms");
    } else {
      error = StrCat("send failed: ", transport::ErrnoText(errno));
    }
    SetError(Lost(pe, "sending to it", error));
    ThrowError();
  }
}

void TcpTransport::SendFrame(int pe, const Frame& f, const void* payload, uint64_t nbytes) {
  if (failed_.load(std::memory_order_acquire)) ThrowError();
  std::vector<char>& buf = out_buf_[pe];
  const char* h = reinterpret_cast<const char*>(&f);
  buf.insert(buf.end(), h, h + sizeof(f));
  if (payload != nullptr && nbytes > 0 && nbytes <= kInlinePayload) {
    const char* d = static_cast<const char*>(payload);
    buf.insert(buf.end(), d, d + nbytes);
  } else if (payload != nullptr && nbytes > 0) {
    SendWithPayload(pe, static_cast<const char*>(payload), nbytes);
  }
  if (buf.size() >= kFlushBytes) Flush(pe);
}

void TcpTransport::PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) {
  Frame f{kFrameMagic, kFrameWrite, dst_offset, nbytes};
  if (!heap_->cuda()) {
    SendFrame(pe, f, heap_->my_base() + src_offset, nbytes);
    return;
  }
  // CUDA heap: the payload is copied into its own region of the sender lane's pinned
  // staging buffer (enqueued on the lane's stream; not waited for here) and sent
  // behind this frame by the next Flush of pe, which waits once for all copies so far
  // (at the latest in Poll, which ends the proxy's round: the source is then free).
  const size_t cap = send_lane_->staging_bytes();
  if (nbytes > cap - send_used_) FlushAll();  // the regions are reused: send what they hold
  SendFrame(pe, f, nullptr, 0);
  if (nbytes <= cap) {
    send_lane_->Copy(send_lane_->staging() + send_used_, heap_->my_base() + src_offset, nbytes);
    staged_[pe].push_back(StagedPiece{out_buf_[pe].size(), send_used_, nbytes});
    ++staged_count_;
    send_used_ = std::min(cap, AlignUp(send_used_ + nbytes));  // each region 64-byte aligned
    return;
  }
  // Larger than the staging buffer (empty now): chunk by chunk, each waited for.
  Flush(pe);
  for (uint64_t done = 0; done < nbytes;) {
    const uint64_t chunk = std::min<uint64_t>(nbytes - done, cap);
    send_lane_->Copy(send_lane_->staging(), heap_->my_base() + src_offset + done, chunk);
    send_lane_->Sync();
    SendRaw(pe, send_lane_->staging(), chunk);
    done += chunk;
  }
}

void TcpTransport::PostAtomicAdd(int pe, uint64_t offset, uint64_t value) {
  SendFrame(pe, Frame{kFrameMagic, kFrameAdd, offset, value}, nullptr, 0);
}

void TcpTransport::PostFence(int pe, uint64_t token) {
  SendFrame(pe, Frame{kFrameMagic, kFrameFence, 0, token}, nullptr, 0);
  ++fences_outstanding_;
}

void TcpTransport::PostNotify(int pe, uint64_t value) {
  SendFrame(pe, Frame{kFrameMagic, kFrameNotify, 0, value}, nullptr, 0);
}

void TcpTransport::ReadAcks(int pe, std::vector<Completion>* out) {
  const int fd = out_fds_[pe];
  for (;;) {
    Frame f{};
    ssize_t n = ::recv(fd, &f, sizeof(f), MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n == 0 || n < 0) {
      if (shutting_down_.load()) return;
      SetError(Lost(pe, "waiting for its acknowledgements",
                    n == 0 ? std::string("it closed the connection (did its process exit?)")
                           : transport::ErrnoText(errno)));
      ThrowError();
    }
    if (static_cast<size_t>(n) < sizeof(f)) return;  // the rest is on its way
    std::string error;
    if (!transport::RecvAll(fd, reinterpret_cast<char*>(&f), sizeof(f), options_.timeout_ms,
                            &error)) {
      SetError(Lost(pe, "reading its acknowledgement", error));
      ThrowError();
    }
    if (f.magic != kFrameMagic || f.op != kFrameFenceAck) {
      SetError(Lost(pe, "reading its acknowledgement",
                    StrCat("unexpected frame (magic ", f.magic, ", op ", f.op, ")")));
      ThrowError();
    }
    --fences_outstanding_;
    out->push_back(Completion{Completion::Kind::kFenceAck, pe, f.arg});
  }
}

void TcpTransport::Poll(std::vector<Completion>* out) {
  if (failed_.load(std::memory_order_acquire)) ThrowError();
  FlushAll();
  // Acknowledgements come back on the outbound streams; they are read when fences are
  // outstanding, and now and then otherwise so that a closed stream is noticed.
  if (fences_outstanding_ > 0 || (++polls_ & 1023) == 0) {
    for (int pe = 0; pe < heap_->n_pes(); ++pe) {
      if (out_fds_[pe] >= 0) ReadAcks(pe, out);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!notices_.empty()) {
    out->insert(out->end(), notices_.begin(), notices_.end());
    notices_.clear();
  }
}

void TcpTransport::IssueInbound() {
  if (pending_.len == 0) return;
  recv_lane_->Copy(pending_.dst, recv_lane_->staging() + pending_.at, pending_.len);
  pending_.len = 0;
}

void TcpTransport::SettleInbound() {
  if (!recv_lane_) return;
  IssueInbound();
  recv_lane_->Sync();
  recv_used_ = 0;
}

bool TcpTransport::ApplyOne(int pe) {
  // A CUDA failure (e.g. the heap's context died with a trapped kernel) fails the
  // transport naming the peer, like a lost stream; it never escapes the thread.
  try {
    return ApplyFrame(pe);
  } catch (const std::exception& e) {
    SetError(
        StrCat(heap_->Self(), ": applying what ", heap_->PeName(pe), " sent failed: ", e.what()));
    return false;
  }
}

ssize_t TcpTransport::Fill(int pe) {
  InBuf& b = in_buf_[pe];
  if (b.head == b.tail) {
    b.head = b.tail = 0;
  } else if (b.head > 0 && b.data.size() - b.tail < kInBufBytes / 2) {
    std::memmove(b.data.data(), b.data.data() + b.head, b.tail - b.head);
    b.tail -= b.head;
    b.head = 0;
  }
  const size_t space = b.data.size() - b.tail;
  if (space == 0) return 0;
  for (;;) {
    ssize_t n = ::recv(in_fds_[pe], b.data.data() + b.tail, space, 0);
    if (n > 0) {
      b.tail += static_cast<size_t>(n);
      return n;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0) errno = 0;
    return -1;
  }
}

bool TcpTransport::Need(int pe, size_t n, std::string* error) {
  while (Buffered(pe) < n) {
    const ssize_t got = Fill(pe);
    if (got > 0) continue;
    if (got < 0) {
      *error = errno == 0 ? std::string("the peer closed the connection")
                          : "receive failed: " + transport::ErrnoText(errno);
      return false;
    }
    pollfd p{in_fds_[pe], POLLIN, 0};
    if (::poll(&p, 1, options_.timeout_ms) != 1) {
      *error = StrCat("no answer within ", options_.timeout_ms, " ms");
      return false;
    }
  }
  return true;
}

bool TcpTransport::ReadInto(int pe, char* dst, uint64_t n, std::string* error) {
  InBuf& b = in_buf_[pe];
  const uint64_t take = std::min<uint64_t>(n, Buffered(pe));
  std::memcpy(dst, b.data.data() + b.head, take);
  b.head += take;
  dst += take;
  n -= take;
  if (n == 0) return true;
  if (n >= kDirectRecv) return transport::RecvAll(in_fds_[pe], dst, n, options_.timeout_ms, error);
  if (!Need(pe, n, error)) return false;
  std::memcpy(dst, b.data.data() + b.head, n);
  b.head += n;
  return true;
}

bool TcpTransport::ApplyFrame(int pe) {
  // Called with at least a frame header buffered (ReceiverLoop).
  const int fd = in_fds_[pe];
  InBuf& b = in_buf_[pe];
  Frame f{};
  std::string error;
  std::memcpy(&f, b.data.data() + b.head, sizeof(f));
  b.head += sizeof(f);
  if (f.magic != kFrameMagic) {
    SetError(Lost(pe, "receiving", StrCat("bad frame magic ", f.magic)));
    return false;
  }
  switch (f.op) {
    case kFrameWrite: {
      if (!heap_->InHeap(f.offset, f.arg)) {
        SetError(Lost(pe, "applying a write",
                      StrCat("range [", f.offset, ", +", f.arg, ") outside this heap of ",
                             heap_->heap_size(), " bytes")));
        return false;
      }
      if (!heap_->cuda()) {
        if (!ReadInto(pe, heap_->my_base() + f.offset, f.arg, &error)) {
          SetError(Lost(pe, "receiving a write's payload", error));
          return false;
        }
      } else {
        // Through the receiver lane's pinned staging buffer: each payload into its own
        // region, copied to the heap on the lane's stream without waiting; the regions
        // are reused after a SettleInbound (a fence, notify or goodbye, or a full
        // buffer), which waits for every copy before it.
        const size_t cap = recv_lane_->staging_bytes();
        char* dst = heap_->my_base() + f.offset;
        if (f.arg > cap) {
          SettleInbound();  // the chunks below use the whole buffer
          for (uint64_t done = 0; done < f.arg;) {
            const uint64_t chunk = std::min<uint64_t>(f.arg - done, cap);
            if (!ReadInto(pe, recv_lane_->staging(), chunk, &error)) {
              SetError(Lost(pe, "receiving a write's payload", error));
              return false;
            }
            recv_lane_->Copy(dst + done, recv_lane_->staging(), chunk);
            recv_lane_->Sync();
            done += chunk;
          }
          return true;
        }
        // The heap range right after the pending copy's, staged right after it, with the
        // payload already here (no wait on the socket): one copy.
        const bool merge = pending_.len > 0 && pending_.dst + pending_.len == dst &&
                           pending_.at + pending_.len == recv_used_ && f.arg <= cap - recv_used_ &&
                           Buffered(pe) >= f.arg;
        if (!merge) {
          // The pending copy lands meanwhile; a new copy's region starts 64-byte aligned.
          IssueInbound();
          recv_used_ = std::min(cap, AlignUp(recv_used_));
          if (f.arg > cap - recv_used_) SettleInbound();
        }
        if (!ReadInto(pe, recv_lane_->staging() + recv_used_, f.arg, &error)) {
          SetError(Lost(pe, "receiving a write's payload", error));
          return false;
        }
        if (merge) {
          pending_.len += f.arg;
        } else {
          pending_ = PendingCopy{dst, recv_used_, f.arg};
        }
        recv_used_ += f.arg;
      }
      return true;
    }
    case kFrameAdd:
      if (!heap_->InHeap(f.offset, 8) || f.offset % 8 != 0) {
        SetError(Lost(pe, "applying an atomic add",
                      StrCat("offset ", f.offset, " not an aligned word of this heap of ",
                             heap_->heap_size(), " bytes")));
        return false;
      }
      if (recv_lane_) {
        // Enqueued on the lane's stream behind the copies of the writes before it, so it
        // needs no wait of the host: a stream runs its work in order, the add kernel
        // starts only once those copies completed, and its release at system scope then
        // publishes the new value (whoever sees it sees the writes). Waited for only
        // when a fence, a notify or a goodbye needs it landed.
        IssueInbound();
        recv_lane_->Add(reinterpret_cast<uint64_t*>(heap_->my_base() + f.offset), f.arg);
      } else {
        heap_->HostAtomicAdd(f.offset, f.arg);
      }
      return true;
    case kFrameFence: {
      SettleInbound();
      Frame ack{kFrameMagic, kFrameFenceAck, 0, f.arg};
      if (!transport::SendAll(fd, reinterpret_cast<const char*>(&ack), sizeof(ack),
                              options_.timeout_ms, &error)) {
        SetError(Lost(pe, "acknowledging its fence", error));
        return false;
      }
      return true;
    }
    case kFrameNotify: {
      SettleInbound();  // a barrier's notify: what came before it has landed
      std::lock_guard<std::mutex> lock(mu_);
      notices_.push_back(Completion{Completion::Kind::kNotify, pe, f.arg});
      return true;
    }
    case kFrameBye:
      SettleInbound();
      bye_from_[pe]->store(true);
      return false;
    default:
      SetError(Lost(pe, "receiving", StrCat("unknown frame op ", f.op)));
      return false;
  }
}

void TcpTransport::ReceiverLoop() {
  const int n = heap_->n_pes();
  std::vector<bool> open(n, false);
  for (int pe = 0; pe < n; ++pe) open[pe] = in_fds_[pe] >= 0;
  std::vector<pollfd> fds;
  std::vector<int> who;
  bool backlog = false;  // a peer has whole frames buffered that were not applied yet
  while (!stop_.load() && !failed_.load()) {
    fds.clear();
    who.clear();
    fds.push_back(pollfd{wake_fds_[0], POLLIN, 0});
    who.push_back(-1);
    for (int pe = 0; pe < n; ++pe) {
      if (open[pe]) {
        fds.push_back(pollfd{in_fds_[pe], POLLIN, 0});
        who.push_back(pe);
      }
    }
    if (fds.size() == 1 && shutting_down_.load()) return;
    int rc = ::poll(fds.data(), fds.size(), backlog ? 0 : 200);
    if (rc < 0) {
      if (errno == EINTR) continue;
      SetError(
          StrCat("proxy of pe ", heap_->my_pe(), ": poll failed: ", transport::ErrnoText(errno)));
      return;
    }
    backlog = false;
    for (size_t i = 1; i < fds.size(); ++i) {
      const int pe = who[i];
      if (fds[i].revents == 0 && Buffered(pe) < sizeof(Frame)) continue;
      // One read of what is there, then every whole frame of it (a bounded number per
      // turn for fairness; a payload's missing rest is waited for, bounded).
      const ssize_t got = fds[i].revents != 0 ? Fill(pe) : 0;
      if (got < 0 && Buffered(pe) < sizeof(Frame)) {
        open[pe] = false;
        if (bye_from_[pe]->load() || stop_.load()) continue;
        SetError(Lost(pe, "receiving from it",
                      errno == 0 ? std::string("it closed its stream without a goodbye (did its "
                                               "process exit or crash?)")
                                 : transport::ErrnoText(errno)));
        return;
      }
      for (int k = 0; k < kFramesPerTurn && open[pe] && Buffered(pe) >= sizeof(Frame); ++k) {
        if (!ApplyOne(pe)) open[pe] = false;
      }
      // The turn's last writes go to the heap now, not at the next frame of pe.
      try {
        if (recv_lane_) IssueInbound();
      } catch (const std::exception& e) {
        SetError(StrCat(heap_->Self(), ": applying what ", heap_->PeName(pe),
                        " sent failed: ", e.what()));
      }
      if (open[pe] && Buffered(pe) >= sizeof(Frame)) backlog = true;
      if (failed_.load()) return;
    }
  }
}

void TcpTransport::Shutdown() {
  shutting_down_.store(true);
  for (int pe = 0; pe < heap_->n_pes(); ++pe) {
    if (out_fds_[pe] < 0) continue;
    SendFrame(pe, Frame{kFrameMagic, kFrameBye, 0, 0}, nullptr, 0);
    Flush(pe);
  }
  // Every peer's goodbye (after the close barrier they all send one), bounded.
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  for (int pe = 0; pe < heap_->n_pes(); ++pe) {
    if (in_fds_[pe] < 0) continue;
    while (!bye_from_[pe]->load() && !failed_.load() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  stop_.store(true);
  char c = 1;
  (void)!::write(wake_fds_[1], &c, 1);
  if (receiver_.joinable()) receiver_.join();
}

}  // namespace mori::proxy::internal
