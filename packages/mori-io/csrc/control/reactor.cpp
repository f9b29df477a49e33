// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
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

Reactor::Reactor(ControlHost* host, ControlChannel* channel, int listen_fd,
                 std::function<void()> on_start, std::function<void()> on_stop)
    : host_(host),
      channel_(channel),
      handlers_(channel->handlers()),
      on_start_(std::move(on_start)),
      on_stop_(std::move(on_stop)) {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wake_fd_ < 0) MORI_THROW(TransportError, "epoll/eventfd: ", ErrnoText(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &wake_fd_;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  if (listen_fd >= 0) {
    listen_fd_ = listen_fd;
    ev.data.ptr = &listen_fd_;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  }
  started_future_ = started_.get_future();
  thread_ = std::thread([this] { Loop(); });
}

void Reactor::ResumeRead(std::shared_ptr<Conn> sc) {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    if (tasks_stopped_) return;  // the reactor ended: nothing reads any more
    tasks_.push_back([this, sc = std::move(sc)] {
      {
        std::lock_guard<std::mutex> lock(sc->mu);
        if (sc->dead) return;
      }
      OnReadable(*sc);
    });
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

void Reactor::Post(std::function<void()> task) {
  {
    std::unique_lock<std::mutex> lock(tasks_mu_);
    if (tasks_stopped_) {  // the reactor is gone (the engine is shutting down): run here
      lock.unlock();
      task();
      return;
    }
    tasks_.push_back(std::move(task));
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

Reactor::~Reactor() {
  Stop();
  CloseAll("engine shut down");
  ::close(epfd_);
  ::close(wake_fd_);
}

void Reactor::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
  thread_.join();
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks_stopped_ = true;  // later Posts run on their caller
  }
  RunTasks();
}

void Reactor::Add(const std::shared_ptr<Conn>& c) {
  c->reactor = this;
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    conns_[c.get()] = c;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = c.get();
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, c->fd, &ev);
}

void Reactor::ArmOut(Conn& c, bool on) {
  epoll_event ev{};
  ev.events = (c.in_paused || c.rx_waiter ? 0u : EPOLLIN | EPOLLRDHUP) | (on ? EPOLLOUT : 0u);
  ev.data.ptr = &c;
  ::epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
}

int Reactor::FlushLocked(Conn& c) {
  MORI_SCOPED_TIMER(kIo, "io.tcp.flush");
  while (!c.sendq.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = c.sendq.begin(); it != c.sendq.end() && n < kMaxIov - 1; ++it) {
      uint64_t s = it->sent;
      if (s < kHdr) iov[n++] = {reinterpret_cast<char*>(&it->hdr) + s, kHdr - s};
      uint64_t ps = s > kHdr ? s - kHdr : 0;
      if (it->len > ps) iov[n++] = {const_cast<char*>(it->payload) + ps, it->len - ps};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!c.out_armed) {
          ArmOut(c, true);
          c.out_armed = true;
        }
        return 0;
      }
      return errno;
    }
    uint64_t left = static_cast<uint64_t>(w);
    if (w > 0) c.progress_ns = NowNs();
    while (left > 0) {
      SendItem& f = c.sendq.front();
      uint64_t rem = kHdr + f.len - f.sent;
      if (left >= rem) {
        left -= rem;
        if (f.use != nullptr) f.use->Leave();
        if (!c.outbound) c.queued_bytes -= f.len;
        c.sendq.pop_front();
      } else {
        f.sent += left;
        left = 0;
      }
    }
  }
  if (c.out_armed || c.in_paused) {
    c.out_armed = false;
    c.in_paused = false;  // every answer left: read requests again
    ArmOut(c, false);
  }
  return 0;
}

void Reactor::Loop() {
  if (on_start_) on_start_();
  started_.set_value();
  LoopUntilStopped();
  if (on_stop_) on_stop_();  // before the thread ends
}

void Reactor::RunTasks() {
  std::vector<std::function<void()>> run;
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    run.swap(tasks_);
  }
  for (auto& t : run) t();
}

void Reactor::LoopUntilStopped() {
  epoll_event evs[64];
  const int64_t timeout_ns = int64_t{host_->tcp_config().transfer_timeout_ms} * 1000000;
  // Stuck connections are found within transfer_timeout_ms plus one scan period.
  const int wait_ms = std::clamp(host_->tcp_config().transfer_timeout_ms / 4, 10, 200);
  int64_t next_scan = NowNs() + int64_t{wait_ms} * 1000000;
  const int64_t busy_ns = int64_t{host_->options().tcp_busy_poll_us} * 1000;
  int64_t busy_until = 0;  // polling without sleeping until then (MORI_IO_TCP_BUSY_POLL_US)
  while (!stop_.load(std::memory_order_acquire)) {
    const bool busy = busy_ns > 0 && NowNs() < busy_until;
    int n = ::epoll_wait(epfd_, evs, 64, busy ? 0 : wait_ms);
    // Polling yields, as the waiter's poll does (answer_reader.cpp).
    if (busy && n == 0) sched_yield();
    bool polls = false;  // a read pass served a lone single-part transfer
    for (int i = 0; i < n; ++i) {
      void* p = evs[i].data.ptr;
      if (p == &wake_fd_) {
        uint64_t v;
        ssize_t ignored = ::read(wake_fd_, &v, sizeof(v));
        (void)ignored;
        RunTasks();
        continue;
      }
      if (p == &listen_fd_) {
        AcceptAll();
        continue;
      }
      Conn& c = *static_cast<Conn*>(p);
      // Closed earlier in this batch (a pending hello dropped by AcceptAll): its
      // descriptor may already be another connection's.
      if (c.dead) continue;
      bool alive = true;
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        alive = OnReadable(c);
        // Only after a target served a transfer of one part, between messages: its
        // initiator waits for the answer and then sends the next one. A batch's parts
        // (num_parts > 1) keep the reactor awake anyway, and polling through one takes
        // the vCPU its initiator sends and reads answers with (BENCHMARKS.md).
        polls = polls || (alive && !c.outbound && !c.in_payload && c.cur.num_parts == 1);
      }
      if (alive && (evs[i].events & EPOLLOUT)) OnWritable(c);
    }
    int64_t now = NowNs();
    if (polls && busy_ns > 0) busy_until = now + busy_ns;
    ResumeAcceptIfDue(now);
    if (now >= next_scan) {
      CloseStuck(now, timeout_ns);
      next_scan = now + int64_t{wait_ms} * 1000000;
    }
    graveyard_.clear();
  }
}

// A peer that is alive but hung (stopped, deadlocked) keeps its connections open and
// never answers: neither keepalive nor TCP_USER_TIMEOUT fires. A connection with work
// outstanding that moved no byte either way for timeout_ns is closed, failing its
// requests with ERR_TIMEOUT (outbound) or dropping what it owed a stuck initiator
// (inbound), so nothing waits on it forever.
void Reactor::CloseStuck(int64_t now, int64_t timeout_ns) {
  const int64_t hello_deadline_ns = int64_t{host_->tcp_config().peer_timeout_ms} * 1000000;
  const int64_t idle_ns = int64_t{host_->tcp_config().idle_timeout_ms} * 1000000;
  std::vector<std::pair<Conn*, std::string>> stuck;
  std::vector<std::pair<Conn*, std::string>> idle_candidates;  // inbound, idle_timeout_ms
  // Connections idle long enough to give their large receive buffer back.
  std::vector<Conn*> shrink;
  int64_t oldest_hello = INT64_MAX;
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (auto& kv : conns_) {
      Conn& c = *kv.second;
      std::lock_guard<std::mutex> clock(c.mu);
      if (c.dead) continue;
      if (!c.outbound && !c.hello_done) oldest_hello = std::min(oldest_hello, c.opened_ns);
      RevokeLend(c);  // an answer nobody came to wait for is read by this reactor now
      if (!c.outbound && !c.hello_done && now - c.opened_ns >= hello_deadline_ns) {
        // Unauthenticated: a connection that never completes its hello (or trickles it)
        // would otherwise hold a descriptor and a receive buffer for ever.
        stuck.emplace_back(&c, StrCat("no complete hello within ", hello_deadline_ns / 1000000,
                                      " ms of connecting (peer_timeout_ms)"));
        continue;
      }
      if (!c.outbound && c.hello_done) {
        // Every phase of an inbound request has its deadline, whatever the peer sends
        // meanwhile (each byte would reset the stuck clock below): a trickling peer
        // would otherwise hold a descriptor, a receive buffer and perhaps a region for
        // as long as it liked.
        std::string why = DeadlineMissed(c, now, timeout_ns);
        if (!why.empty()) {
          stuck.emplace_back(&c, std::move(why));
          continue;
        }
      }
      bool busy = !c.pending.empty() || !c.sendq.empty() || c.in_payload;
      for (const auto& e : c.ext) busy = busy || (e && e->Busy());
      int64_t idle = now - std::max(c.progress_ns, c.rx_ns);
      if (!busy && !c.outbound && c.hello_done && idle_ns > 0 && idle >= idle_ns) {
        idle_candidates.emplace_back(&c, c.remote_key);
      }
      if (!busy && c.rbuf.large() && now - c.rx_ns >= kRecvBufIdleNs) shrink.push_back(&c);
      if (!busy || idle < timeout_ns) continue;
      stuck.emplace_back(&c, StrCat("no progress for ", idle / 1000000, " ms with ",
                                    c.pending.size(), " request(s) and ", c.sendq.size(),
                                    " message(s) outstanding (transfer_timeout_ms ",
                                    timeout_ns / 1000000, "): the peer is alive but stuck"));
    }
  }
  // The accepting reactor hands each accepted connection to some reactor's conns_ (under
  // that reactor's lock) right after accept, in accept order: a connection accepted
  // before `now` and still in its hello is counted by the reactor holding it.
  oldest_hello_ns_.store(oldest_hello, std::memory_order_release);
  hello_scan_ns_.store(now, std::memory_order_release);
  for (auto& [c, why] : stuck) Close(*c, why, StatusDetail::ERR_TIMEOUT);
  for (Conn* c : shrink) ShrinkRecvBuffer(*c);
  for (auto& [c, key] : idle_candidates) {  // asked without the reactor's locks
    if (!host_->InitiatorIdleClosable(key)) continue;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->dead || !c->sendq.empty() || !c->pending.empty()) continue;
      SendIdleClose(*c);
    }
    host_->CountIdleClosed();
    Close(*c, StrCat("idle for idle_timeout_ms (", idle_ns / 1000000, " ms)"));
  }
  host_->ConnectionsScanned();
}

std::string Reactor::DeadlineMissed(const Conn& c, int64_t now, int64_t timeout_ns) const {
  const int64_t ms = timeout_ns / 1000000;
  if (!c.in_payload && c.header_since_ns != 0 && now - c.header_since_ns >= timeout_ns) {
    return StrCat("a header begun ", (now - c.header_since_ns) / 1000000,
                  " ms ago did not complete (transfer_timeout_ms ", ms, ")");
  }
  if (c.in_payload) {
    // transfer_timeout_ms, then kMinPayloadBytesPerS on average: a payload the target
    // refused is drained as fast as it comes, and one that trickles is cut off.
    const uint64_t got = c.payload_bytes - c.payload_left;
    const int64_t allowed =
        timeout_ns +
        static_cast<int64_t>(std::min<uint64_t>(got / kMinPayloadBytesPerS, uint64_t{1} << 30) *
                             1000000000);
    if (now - c.payload_since_ns > allowed) {
      return StrCat("a payload of ", c.payload_bytes, " bytes (message type ", int(c.cur.type),
                    ", memory ", c.cur.mem_id, ") had received ", got, " bytes after ",
                    (now - c.payload_since_ns) / 1000000, " ms: slower than transfer_timeout_ms (",
                    ms, ") plus ", kMinPayloadBytesPerS >> 10, " KiB/s");
    }
  }
  if (!c.sendq.empty() && now - c.progress_ns >= timeout_ns) {
    return StrCat(c.sendq.size(), " answer(s) unread by the initiator for ",
                  (now - c.progress_ns) / 1000000, " ms (transfer_timeout_ms ", ms, ")");
  }
  return {};
}

// Idle connections give their large receive buffer back (RecvBuffer). Only while no
// other thread reads the connection (a waiter: control/answer_reader.hpp).
void Reactor::ShrinkRecvBuffer(Conn& c) {
  if (c.dead || c.rlen - c.rpos > RecvBuffer::kSmallBytes) return;
  int owner = kRxFree;
  if (!c.rx_owner.compare_exchange_strong(owner, kRxReactor, std::memory_order_acquire)) return;
  c.rbuf.Shrink(c.rpos, c.rlen);
  c.rlen -= c.rpos;
  c.rpos = 0;
  c.rx_owner.store(kRxFree, std::memory_order_release);
}

void Reactor::OnWritable(Conn& c) {
  int err;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    err = c.dead ? 0 : FlushLocked(c);
    if (err == 0) PaceRequests(c);
  }
  if (err != 0) Close(c, StrCat("send failed: ", ErrnoText(err)));
}

void Reactor::Close(Conn& c, const std::string& reason, StatusDetail code) {
  if (c.cur_use != nullptr) {  // an inbound write cut short: nothing lands any more
    c.cur_use->Leave();
    c.cur_use = nullptr;
  }
  for (auto& e : c.ext) {
    if (e) e->Release();
  }
  std::deque<Pending> orphans;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.dead) return;
    c.dead = true;
    c.dead_reason = reason;
    orphans.swap(c.pending);
    LeaveAll(c.sendq);
    for (SendItem& it : c.out_local) {
      if (it.use != nullptr) it.use->Leave();
    }
    c.out_local.clear();
    ::epoll_ctl(epfd_, EPOLL_CTL_DEL, c.fd, nullptr);
    // A thread reading its answer (control/answer_reader.hpp) may be in poll() on the
    // socket: the shutdown wakes it, and the descriptor is closed only once it let go,
    // so it never reads a descriptor number reused meanwhile.
    if (c.rx_owner.load(std::memory_order_acquire) == kRxWaiter) ::shutdown(c.fd, SHUT_RDWR);
  }
  while (c.rx_owner.load(std::memory_order_acquire) == kRxWaiter) std::this_thread::yield();
  ::close(c.fd);
  if (c.outbound) {
    std::string msg = StrCat("connection to remote engine ", LogSafe(c.remote_key), " (",
                             c.peer_addr, ") lost: ", reason);
    size_t failing = orphans.size() + (c.in_payload ? 1 : 0);
    if (failing > 0) {
      MORI_LOG_WARN(kIo, "engine '", host_->key(), "': ", msg, "; failing ", failing,
                    " pending request(s)");
    } else {
      MORI_LOG_DEBUG(kIo, "engine '", host_->key(), "': ", msg);
    }
    if (auto peer = c.peer.lock()) {
      if (c.idle_closed) {
        host_->ReconnectLater(peer, msg);  // only a transfer racing the close fails
      } else {
        peer->MarkFailed(msg);
      }
    }
    if (c.in_payload) orphans.push_front(c.cur_pending);
    for (const Pending& p : orphans) {
      if (p.record_id != SubmissionLedger::kNoRecord) host_->CompletePart(p.record_id, code, msg);
    }
  } else {
    MORI_LOG_DEBUG(kIo, "engine '", host_->key(), "': inbound connection from ",
                   LogSafe(c.remote_key), " closed: ", reason);
    if (c.hello_done) {
      host_->InboundClosed(c.remote_key);
    } else {
      channel_->SettleHello(c);
    }
  }
  c.in_payload = false;
  std::lock_guard<std::mutex> lock(conns_mu_);
  auto it = conns_.find(&c);
  if (it != conns_.end()) {
    graveyard_.push_back(std::move(it->second));
    conns_.erase(it);
  }
}

std::shared_ptr<Conn> Reactor::SharedOf(Conn& c) {
  std::lock_guard<std::mutex> lock(conns_mu_);
  auto it = conns_.find(&c);
  return it == conns_.end() ? nullptr : it->second;
}

void Reactor::CloseAll(const std::string& reason) {
  std::vector<Conn*> all;
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (auto& kv : conns_) all.push_back(kv.first);
  }
  for (Conn* c : all) Close(*c, reason);
  graveyard_.clear();
}

}  // namespace mori::io
