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

#include "engine/io_engine.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/telemetry.hpp"
#include "control/answer_reader.hpp"
#include "control/control_handlers.hpp"
#include "registry/gpu_staging.hpp"
#include "control/socket_io.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

namespace {

constexpr size_t kHdr = sizeof(wire::Header);
// Payloads at least this large, with nothing buffered, are received straight into
// their destination (no staging copy).
constexpr uint64_t kDirectRecvMin = 32 << 10;
// Bytes one connection may consume per readiness event before the reactor serves the
// others (level-triggered epoll brings it back).
constexpr size_t kReadBudget = 8 << 20;
constexpr int kMaxIov = 512;
constexpr size_t kMaxSideAnswers = 16;
// The slowest an inbound write's payload may arrive once it holds its region (beyond
// transfer_timeout_ms): a peer trickling bytes resets the stuck clock with each one,
// and would otherwise keep the region from being deregistered for as long as it likes.
constexpr uint64_t kMinPayloadBytesPerS = 1 << 20;
// A target stops reading requests from a connection whose answers pile up unsent (the
// initiator does not read them), and reads again once they drained: so a peer that
// floods requests cannot grow the queue without bound, and its stalled connection is
// then closed as stuck (it otherwise kept the stuck clock fresh by sending).
constexpr size_t kPauseQueuedItems = 4096;
constexpr uint64_t kPauseQueuedBytes = 64 << 20;
constexpr size_t kResumeQueuedItems = 1024;
constexpr uint64_t kResumeQueuedBytes = 16 << 20;

}  // namespace

Reactor::Reactor(IoEngine* engine, int listen_fd, std::function<void()> on_start,
                 std::function<void()> on_stop)
    : engine_(engine),
      handlers_(engine->channel().handlers()),
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

void Reactor::PaceRequests(Conn& c) {
  if (c.outbound || c.dead) return;
  const bool pause = c.sendq.size() > kPauseQueuedItems || c.queued_bytes > kPauseQueuedBytes;
  const bool resume = c.sendq.size() <= kResumeQueuedItems && c.queued_bytes <= kResumeQueuedBytes;
  if ((!c.in_paused && pause) || (c.in_paused && resume)) {
    c.in_paused = !c.in_paused;
    ArmOut(c, c.out_armed);
  }
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
  const int64_t timeout_ns = int64_t{engine_->tcp_config().transfer_timeout_ms} * 1000000;
  // Stuck connections are found within transfer_timeout_ms plus one scan period.
  const int wait_ms = std::clamp(engine_->tcp_config().transfer_timeout_ms / 4, 10, 200);
  int64_t next_scan = NowNs() + int64_t{wait_ms} * 1000000;
  const int64_t busy_ns = int64_t{engine_->options().tcp_busy_poll_us} * 1000;
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

// How long an inbound write's payload may take once its region is entered: the stuck
// bound plus its length at kMinPayloadBytesPerS.
int64_t Reactor::PayloadBudgetNs(uint64_t length) const {
  const int64_t timeout_ns = int64_t{engine_->tcp_config().transfer_timeout_ms} * 1000000;
  return timeout_ns +
         static_cast<int64_t>(std::min<uint64_t>(length / kMinPayloadBytesPerS, uint64_t{1} << 20) *
                              1000000000);
}

// A peer that is alive but hung (stopped, deadlocked) keeps its connections open and
// never answers: neither keepalive nor TCP_USER_TIMEOUT fires. A connection with work
// outstanding that moved no byte either way for timeout_ns is closed, failing its
// requests with ERR_TIMEOUT (outbound) or dropping what it owed a stuck initiator
// (inbound), so nothing waits on it forever.
void Reactor::CloseStuck(int64_t now, int64_t timeout_ns) {
  const int64_t hello_deadline_ns = int64_t{engine_->tcp_config().peer_timeout_ms} * 1000000;
  const int64_t idle_ns = int64_t{engine_->tcp_config().idle_timeout_ms} * 1000000;
  std::vector<std::pair<Conn*, std::string>> stuck;
  std::vector<std::pair<Conn*, std::string>> idle_candidates;  // inbound, idle_timeout_ms
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
      if (!c.outbound && c.payload_deadline_ns != 0 && now > c.payload_deadline_ns) {
        stuck.emplace_back(
            &c,
            StrCat("a write of ", c.cur.length, " bytes into memory ", c.cur.mem_id,
                   " did not arrive within transfer_timeout_ms plus ", kMinPayloadBytesPerS >> 10,
                   " KiB/s of its length (it keeps the region from being deregistered)"));
        continue;
      }
      bool busy = !c.pending.empty() || !c.sendq.empty() || c.in_payload;
      for (const auto& e : c.ext) busy = busy || (e && e->Busy());
      int64_t idle = now - std::max(c.progress_ns, c.rx_ns);
      if (!busy && !c.outbound && c.hello_done && idle_ns > 0 && idle >= idle_ns) {
        idle_candidates.emplace_back(&c, c.remote_key);
      }
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
  for (auto& [c, key] : idle_candidates) {  // asked without the reactor's locks
    if (!engine_->InitiatorIdleClosable(key)) continue;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->dead || !c->sendq.empty() || !c->pending.empty()) continue;
      SendIdleClose(*c);
    }
    engine_->CountIdleClosed();
    Close(*c, StrCat("idle for idle_timeout_ms (", idle_ns / 1000000, " ms)"));
  }
  engine_->grants().DropGone();
}

void Reactor::AcceptAll() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) PauseAccept(errno);
      return;
    }
    accept_backoff_ms_ = 0;
    SetSocketOptions(fd, engine_->tcp_config());
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->outbound = false;
    c->opened_ns = NowNs();
    engine_->channel().Add(std::move(c));
  }
}

// Out of descriptors (EMFILE, ENFILE) or kernel memory, accept fails while the
// connection stays in the backlog, so the level-triggered listener would wake this loop
// at once, forever (a core spent, the log flooded). The listener leaves the epoll set
// for a growing interval instead; the backlog keeps the connection until then, and one
// warning per kAcceptLogIntervalMs counts the failures it does not log.
void Reactor::PauseAccept(int err) {
  const int64_t now = NowNs();
  accept_backoff_ms_ = accept_backoff_ms_ == 0
                           ? kAcceptBackoffMinMs
                           : std::min(2 * accept_backoff_ms_, kAcceptBackoffMaxMs);
  accept_resume_ns_ = now + accept_backoff_ms_ * 1000000;
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  if (now - accept_logged_ns_ < kAcceptLogIntervalMs * 1000000) {
    ++accept_unlogged_;
    return;
  }
  MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': accept failed: ", ErrnoText(err),
                "; not accepting for ", accept_backoff_ms_, " ms (", accept_unlogged_,
                " more failure(s) since the last such message)");
  accept_logged_ns_ = now;
  accept_unlogged_ = 0;
}

// Refused hellos are logged at most once per kAcceptLogIntervalMs per reactor: a peer
// that reconnects in a loop must not flood the log (each message carries the
// engine's running count, so nothing is hidden).
bool Reactor::RefusalLogDue() {
  const int64_t now = NowNs();
  if (now - refusal_logged_ns_ < kAcceptLogIntervalMs * 1000000) return false;
  refusal_logged_ns_ = now;
  return true;
}

void Reactor::ResumeAcceptIfDue(int64_t now) {
  if (accept_resume_ns_ == 0 || now < accept_resume_ns_) return;
  accept_resume_ns_ = 0;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
}

void Reactor::StartPayload(Conn& c, uint64_t length, char* dst) {
  if (length < kDirectRecvMin || dst == nullptr) c.header_only = false;
  c.in_payload = true;
  c.payload_left = length;
  c.payload_dst = dst;
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
  c.payload_deadline_ns = 0;
  const wire::Header& h = c.cur;
  std::string stage_error = Unstage(c, c.cur.length);
  if (c.outbound) {
    engine_->CompletePart(c.cur_pending.record_id,
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
    MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': inbound write from ", LogSafe(c.remote_key),
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

bool Reactor::FinishHello(Conn& c) {
  // Only an initiator given our EngineDesc knows the secret; nothing else it sends
  // is read before this check passed.
  const bool trusted = engine_->SecretMatches(c.hello.data(), wire::kSecretBytes);
  if (c.cur.num_parts > 0) {  // the key's length; the initiator's credential follows it
    c.remote_key = c.hello.substr(wire::kSecretBytes, c.cur.num_parts);
    c.credential = c.hello.substr(wire::kSecretBytes + c.cur.num_parts);
  } else {  // a hello without a credential (raw peers; refused for registered keys)
    c.remote_key = c.hello.substr(wire::kSecretBytes);
  }
  std::string().swap(c.hello);
  std::string why_not;
  if (trusted && !engine_->InitiatorAccepted(c.remote_key, c.credential, &why_not)) {
    engine_->CountRefusedHello();
    if (RefusalLogDue()) {
      MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': refused a connection claiming to be ",
                    LogSafe(c.remote_key), ": ", why_not, " (", engine_->hellos_refused(),
                    " refused so far)");
    }
    // It holds our EngineDesc: told that the close is ours (kIdleClose), so an initiator
    // refused for now (its key held by other connections; a registration here that is
    // not its current EngineDesc) tries again on its next transfer instead of staying
    // failed until it registers us again. Nothing is sent to a hello without our secret.
    std::lock_guard<std::mutex> lock(c.mu);
    SendIdleClose(c);
    return false;
  }
  if (!trusted) {
    engine_->CountRefusedHello();
    if (RefusalLogDue()) {
      MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': refused a connection from ",
                    "an initiator whose hello (key ", LogSafe(c.remote_key),
                    ") lacks this engine's secret (", engine_->hellos_refused(),
                    " refused so far)");
    }
    return false;
  }
  c.hello_done = true;
  engine_->channel().NoteInbound(c.remote_key, SharedOf(c));
  MORI_LOG_DEBUG(kIo, "engine '", engine_->key(), "': inbound connection from ",
                 LogSafe(c.remote_key));
  return true;
}

RegionLookup Reactor::Target(Conn&, const wire::Header& h, bool enter, bool allow_gpu) {
  return engine_->memory().Check(h.mem_id, h.capability, h.offset, h.length, enter, allow_gpu);
}

// Recorded at once, before the part's answer leaves (answers are queued for the end of
// the read pass): an initiator that saw its write acked may tell the target's
// application, which then finds the inbound status.
void Reactor::Account(Conn& c, const wire::Header& h, wire::WireStatus status) {
  InboundPart part{h.uid, h.num_parts, status, h.mem_id, h.offset, h.length};
  engine_->inbound().Record(c.remote_key, &part, 1);
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
      engine_->CountRefusedHello();
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
    if (!engine_->memory().FindNamed(h.mem_id, h.capability, &r)) {
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
    // While the payload lands the region cannot be deregistered: bound how long.
    if (lk.use != nullptr) c.payload_deadline_ns = NowNs() + PayloadBudgetNs(h.length);
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
        MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': read by ", LogSafe(c.remote_key),
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
    engine_->CompletePart(p.record_id, wire::WireStatusCode(status),
                          ok ? "" : Refusal(c, p, status));
    return true;
  }
  if (type == wire::MsgType::kReadData && p.type == wire::MsgType::kRead) {
    c.cur_pending = p;
    if (!ok) {
      engine_->CompletePart(p.record_id, wire::WireStatusCode(status), Refusal(c, p, status));
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
    if (c.header_only && !c.in_payload && c.rlen - c.rpos < kHdr) {
      want = kHdr - (c.rlen - c.rpos);
    }
    if (drained && !c.in_payload && c.rpos == c.rlen) break;
    ssize_t n = ::recv(c.fd, c.rbuf.data() + c.rlen, want, 0);
    if (n > 0) {
      drained = static_cast<size_t>(n) < want;
      c.rlen += static_cast<size_t>(n);
      budget -= std::min(budget, static_cast<size_t>(n));
      continue;
    }
    if (!HandleRecvResult(c, n)) return false;
    break;
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
    // A thread reading its answer (tcp/answer_reader.hpp) may be in poll() on the
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
      MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': ", msg, "; failing ", failing,
                    " pending request(s)");
    } else {
      MORI_LOG_DEBUG(kIo, "engine '", engine_->key(), "': ", msg);
    }
    if (auto peer = c.peer.lock()) {
      if (c.idle_closed) {
        engine_->ReconnectLater(peer, msg);  // only a transfer racing the close fails
      } else {
        peer->MarkFailed(msg);
      }
    }
    if (c.in_payload) orphans.push_front(c.cur_pending);
    for (const Pending& p : orphans) {
      if (p.record_id != SubmissionLedger::kNoRecord) engine_->CompletePart(p.record_id, code, msg);
    }
  } else {
    MORI_LOG_DEBUG(kIo, "engine '", engine_->key(), "': inbound connection from ",
                   LogSafe(c.remote_key), " closed: ", reason);
    if (c.hello_done) engine_->InboundClosed(c.remote_key);
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
