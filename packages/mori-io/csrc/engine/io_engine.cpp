// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/io_engine.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <random>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/macros.hpp"
#include "mori/core/telemetry.hpp"
#include "rdma/loopback_backend.hpp"
#include "shm/cma_copy.hpp"
#include "shm/notice_ring.hpp"
#include "tcp/gpu_staging.hpp"
#include "wire/log_safe.hpp"
#include "wire/secret.hpp"

namespace mori::io {

const char* StatusDetailName(StatusDetail detail) noexcept {
  switch (detail) {
    case StatusDetail::SUCCESS:
      return "SUCCESS";
    case StatusDetail::INIT:
      return "INIT";
    case StatusDetail::IN_PROGRESS:
      return "IN_PROGRESS";
    case StatusDetail::ERR_INVALID_ARGS:
      return "ERR_INVALID_ARGS";
    case StatusDetail::ERR_OUT_OF_BOUNDS:
      return "ERR_OUT_OF_BOUNDS";
    case StatusDetail::ERR_NOT_FOUND:
      return "ERR_NOT_FOUND";
    case StatusDetail::ERR_TRANSPORT:
      return "ERR_TRANSPORT";
    case StatusDetail::ERR_PEER_LOST:
      return "ERR_PEER_LOST";
    case StatusDetail::ERR_TIMEOUT:
      return "ERR_TIMEOUT";
    case StatusDetail::ERR_BAD_STATE:
      return "ERR_BAD_STATE";
    case StatusDetail::ERR_GPU_OP:
      return "ERR_GPU_OP";
  }
  return "?";
}

const char* StatusCodeName(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::SUCCESS:
      return "SUCCESS";
    case StatusCode::INIT:
      return "INIT";
    case StatusCode::IN_PROGRESS:
      return "IN_PROGRESS";
    case StatusCode::ERR_BEGIN:
      return "ERR_BEGIN";
    case StatusCode::ERR_INVALID_ARGS:
      return "ERR_INVALID_ARGS";
    case StatusCode::ERR_NOT_FOUND:
      return "ERR_NOT_FOUND";
    case StatusCode::ERR_RDMA_OP:
      return "ERR_RDMA_OP";
    case StatusCode::ERR_BAD_STATE:
      return "ERR_BAD_STATE";
    case StatusCode::ERR_GPU_OP:
      return "ERR_GPU_OP";
  }
  return "?";
}

namespace {

constexpr size_t kHdr = sizeof(wire::Header);
constexpr size_t kRecvBufBytes = 256 << 10;
// Payloads at least this large, with nothing buffered, are received straight into
// their destination (no staging copy).
constexpr uint64_t kDirectRecvMin = 32 << 10;
// Bytes one connection may consume per readiness event before the reactor serves the
// others (level-triggered epoll brings it back).
constexpr size_t kReadBudget = 8 << 20;
constexpr int kMaxIov = 512;
constexpr size_t kLedgerCapacity = 1 << 14;
constexpr size_t kMaxP2pGrants = 16;
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
// GPU memory over TCP: parts of at most kGpuChunk are staged by initiators; a target
// refuses to stage a single part larger than kMaxStagedPart.
constexpr uint64_t kGpuChunk = 4 << 20;
constexpr uint64_t kMaxStagedPart = 256 << 20;
constexpr uint64_t kMaxP2pGrantBytes = 1 << 22;

bool EnvFlag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return !(std::strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 || strcasecmp(v, "false") == 0);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ErrnoText(int err) { return StrCat(std::strerror(err), " (errno ", err, ")"); }

const char* WireStatusText(wire::WireStatus s) {
  switch (s) {
    case wire::WireStatus::kOk:
      return "ok";
    case wire::WireStatus::kUnknownMemory:
      return "the memory id is not registered with the target (never, or deregistered)";
    case wire::WireStatus::kOutOfBounds:
      return "out of bounds of the registered region";
    case wire::WireStatus::kNotHostMemory:
      return "the region is GPU memory, which this path cannot move (CMA moves host memory "
             "only; over TCP the target stages GPU memory only when built with CUDA and a "
             "GPU is visible, and at most kMaxStagedPart bytes per part)";
    case wire::WireStatus::kNoShm:
      return "the target engine has no SHM backend";
    case wire::WireStatus::kCopyFailed:
      return "the initiator's CMA copy failed";
    case wire::WireStatus::kNoP2p:
      return "the target engine has no P2P backend";
    case wire::WireStatus::kNotGpuMemory:
      return "the region is host memory, which P2P does not map";
    case wire::WireStatus::kExportFailed:
      return "the target could not export the region";
    case wire::WireStatus::kNoRdma:
      return "the target engine has no RDMA backend";
    case wire::WireStatus::kNotShareable:
      return "the region is not in shared host memory";
  }
  return "unknown status";
}

StatusDetail WireStatusCode(wire::WireStatus s) {
  switch (s) {
    case wire::WireStatus::kOk:
      return StatusDetail::SUCCESS;
    case wire::WireStatus::kUnknownMemory:
      return StatusDetail::ERR_NOT_FOUND;
    case wire::WireStatus::kOutOfBounds:
      return StatusDetail::ERR_OUT_OF_BOUNDS;
    case wire::WireStatus::kNotHostMemory:
    case wire::WireStatus::kNoShm:
    case wire::WireStatus::kNoP2p:
    case wire::WireStatus::kNotGpuMemory:
    case wire::WireStatus::kNoRdma:
    case wire::WireStatus::kNotShareable:
      return StatusDetail::ERR_INVALID_ARGS;
    case wire::WireStatus::kCopyFailed:
      return StatusDetail::ERR_TRANSPORT;
    case wire::WireStatus::kExportFailed:
      return StatusDetail::ERR_GPU_OP;
  }
  return StatusDetail::ERR_TRANSPORT;
}

void SetSocketOptions(int fd, const TcpBackendConfig& cfg) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // A silent peer (host gone, no RST) is noticed within about peer_timeout_ms:
  // keepalive probes when idle, TCP_USER_TIMEOUT when data stays unacknowledged.
  int idle = std::max(1, cfg.peer_timeout_ms / 3000);
  int intvl = 1, cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  unsigned user_timeout = static_cast<unsigned>(cfg.peer_timeout_ms);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  if (cfg.sock_buf_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &cfg.sock_buf_bytes, sizeof(cfg.sock_buf_bytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &cfg.sock_buf_bytes, sizeof(cfg.sock_buf_bytes));
  }
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Connects with a deadline; returns the fd (non-blocking) or -1 with *error set.
int ConnectTo(const std::string& host, uint16_t port, int timeout_ms, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0) {
    *error = StrCat("cannot resolve ", host, ": ", ::gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, timeout_ms);
      if (rc == 1) {
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        rc = soerr == 0 ? 0 : -1;
        errno = soerr;
      } else {
        if (rc == 0) errno = ETIMEDOUT;
        rc = -1;
      }
    }
    if (rc == 0) break;
    *error = StrCat("cannot connect to ", host, ":", port, ": ", ErrnoText(errno));
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  return fd;
}

bool SendAll(int fd, const char* data, size_t len, int timeout_ms, std::string* error) {
  while (len > 0) {
    ssize_t n = ::send(fd, data, len, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, timeout_ms) == 1) continue;
      *error = "timed out sending the hello";
      return false;
    }
    *error = StrCat("send failed: ", ErrnoText(errno));
    return false;
  }
  return true;
}

// Receives exactly len bytes with a deadline per wait; false with *error set otherwise.
bool RecvAll(int fd, char* data, size_t len, int timeout_ms, std::string* error) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = ::recv(fd, data + got, len - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) == 1) continue;
      *error = StrCat("no answer within ", timeout_ms, " ms");
      return false;
    }
    *error = n == 0 ? std::string("the peer closed the connection")
                    : "receive failed: " + ErrnoText(errno);
    return false;
  }
  return true;
}

struct SendItem {
  wire::Header hdr;
  const char* payload;  // not owned: registered memory
  uint64_t len;         // payload bytes to send after the header
  uint64_t sent;        // bytes of header + payload already sent
  RegionUse* use;       // a target's read response: entered, left once sent or dropped
  std::shared_ptr<char> staged = nullptr;  // payload's staging buffer (GPU memory), if any
};

void LeaveAll(std::deque<SendItem>& q) {
  for (SendItem& it : q) {
    if (it.use != nullptr) it.use->Leave();
  }
  q.clear();
}

struct Pending {
  uint64_t record_id;  // SubmissionLedger::kNoRecord: nothing to complete (a failed copy's
                       // kShmWriteDone, whose part already failed)
  wire::MsgType type;
  char* local;
  uint64_t length;
  uint64_t mem_id;
  uint64_t offset;
  uint64_t uid;
  uint32_t num_parts;
  int gpu_device = -1;  // a read into GPU memory of this device: received via staging
};

bool IsWriteType(wire::MsgType t) {
  return t == wire::MsgType::kWrite || t == wire::MsgType::kShmWriteReq ||
         t == wire::MsgType::kShmWriteDone || t == wire::MsgType::kP2pWriteDone;
}

}  // namespace

HotPathOptions HotPathOptions::FromEnv() {
  HotPathOptions o;
  o.lockfree_endpoint = EnvFlag("MORI_IO_LOCKFREE_ENDPOINT", true);
  o.epoch_snapshot = EnvFlag("MORI_IO_EPOCH_SNAPSHOT", true);
  const char* ledger = std::getenv("MORI_IO_LEDGER");
  o.ledger_ring = !(ledger != nullptr && std::strcmp(ledger, "map") == 0);
  o.target_batching = EnvFlag("MORI_IO_TARGET_BATCHING", true);
  o.shm_map = EnvFlag("MORI_IO_SHM_MAP", true);
  o.notice_ring = EnvFlag("MORI_IO_NOTICE_RING", true);
  o.cma_cache = EnvFlag("MORI_IO_CMA_CACHE", true);
  o.liveness_word = EnvFlag("MORI_IO_SHM_LIVENESS_WORD", true);
  if (const char* slots = std::getenv("MORI_IO_NOTICE_RING_SLOTS")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(slots, &end, 10);
    if (end == slots || *end != '\0' || (v != 0 && (v < 2 || v > (1u << 20) || (v & (v - 1))))) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_NOTICE_RING_SLOTS='", slots,
                 "': expected 0 or a power of two in [2, 1048576]");
    }
    o.notice_ring_slots = static_cast<uint32_t>(v);
  }
  if (const char* rings = std::getenv("MORI_IO_MAX_NOTICE_RINGS")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(rings, &end, 10);
    if (end == rings || *end != '\0' || v > (1u << 16)) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_MAX_NOTICE_RINGS='", rings,
                 "': expected a count in [0, 65536]");
    }
    o.max_notice_rings = static_cast<uint32_t>(v);
  }
  return o;
}

void Peer::MarkFailed(const std::string& reason) {
  std::lock_guard<std::mutex> lock(fail_mu);
  if (failed.load(std::memory_order_relaxed)) return;
  fail_reason = reason;
  failed.store(true, std::memory_order_release);
}

std::string Peer::FailReason() {
  std::lock_guard<std::mutex> lock(fail_mu);
  return fail_reason;
}

// One TCP connection. The send side (queue, pending responses, liveness) is shared by
// submitting threads and the owning reactor, under `mu`; the receive side belongs to
// the reactor alone.
struct Conn {
  int fd = -1;
  bool outbound = false;
  Worker* worker = nullptr;
  std::string remote_key;
  std::weak_ptr<Peer> peer;
  std::string peer_addr;
  int shm_pid = 0;  // outbound: the target's pid, for CMA

  std::mutex mu;
  std::deque<SendItem> sendq;
  std::deque<Pending> pending;  // outbound: requests awaiting their response, in order
  bool dead = false;
  bool out_armed = false;
  bool in_paused = false;     // inbound: not reading requests (answers queued; under mu)
  uint64_t queued_bytes = 0;  // inbound: payload bytes of the answers in sendq (under mu)
  bool need_flush = false;    // the reactor queued requests (kShmWriteDone) in sendq
  std::string dead_reason;
  // Last time a byte was sent, or work was queued on an idle connection (NowNs).
  int64_t progress_ns = 0;

  std::vector<char> rbuf = std::vector<char>(kRecvBufBytes);
  size_t rpos = 0;
  size_t rlen = 0;
  // Set after a payload was received straight into its destination: large messages
  // tend to follow each other, so the next buffered read takes only the header and
  // the next payload goes direct too instead of up to kRecvBufBytes of it being
  // staged and copied.
  bool header_only = false;
  wire::Header cur{};
  bool in_payload = false;
  uint64_t payload_left = 0;
  char* payload_dst = nullptr;  // null: discard the payload
  wire::WireStatus cur_status = wire::WireStatus::kOk;
  Pending cur_pending{};
  bool hello_done = false;
  std::string hello;
  std::string credential;  // inbound: what the hello proved (InitiatorCredential); "" none
  int64_t opened_ns = 0;   // inbound: accepted (NowNs); a hello must complete in time
  // Inbound write mid-payload into a region: by then the payload must have arrived,
  // however slowly its bytes trickle in (each byte resets the stuck clock); 0: none.
  int64_t payload_deadline_ns = 0;
  int64_t rx_ns = 0;             // last readiness event (reactor only)
  RegionUse* cur_use = nullptr;  // inbound write mid-payload: its region, entered
  // The current payload is received into stage_in and then copied to stage_dst, GPU
  // memory of stage_dev (reads into local GPU memory; inbound writes into it).
  std::shared_ptr<char> stage_in;
  char* stage_dst = nullptr;
  int stage_dev = -1;
  // Inbound SHM write grants whose kShmWriteDone has not come (entered, in grant order;
  // the initiator answers each granted write with one done, in order).
  std::deque<RegionUse*> shm_write_grants;
  std::deque<RegionUse*> shm_read_grants;  // likewise, until each kShmReadDone
  // Inbound: P2P grants' payloads, alive until the connection closes (a short-lived
  // connection carries one; more than kMaxP2pGrants is a protocol violation).
  std::deque<std::string> p2p_grants;
  std::string side_in;                     // inbound kRdmaConnect: the initiator's endpoints
  std::vector<SendItem> out_local;         // responses of one read pass, queued at its end
  std::vector<InboundPart> inbound_local;  // parts of one read pass, recorded at its end
  MemoryRegion region{};                   // the last region a request named...
  uint64_t region_epoch = ~uint64_t{0};    // ...valid while the engine's memory epoch is this
  // Inbound: the last kTransferExtent, which the following parts of its transfer need.
  bool extent_set = false;
  uint64_t extent_uid = 0;
  uint64_t extent_mem = 0;
  wire::WireStatus extent_status = wire::WireStatus::kOk;
};

class Worker {
 public:
  Worker(IoEngine* engine, int index, int listen_fd) : engine_(engine), index_(index) {
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

  // Returns once the reactor runs (reactor 0 holds the engine's liveness page then).
  void WaitStarted() { started_future_.wait(); }

  // Runs `task` on this reactor's thread (the second half of a large CMA copy); tasks
  // still queued when the reactor stops run on the stopping thread, so none is lost.
  void Post(std::function<void()> task) {
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

  ~Worker() {
    Stop();
    CloseAll("engine shut down");
    ::close(epfd_);
    ::close(wake_fd_);
  }

  void Stop() {
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

  void Add(const std::shared_ptr<Conn>& c) {
    c->worker = this;
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      conns_[c.get()] = c;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c.get();
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, c->fd, &ev);
  }

  void ArmOut(Conn& c, bool on) {
    epoll_event ev{};
    ev.events = (c.in_paused ? 0u : EPOLLIN | EPOLLRDHUP) | (on ? EPOLLOUT : 0u);
    ev.data.ptr = &c;
    ::epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  // Sends what the queue holds without blocking; arms EPOLLOUT for the rest. Called
  // with c.mu held. Returns 0 or the errno of a fatal send error.
  int FlushLocked(Conn& c) {
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

  // With c.mu held, after answers were queued (inbound) or some left: stops or resumes
  // reading requests from the connection (kPauseQueued*, kResumeQueued*).
  void PaceRequests(Conn& c) {
    if (c.outbound || c.dead) return;
    const bool pause = c.sendq.size() > kPauseQueuedItems || c.queued_bytes > kPauseQueuedBytes;
    const bool resume =
        c.sendq.size() <= kResumeQueuedItems && c.queued_bytes <= kResumeQueuedBytes;
    if ((!c.in_paused && pause) || (c.in_paused && resume)) {
      c.in_paused = !c.in_paused;
      ArmOut(c, c.out_armed);
    }
  }

 private:
  void Loop() {
    LivenessPage* live = index_ == 0 ? engine_->liveness_page() : nullptr;
    if (live != nullptr) live->Hold();
    started_.set_value();
    LoopUntilStopped();
    // Before the thread ends, while the page is still mapped (liveness.hpp).
    if (live != nullptr) live->Release();
  }

  void RunTasks() {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      run.swap(tasks_);
    }
    for (auto& t : run) t();
  }

  void LoopUntilStopped() {
    epoll_event evs[64];
    const int64_t timeout_ns = int64_t{engine_->tcp_config().transfer_timeout_ms} * 1000000;
    // Stuck connections are found within transfer_timeout_ms plus one scan period.
    const int wait_ms = std::clamp(engine_->tcp_config().transfer_timeout_ms / 4, 10, 200);
    int64_t next_scan = NowNs() + int64_t{wait_ms} * 1000000;
    while (!stop_.load(std::memory_order_acquire)) {
      int n = ::epoll_wait(epfd_, evs, 64, wait_ms);
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
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) alive = OnReadable(c);
        if (alive && (evs[i].events & EPOLLOUT)) OnWritable(c);
      }
      int64_t now = NowNs();
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
  // How long an inbound write's payload may take once its region is entered: the stuck
  // bound plus its length at kMinPayloadBytesPerS.
  int64_t PayloadBudgetNs(uint64_t length) const {
    const int64_t timeout_ns = int64_t{engine_->tcp_config().transfer_timeout_ms} * 1000000;
    return timeout_ns +
           static_cast<int64_t>(
               std::min<uint64_t>(length / kMinPayloadBytesPerS, uint64_t{1} << 20) * 1000000000);
  }

  void CloseStuck(int64_t now, int64_t timeout_ns) {
    const int64_t hello_deadline_ns = int64_t{engine_->tcp_config().peer_timeout_ms} * 1000000;
    std::vector<std::pair<Conn*, std::string>> stuck;
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      for (auto& kv : conns_) {
        Conn& c = *kv.second;
        std::lock_guard<std::mutex> clock(c.mu);
        if (c.dead) continue;
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
        bool busy = !c.pending.empty() || !c.sendq.empty() || c.in_payload ||
                    !c.shm_write_grants.empty() || !c.shm_read_grants.empty();
        int64_t idle = now - std::max(c.progress_ns, c.rx_ns);
        if (!busy || idle < timeout_ns) continue;
        stuck.emplace_back(&c, StrCat("no progress for ", idle / 1000000, " ms with ",
                                      c.pending.size(), " request(s) and ", c.sendq.size(),
                                      " message(s) outstanding (transfer_timeout_ms ",
                                      timeout_ns / 1000000, "): the peer is alive but stuck"));
      }
    }
    for (auto& [c, why] : stuck) Close(*c, why, StatusDetail::ERR_TIMEOUT);
  }

  void AcceptAll() {
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
      engine_->AssignInbound(std::move(c));
    }
  }

  // Out of descriptors (EMFILE, ENFILE) or kernel memory, accept fails while the
  // connection stays in the backlog, so the level-triggered listener would wake this loop
  // at once, forever (a core spent, the log flooded). The listener leaves the epoll set
  // for a growing interval instead; the backlog keeps the connection until then, and one
  // warning per kAcceptLogIntervalMs counts the failures it does not log.
  void PauseAccept(int err) {
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
  bool RefusalLogDue() {
    const int64_t now = NowNs();
    if (now - refusal_logged_ns_ < kAcceptLogIntervalMs * 1000000) return false;
    refusal_logged_ns_ = now;
    return true;
  }

  void ResumeAcceptIfDue(int64_t now) {
    if (accept_resume_ns_ == 0 || now < accept_resume_ns_) return;
    accept_resume_ns_ = 0;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_fd_;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  }

  void StartPayload(Conn& c, uint64_t length, char* dst) {
    if (length < kDirectRecvMin || dst == nullptr) c.header_only = false;
    c.in_payload = true;
    c.payload_left = length;
    c.payload_dst = dst;
    // An empty payload is never a hello (HandleHeader refused it), so this cannot fail.
    if (length == 0) FinishPayload(c);
  }

  // Receives the next payload of `length` bytes for GPU memory at dst (device dev) into a
  // staging buffer; FinishPayload copies it over.
  void StagePayload(Conn& c, uint64_t length, char* dst, int dev) {
    c.stage_in = staging::Buffer(length);
    c.stage_dst = dst;
    c.stage_dev = dev;
    StartPayload(c, length, c.stage_in.get());
  }

  // Copies a staged payload to its GPU destination; "" or why it failed.
  std::string Unstage(Conn& c, uint64_t length) {
    if (c.stage_dst == nullptr) return {};
    std::string error;
    try {
      staging::ToDevice(c.stage_dst, c.stage_in.get(), length, c.stage_dev);
    } catch (const std::exception& e) {
      error =
          StrCat("copying ", length, " staged bytes to GPU ", c.stage_dev, " failed: ", e.what());
    }
    c.stage_in.reset();
    c.stage_dst = nullptr;
    c.stage_dev = -1;
    return error;
  }

  // False: the connection must be closed (a hello without our secret).
  bool FinishPayload(Conn& c) {
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
    if (!c.hello_done) {
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
      engine_->NoteInbound(c.remote_key, SharedOf(c));
      MORI_LOG_DEBUG(kIo, "engine '", engine_->key(), "': inbound connection from ",
                     LogSafe(c.remote_key));
      return true;
    }
    if (static_cast<wire::MsgType>(h.type) == wire::MsgType::kRdmaConnect) {
      std::string answer;
      wire::WireStatus st = engine_->RdmaAccept(c.remote_key, c.side_in, &answer);
      std::string().swap(c.side_in);
      SideAnswer(c, h, wire::MsgType::kRdmaConnectAck, st, std::move(answer));
      return true;
    }
    if (!stage_error.empty()) {
      MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': inbound write from ",
                    LogSafe(c.remote_key), ": ", stage_error);
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

  // The target's check of a request against its registry. With target batching the
  // region is cached per connection and revalidated only when the engine's memory
  // epoch moves, so a run of parts into one region takes no lock and no lookup.
  // With `enter`, a kOk lookup has entered the region's use count (the caller leaves
  // it once its bytes moved); a region being deregistered reads as unknown.
  IoEngine::Lookup Target(Conn& c, const wire::Header& h, bool enter, bool allow_gpu = false) {
    if (!engine_->options().target_batching) {
      return engine_->CheckTarget(h.mem_id, h.offset, h.length, enter, allow_gpu);
    }
    uint64_t epoch = engine_->memory_epoch();
    if (c.region_epoch != epoch || c.region.id != h.mem_id) {
      if (!engine_->FindRegion(h.mem_id, &c.region)) {
        c.region_epoch = ~uint64_t{0};
        return {wire::WireStatus::kUnknownMemory, nullptr};
      }
      c.region_epoch = epoch;
    }
    return IoEngine::CheckRegion(c.region, h.offset, h.length, enter, allow_gpu);
  }

  void Account(Conn& c, const wire::Header& h, wire::WireStatus status) {
    InboundPart part{h.uid, h.num_parts, status, h.mem_id, h.offset, h.length};
    if (engine_->options().target_batching) {
      c.inbound_local.push_back(part);
    } else {
      engine_->RecordInboundParts(c.remote_key, &part, 1);
    }
  }

  // Before the responses of the pass leave: an initiator that saw its write acked may
  // tell the target's application, which then finds the inbound status.
  void FlushInbound(Conn& c) {
    if (c.inbound_local.empty()) return;
    engine_->RecordInboundParts(c.remote_key, c.inbound_local.data(), c.inbound_local.size());
    c.inbound_local.clear();
  }

  std::string Refusal(const Conn& c, const Pending& p, wire::WireStatus s) {
    return StrCat(IsWriteType(p.type) ? "write" : "read", " of ", p.length, " bytes at offset ",
                  p.offset, " of memory ", p.mem_id, " of remote engine ", LogSafe(c.remote_key),
                  " refused by the target: ", WireStatusText(s));
  }

  // The answer to a side request, its payload kept alive by the connection.
  void SideAnswer(Conn& c, const wire::Header& h, wire::MsgType type, wire::WireStatus st,
                  std::string payload) {
    c.p2p_grants.push_back(std::move(payload));
    const std::string& g = c.p2p_grants.back();
    wire::Header r = h;
    r.type = static_cast<uint8_t>(type);
    r.status = static_cast<uint8_t>(st);
    r.length = g.size();
    c.out_local.push_back({r, g.data(), g.size(), 0, nullptr});
  }

  // A part of a multi-part transfer is served only after its transfer's extent passed
  // the registry on this connection, so a transfer with one span out of bounds lands no
  // byte of the others. false: a protocol violation (no extent for this part); else
  // *refused is the extent's verdict (kOk: the part is then checked itself).
  bool ExtentVerdict(const Conn& c, const wire::Header& h, wire::WireStatus* refused,
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
  bool HandleHeader(Conn& c, std::string* why) {
    const wire::Header& h = c.cur;
    if (h.version != wire::kVersion) {
      *why = StrCat("wire version ", h.version, " (this engine speaks ", wire::kVersion, ")");
      return false;
    }
    auto type = static_cast<wire::MsgType>(h.type);
    if (!c.outbound) {
      if (!c.hello_done) {
        if (type != wire::MsgType::kHello || h.length < wire::kSecretBytes ||
            h.length > 2 * wire::kSecretBytes + 4096 ||
            (h.num_parts > 0 && h.length != 2 * wire::kSecretBytes + h.num_parts)) {
          *why =
              StrCat("first message is not a hello (type ", int(h.type), ", ", h.length, " bytes)");
          engine_->CountRefusedHello();
          return false;
        }
        c.hello.resize(h.length);
        StartPayload(c, h.length, c.hello.data());
        return true;
      }
      if (type == wire::MsgType::kTransferExtent) {
        MemoryRegion r{};
        wire::WireStatus st = wire::WireStatus::kOk;
        if (!engine_->FindRegion(h.mem_id, &r)) {
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
      wire::WireStatus refused = wire::WireStatus::kOk;
      const bool part = type == wire::MsgType::kWrite || type == wire::MsgType::kRead ||
                        type == wire::MsgType::kShmWriteReq || type == wire::MsgType::kShmReadReq;
      if (part && !ExtentVerdict(c, h, &refused, why)) return false;
      const IoEngine::Lookup refusal{refused, nullptr};
      if (type == wire::MsgType::kWrite) {
        IoEngine::Lookup lk = refused != wire::WireStatus::kOk ? refusal : Target(c, h, true, true);
        c.cur_use = lk.use;
        c.cur_status = lk.status;
        // While the payload lands the region cannot be deregistered: bound how long.
        if (lk.use != nullptr) c.payload_deadline_ns = NowNs() + PayloadBudgetNs(h.length);
        if (lk.status == wire::WireStatus::kOk && lk.gpu_device >= 0) {
          StagePayload(c, h.length, lk.base + h.offset, lk.gpu_device);
          return true;
        }
        StartPayload(c, h.length,
                     lk.status == wire::WireStatus::kOk ? lk.base + h.offset : nullptr);
        return true;
      }
      if (type == wire::MsgType::kRead) {
        IoEngine::Lookup lk = refused != wire::WireStatus::kOk ? refusal : Target(c, h, true, true);
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
      if (type == wire::MsgType::kShmProbe) {
        wire::Header r = h;
        r.type = static_cast<uint8_t>(wire::MsgType::kShmProbeAck);
        r.status = static_cast<uint8_t>(engine_->HasShmBackend() ? wire::WireStatus::kOk
                                                                 : wire::WireStatus::kNoShm);
        r.mem_id = static_cast<uint64_t>(::getpid());
        r.offset = reinterpret_cast<uintptr_t>(engine_->shm_cookie());
        r.uid = *engine_->shm_cookie();
        c.out_local.push_back({r, nullptr, 0, 0, nullptr});
        return true;
      }
      if (type == wire::MsgType::kShmWriteReq || type == wire::MsgType::kShmReadReq) {
        // The same check as a TCP request; the grant names the absolute address, so
        // the initiator's copy lands only where this registry allowed it.
        // A grant holds the region (deregistration waits) until the initiator's
        // kShmWriteDone / kShmReadDone says its copy into / out of it ended.
        const bool write = type == wire::MsgType::kShmWriteReq;
        IoEngine::Lookup lk = !engine_->HasShmBackend()
                                  ? IoEngine::Lookup{wire::WireStatus::kNoShm, nullptr}
                              : refused != wire::WireStatus::kOk ? refusal
                                                                 : Target(c, h, true);
        if (lk.use != nullptr) (write ? c.shm_write_grants : c.shm_read_grants).push_back(lk.use);
        bool ok = lk.status == wire::WireStatus::kOk;
        wire::Header r = h;
        r.type = static_cast<uint8_t>(wire::MsgType::kShmGrant);
        r.status = static_cast<uint8_t>(lk.status);
        r.offset = ok ? reinterpret_cast<uintptr_t>(lk.base + h.offset) : 0;
        c.out_local.push_back({r, nullptr, 0, 0, nullptr});
        // A granted write is accounted when its kShmWriteDone says the bytes are in place.
        if (type == wire::MsgType::kShmReadReq || !ok) Account(c, h, lk.status);
        return true;
      }
      if (type == wire::MsgType::kShmReadDone) {
        if (c.shm_read_grants.empty()) {
          *why = "an SHM read done without a granted read";
          return false;
        }
        c.shm_read_grants.front()->Leave();
        c.shm_read_grants.pop_front();
        return true;  // not answered
      }
      if (type == wire::MsgType::kShmWriteDone) {
        if (c.shm_write_grants.empty()) {
          *why = "an SHM write done without a granted write";
          return false;
        }
        c.shm_write_grants.front()->Leave();
        c.shm_write_grants.pop_front();
        Account(c, h, static_cast<wire::WireStatus>(h.status));
        wire::Header r = h;
        r.type = static_cast<uint8_t>(wire::MsgType::kShmDoneAck);
        r.status = static_cast<uint8_t>(wire::WireStatus::kOk);
        c.out_local.push_back({r, nullptr, 0, 0, nullptr});
        return true;
      }
      if (type == wire::MsgType::kP2pOpenReq) {
        if (c.p2p_grants.size() >= kMaxP2pGrants) {
          *why = StrCat("more than ", kMaxP2pGrants, " P2P open requests on one connection");
          return false;
        }
        std::string payload;
        wire::WireStatus st = engine_->P2pGrant(h.mem_id, c.remote_key, &payload);
        SideAnswer(c, h, wire::MsgType::kP2pGrant, st, std::move(payload));
        return true;
      }
      if (type == wire::MsgType::kShmMapReq || type == wire::MsgType::kNoticeRingReq ||
          type == wire::MsgType::kShmCmaReq) {
        if (c.p2p_grants.size() >= kMaxP2pGrants) {
          *why = StrCat("more than ", kMaxP2pGrants, " side requests on one connection");
          return false;
        }
        std::string payload;
        if (type == wire::MsgType::kShmMapReq) {
          wire::WireStatus st = engine_->ShmMapGrantFor(h.mem_id, c.remote_key, &payload);
          SideAnswer(c, h, wire::MsgType::kShmMapGrant, st, std::move(payload));
        } else if (type == wire::MsgType::kShmCmaReq) {
          wire::WireStatus st = engine_->ShmCmaGrantFor(h.mem_id, c.remote_key, &payload);
          SideAnswer(c, h, wire::MsgType::kShmCmaGrant, st, std::move(payload));
        } else {
          wire::WireStatus st = engine_->NoticeRingFor(c.remote_key, &payload);
          SideAnswer(c, h, wire::MsgType::kNoticeRingGrant, st, std::move(payload));
        }
        return true;
      }
      if (type == wire::MsgType::kRdmaConnect) {
        if (h.length > (1u << 16) || c.p2p_grants.size() >= kMaxP2pGrants) {
          *why = StrCat("an RDMA connect request of ", h.length, " bytes (or too many)");
          return false;
        }
        c.side_in.resize(h.length);
        StartPayload(c, h.length, c.side_in.data());
        return true;
      }
      if (type == wire::MsgType::kRdmaRegionReq) {
        if (c.p2p_grants.size() >= kMaxP2pGrants) {
          *why = StrCat("more than ", kMaxP2pGrants, " side requests on one connection");
          return false;
        }
        std::string payload;
        wire::WireStatus st = engine_->RdmaRegionKey(h.mem_id, &payload);
        SideAnswer(c, h, wire::MsgType::kRdmaRegionKey, st, std::move(payload));
        return true;
      }
      if (type == wire::MsgType::kP2pRevokeAck) {
        engine_->OnP2pRevokeAck(c.remote_key, h.mem_id);
        return true;  // not answered
      }
      if (type == wire::MsgType::kP2pWriteDone) {
        // The initiator finished writing transfer `uid` into our memory (its transfer
        // completed then): record it. Not answered, so an announcement costs each side
        // one message, not two. From a same-host initiator it means that its notice ring
        // was full (our application is not popping): take the ring's records now, so
        // the initiator's next announcements find room there again.
        engine_->DrainNotices(&c.remote_key);
        Account(c, h, static_cast<wire::WireStatus>(h.status));
        return true;
      }
      *why = StrCat("unexpected message type ", int(h.type), " from an initiator");
      return false;
    }
    // Outbound: the target's request to let go of a P2P mapping (answers nothing).
    if (type == wire::MsgType::kP2pRevoke) {
      engine_->OnP2pRevoke(c.remote_key, h.mem_id, SharedOf(c));
      return true;
    }
    // Outbound: a response to our oldest pending request.
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
      engine_->CompletePart(p.record_id, WireStatusCode(status), ok ? "" : Refusal(c, p, status));
      return true;
    }
    if (type == wire::MsgType::kReadData && p.type == wire::MsgType::kRead) {
      c.cur_pending = p;
      if (!ok) {
        engine_->CompletePart(p.record_id, WireStatusCode(status), Refusal(c, p, status));
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
    if (type == wire::MsgType::kShmGrant &&
        (p.type == wire::MsgType::kShmWriteReq || p.type == wire::MsgType::kShmReadReq)) {
      OnShmGrant(c, p, h, status);
      return true;
    }
    if (type == wire::MsgType::kShmDoneAck && p.type == wire::MsgType::kShmWriteDone) {
      if (p.record_id != SubmissionLedger::kNoRecord) {
        engine_->CompletePart(p.record_id, StatusDetail::SUCCESS, {});
      }
      return true;
    }
    *why = StrCat("response type ", int(h.type), " does not match the pending request");
    // Put it back so Close fails it.
    std::lock_guard<std::mutex> lock(c.mu);
    c.pending.push_front(p);
    return false;
  }

  // The initiator's half of an SHM part: copy into (write) or out of (read) the granted
  // range of the target, then for a write tell the target, which accounts the part and
  // acknowledges; the part completes on that acknowledgement, so a completed write's
  // inbound status is already recorded at the target (as over TCP).
  void OnShmGrant(Conn& c, const Pending& p, const wire::Header& h, wire::WireStatus status) {
    if (status != wire::WireStatus::kOk) {
      engine_->CompletePart(p.record_id, WireStatusCode(status), Refusal(c, p, status));
      return;
    }
    bool write = p.type == wire::MsgType::kShmWriteReq;
    int err;
    {
      MORI_SCOPED_TIMER(kIo, "io.shm.cma_copy");
      err = CmaCopy(c.shm_pid, write, p.local, h.offset, p.length);
    }
    std::string error;
    if (err != 0) {
      error = StrCat(write ? "process_vm_writev" : "process_vm_readv", " of ", p.length,
                     " bytes with pid ", c.shm_pid, " (remote engine ", LogSafe(c.remote_key),
                     ", memory ", p.mem_id, " offset ", p.offset, ") failed: ", ErrnoText(err));
      if (err == EPERM) {
        // Allowed at connect, refused now: later transfers of this pair go over TCP.
        if (auto peer = c.peer.lock()) peer->shm_refused.store(true, std::memory_order_release);
        MORI_LOG_WARN(kIo, "engine '", engine_->key(), "': ", error,
                      "; transfers to it fall back to TCP");
      }
    }
    StatusDetail code = err == ESRCH ? StatusDetail::ERR_PEER_LOST : StatusDetail::ERR_TRANSPORT;
    if (!write) {
      // Our copy out of the region has ended (either way): the target may release its
      // hold (the done leaves at the end of this read pass).
      wire::Header d{};
      d.type = static_cast<uint8_t>(wire::MsgType::kShmReadDone);
      d.version = wire::kVersion;
      d.uid = p.uid;
      d.mem_id = p.mem_id;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        c.sendq.push_back({d, nullptr, 0, 0, nullptr});
        c.need_flush = true;
      }
      engine_->CompletePart(p.record_id, err == 0 ? StatusDetail::SUCCESS : code, error);
      return;
    }
    Pending done = p;
    done.type = wire::MsgType::kShmWriteDone;
    if (err != 0) {
      engine_->CompletePart(p.record_id, code, error);
      done.record_id = SubmissionLedger::kNoRecord;
    }
    wire::Header d{};
    d.type = static_cast<uint8_t>(wire::MsgType::kShmWriteDone);
    d.status =
        static_cast<uint8_t>(err == 0 ? wire::WireStatus::kOk : wire::WireStatus::kCopyFailed);
    d.version = wire::kVersion;
    d.num_parts = p.num_parts;
    d.uid = p.uid;
    d.mem_id = p.mem_id;
    d.offset = p.offset;
    d.length = p.length;
    // Request and pending entry together under the lock: a submitter's requests
    // interleave whole, so responses still match pending entries in order.
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.pending.empty()) c.progress_ns = NowNs();
    c.sendq.push_back({d, nullptr, 0, 0, nullptr});
    c.pending.push_back(done);
    c.need_flush = true;
  }

  bool OnReadable(Conn& c) {
    MORI_SCOPED_TIMER(kIo, "io.tcp.on_readable");
    c.rx_ns = NowNs();
    size_t budget = kReadBudget;
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
            Close(c, "hello without this engine's secret");
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
                Close(c, "hello without this engine's secret");
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
      ssize_t n = ::recv(c.fd, c.rbuf.data() + c.rlen, want, 0);
      if (n > 0) {
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
  bool HandleRecvResult(Conn& c, ssize_t n) {
    if (n == 0) {
      Close(c, "connection closed by the peer");
      return false;
    }
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return true;
    Close(c, StrCat("receive failed: ", ErrnoText(errno)));
    return false;
  }

  bool FlushResponses(Conn& c) {
    FlushInbound(c);
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

  void OnWritable(Conn& c) {
    int err;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      err = c.dead ? 0 : FlushLocked(c);
      if (err == 0) PaceRequests(c);
    }
    if (err != 0) Close(c, StrCat("send failed: ", ErrnoText(err)));
  }

 public:
  // Closes the connection and fails every request still waiting on it. Owner thread
  // only (or after Stop).
  void Close(Conn& c, const std::string& reason, StatusDetail code = StatusDetail::ERR_PEER_LOST) {
    FlushInbound(c);             // those parts' data is in place
    if (c.cur_use != nullptr) {  // an inbound write cut short: nothing lands any more
      c.cur_use->Leave();
      c.cur_use = nullptr;
    }
    // An initiator that already holds a grant may still be copying; with its connection
    // gone, the target cannot learn when it stops (a known limit of CMA).
    for (RegionUse* u : c.shm_write_grants) u->Leave();
    c.shm_write_grants.clear();
    for (RegionUse* u : c.shm_read_grants) u->Leave();
    c.shm_read_grants.clear();
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
      ::close(c.fd);
    }
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
      if (auto peer = c.peer.lock()) peer->MarkFailed(msg);
      if (c.in_payload) orphans.push_front(c.cur_pending);
      for (const Pending& p : orphans) {
        if (p.record_id != SubmissionLedger::kNoRecord)
          engine_->CompletePart(p.record_id, code, msg);
      }
    } else {
      MORI_LOG_DEBUG(kIo, "engine '", engine_->key(), "': inbound connection from ",
                     LogSafe(c.remote_key), " closed: ", reason);
    }
    c.in_payload = false;
    std::lock_guard<std::mutex> lock(conns_mu_);
    auto it = conns_.find(&c);
    if (it != conns_.end()) {
      graveyard_.push_back(std::move(it->second));
      conns_.erase(it);
    }
  }

  std::shared_ptr<Conn> SharedOf(Conn& c) {
    std::lock_guard<std::mutex> lock(conns_mu_);
    auto it = conns_.find(&c);
    return it == conns_.end() ? nullptr : it->second;
  }

  void CloseAll(const std::string& reason) {
    std::vector<Conn*> all;
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      for (auto& kv : conns_) all.push_back(kv.first);
    }
    for (Conn* c : all) Close(*c, reason);
    graveyard_.clear();
  }

 private:
  IoEngine* engine_;
  int index_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  int listen_fd_ = -1;
  // PauseAccept's state (reactor thread only): the current interval, when the listener
  // rejoins the epoll set (0: it is in it), the last warning and the failures since.
  static constexpr int64_t kAcceptBackoffMinMs = 10;
  static constexpr int64_t kAcceptBackoffMaxMs = 1000;
  static constexpr int64_t kAcceptLogIntervalMs = 1000;
  int64_t accept_backoff_ms_ = 0;
  int64_t accept_resume_ns_ = 0;
  int64_t accept_logged_ns_ = INT64_MIN / 2;
  uint64_t accept_unlogged_ = 0;
  int64_t refusal_logged_ns_ = INT64_MIN / 2;
  std::atomic<bool> stop_{false};
  std::promise<void> started_;
  std::future<void> started_future_;
  std::mutex tasks_mu_;
  std::vector<std::function<void()>> tasks_;
  bool tasks_stopped_ = false;
  std::thread thread_;
  std::mutex conns_mu_;
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;
  std::vector<std::shared_ptr<Conn>> graveyard_;  // freed after the event batch
};

// ---------------------------------------------------------------------------------------

namespace {
// A header of `type` in this build's wire version, other fields zero.
wire::Header MakeHeader(wire::MsgType type, uint64_t mem_id = 0) {
  wire::Header h{};
  h.type = static_cast<uint8_t>(type);
  h.version = wire::kVersion;
  h.mem_id = mem_id;
  return h;
}

// Queues a header-only message on `c` for its reactor to send (EPOLLOUT armed once;
// messages queued meanwhile leave in the same sendmsg), so the calling thread runs no
// socket send. `answer`: the response the peer will send, or null for a message that
// answers nothing. Dropped when the connection is dead.
void PostOnConn(Conn& c, const wire::Header& h, const Pending* answer) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.dead) return;
  if (answer != nullptr) {
    if (c.pending.empty()) c.progress_ns = NowNs();
    c.pending.push_back(*answer);
  }
  c.sendq.push_back({h, nullptr, 0, 0, nullptr});
  if (!c.out_armed) {
    c.worker->ArmOut(c, true);
    c.out_armed = true;
  }
}
}  // namespace

IoEngine::IoEngine(std::string key, std::string host, uint16_t port)
    : key_(std::move(key)), host_(std::move(host)), options_(HotPathOptions::FromEnv()) {
  MORI_CHECK_ARG(!key_.empty(), "engine key must not be empty");
  MORI_CHECK_ARG(key_.size() <= 4096, "engine key of ", key_.size(), " bytes exceeds 4096");
  if (host_.empty()) host_ = "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host_.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0)
    MORI_THROW(InvalidArgumentError, "cannot resolve host '", host_, "': ", ::gai_strerror(rc));
  std::string error;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      listen_fd_ = fd;
      break;
    }
    error = ErrnoText(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) {
    MORI_THROW(TransportError, "engine '", key_, "' cannot listen on ", host_, ":", port, ": ",
               error);
  }
  ledger_ = std::make_unique<SubmissionLedger>(kLedgerCapacity, !options_.ledger_ring);
  host_id_ = LocalHostIdentity();
  const char* forced = std::getenv("MORI_IO_BACKEND");
  override_ = ParseBackendOverride(forced != nullptr ? forced : "");
  // Nonzero and unpredictable: a peer that reads it back through CMA has reached this
  // process, not another one that happens to have our pid in its namespace.
  shm_cookie_ = (uint64_t{std::random_device{}()} << 32 | std::random_device{}()) | 1;
  secret_ = RandomSecret(wire::kSecretBytes);
  MORI_LOG_DEBUG(kIo, "engine '", key_, "' listening on ", host_, ":", port_);
}

IoEngine::~IoEngine() { Shutdown(); }

void IoEngine::Shutdown() {
  p2p_.reset();  // finishes every copy in flight while the ledger and connections exist
  for (auto& w : workers_) w->Stop();
  workers_.clear();   // closes every connection, failing what was pending
  liveness_.reset();  // its holder, reactor 0, has released it and ended
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  FreeNoticeRings();
}

void IoEngine::CreateTcpBackend(const TcpBackendConfig& config) {
  MORI_CHECK_ARG(workers_.empty(), "engine '", key_,
                 shm_created_ ? "' already runs the reactors its SHM backend started: create the "
                                "TCP backend before SHM to configure them"
                              : "' already has a TCP backend");
  MORI_CHECK_ARG(config.num_worker_threads >= 1 && config.num_worker_threads <= 64,
                 "num_worker_threads ", config.num_worker_threads, " not in [1, 64]");
  MORI_CHECK_ARG(config.qp_per_transfer >= 1 && config.qp_per_transfer <= 64, "qp_per_transfer ",
                 config.qp_per_transfer, " not in [1, 64]");
  MORI_CHECK_ARG(config.chunk_size >= 4096, "chunk_size ", config.chunk_size, " below 4096");
  MORI_CHECK_ARG(config.peer_timeout_ms > 0, "peer_timeout_ms must be positive");
  MORI_CHECK_ARG(config.transfer_timeout_ms > 0, "transfer_timeout_ms ", config.transfer_timeout_ms,
                 " must be positive");
  MORI_CHECK_ARG(config.max_inbound_statuses >= 1, "max_inbound_statuses must be at least 1");
  tcp_config_ = config;
  try {
    liveness_ = std::make_unique<LivenessPage>();
  } catch (const std::exception& e) {
    MORI_LOG_WARN(kIo, "engine '", key_, "': no liveness page (", e.what(),
                  "); same-host initiators poll its pidfd per copy instead");
  }
  for (int i = 0; i < config.num_worker_threads; ++i) {
    workers_.push_back(std::make_unique<Worker>(this, i, i == 0 ? listen_fd_ : -1));
  }
  // Grants carry the liveness word only once reactor 0 holds it.
  workers_[0]->WaitStarted();
}

void IoEngine::CreateShmBackend() {
  MORI_CHECK_ARG(!shm_created_, "engine '", key_, "' already has an SHM backend");
  BackendAvailability a = ProbeBackend(BackendType::kShm);
  shm_self_ok_ = a.available;
  shm_self_reason_ = a.reason;
  if (!a.available) {
    MORI_LOG_WARN(kIo, "engine '", key_, "': SHM backend created, but ", a.reason,
                  "; same-host transfers fall back to TCP");
  }
  if (workers_.empty()) CreateTcpBackend(TcpBackendConfig{});
  shm_created_ = true;
}

BackendChoiceInput IoEngine::ChoiceInput(const Peer& peer, MemoryLocationType local_loc,
                                         MemoryLocationType remote_loc) const {
  BackendChoiceInput in;
  in.local_host_id = host_id_;
  in.remote_host_id = peer.host_id;
  in.local_loc = local_loc;
  in.remote_loc = remote_loc;
  in.local_shm = shm_created_;
  in.remote_shm = peer.remote_shm && peer.pid > 0;
  in.local_p2p = p2p_ != nullptr;
  in.remote_p2p = peer.remote_p2p;
  in.local_rdma = rdma_ != nullptr;
  in.remote_rdma = peer.remote_rdma;
  in.cma_ok = shm_self_ok_;
  in.cma_reason = shm_self_reason_;
  in.override_choice = override_;
  return in;
}

BackendChoice IoEngine::BackendFor(MemoryLocationType local_loc, const std::string& remote_key,
                                   uint64_t remote_mem, MemoryLocationType remote_loc) {
  std::shared_ptr<Peer> peer = FindPeer(remote_key);
  if (!peer) {
    MORI_THROW(NotFoundError, "backend_for: remote engine '", remote_key,
               "' is not registered with engine '", key_, "'");
  }
  if (local_loc != MemoryLocationType::CPU || remote_loc != MemoryLocationType::CPU) {
    return ChooseBackend(ChoiceInput(*peer, local_loc, remote_loc));
  }
  if (workers_.empty()) return {BackendType::kTcp, "no backend created yet"};
  std::string error;
  PeerConnections* pc = Connected(peer, &error);
  if (pc == nullptr) return {BackendType::kTcp, "TCP: the remote engine is unreachable: " + error};
  if (pc->host_choice.backend == BackendType::kShm &&
      peer->shm_refused.load(std::memory_order_acquire)) {
    return {BackendType::kTcp, "TCP: CMA was refused (EPERM) on use after the probe had passed"};
  }
  if (pc->host_choice.backend != BackendType::kShm) return pc->host_choice;
  // Which SHM copy moves this region's bytes, decided as Submit decides it.
  BackendChoiceInput in = ChoiceInput(*peer, local_loc, remote_loc);
  in.shm_path = ShmPath::kCma;
  if (!options_.shm_map) {
    in.shm_path_why = "mapping switched off (MORI_IO_SHM_MAP=0)";
  } else if (ShmMappingFor(peer, remote_mem, &in.shm_path_why)) {
    in.shm_path = ShmPath::kMapped;
  }
  return ChooseBackend(in);
}

std::string IoEngine::ProbeShmPeer(int fd, const Peer& peer) {
  const int timeout = tcp_config_.peer_timeout_ms;
  wire::Header req{};
  req.type = static_cast<uint8_t>(wire::MsgType::kShmProbe);
  req.version = wire::kVersion;
  std::string error;
  if (!SendAll(fd, reinterpret_cast<const char*>(&req), kHdr, timeout, &error)) {
    return "the probe request could not be sent: " + error;
  }
  wire::Header ack{};
  if (!RecvAll(fd, reinterpret_cast<char*>(&ack), kHdr, timeout, &error)) {
    return "the probe got no answer: " + error;
  }
  if (ack.type != static_cast<uint8_t>(wire::MsgType::kShmProbeAck) ||
      ack.version != wire::kVersion) {
    return StrCat("unexpected probe answer (type ", int(ack.type), ", version ", ack.version, ")");
  }
  if (ack.status != static_cast<uint8_t>(wire::WireStatus::kOk)) {
    return WireStatusText(static_cast<wire::WireStatus>(ack.status));
  }
  if (ack.mem_id != static_cast<uint64_t>(peer.pid)) {
    return StrCat("the peer reports pid ", ack.mem_id, " but its EngineDesc says ", peer.pid);
  }
  uint64_t cookie = 0;
  int err = CmaCopy(peer.pid, false, reinterpret_cast<char*>(&cookie), ack.offset, sizeof(cookie));
  if (err != 0) {
    return StrCat("process_vm_readv of pid ", peer.pid, " failed: ", ErrnoText(err),
                  err == EPERM ? " (ptrace rules: kernel.yama.ptrace_scope, or another user)" : "");
  }
  if (cookie != ack.uid) return StrCat("pid ", peer.pid, " is not the remote engine's process");
  return {};
}

void IoEngine::AssignInbound(std::shared_ptr<Conn> conn) {
  size_t i = next_worker_.fetch_add(1, std::memory_order_relaxed) % workers_.size();
  workers_[i]->Add(conn);
}

MemoryRegion IoEngine::RegisterMemory(uintptr_t addr, uint64_t size, int device_id,
                                      MemoryLocationType loc) {
  MORI_CHECK_ARG(addr != 0 || size == 0, "register_memory: null pointer with size ", size);
  MORI_CHECK_ARG(loc == MemoryLocationType::CPU || loc == MemoryLocationType::GPU,
                 "register_memory: location must be CPU or GPU");
  MORI_CHECK_ARG(loc != MemoryLocationType::GPU || device_id >= 0,
                 "register_memory: GPU memory needs its device id (got ", device_id, ")");
  std::unique_lock<std::shared_mutex> lock(mem_mu_);
  MemoryRegion r{next_mem_id_, addr, size, device_id, loc, std::make_shared<RegionUse>()};
  if (rdma_) rdma_keys_[r.id] = rdma_->RegisterRegion(r.id, addr, size);  // may throw
  ++next_mem_id_;
  memory_[r.id] = r;
  memory_epoch_.fetch_add(1, std::memory_order_release);
  return r;
}

void IoEngine::DeregisterMemory(uint64_t id) {
  std::unique_lock<std::shared_mutex> lock(mem_mu_);
  auto it = memory_.find(id);
  if (it == memory_.end()) {
    MORI_THROW(NotFoundError, "deregister_memory: memory ", id, " is not registered with engine '",
               key_, "'");
  }
  // Refuse rather than fail the transfers: a part already on the wire would still land
  // in (or be read from) memory the caller is about to free. See RegionUse.
  RegionUse& use = *it->second.use;
  use.withdrawn.store(true, std::memory_order_seq_cst);
  uint64_t inflight = use.inflight.load(std::memory_order_seq_cst);
  // Remote RDMA reads and writes into the region are the NIC's: its count says.
  if (inflight == 0 && rdma_) inflight = rdma_->InFlight(id);
  if (inflight > 0) {
    use.withdrawn.store(false, std::memory_order_seq_cst);
    MORI_THROW(InvalidStateError, "deregister_memory: memory ", id, " of engine '", key_, "' has ",
               inflight,
               " transfer(s) in flight (this engine's transfers using it, or remote reads and "
               "writes being served from it); wait for them to finish or fail first");
  }
  if (HasP2pGrants(id)) {
    // Peers that mapped it (P2P, shared host memory) copy on their own: ask each to let go and wait
    // for the confirmations, without the registry lock (reactors need it meanwhile; the region is
    // withdrawn, so nothing new reaches it).
    std::shared_ptr<RegionUse> hold = it->second.use;
    lock.unlock();
    try {
      RevokeP2pGrants(id);
    } catch (...) {
      hold->withdrawn.store(false, std::memory_order_seq_cst);
      throw;
    }
    lock.lock();
    it = memory_.find(id);
    if (it == memory_.end()) return;  // a concurrent deregistration finished it
  }
  memory_.erase(it);
  memory_epoch_.fetch_add(1, std::memory_order_release);
  if (p2p_) p2p_->Forget(id);
  if (rdma_) {
    rdma_keys_.erase(id);
    rdma_->DeregisterRegion(id);
  }
}

MemoryRegion IoEngine::LocalRegion(uint64_t id) const {
  std::shared_lock<std::shared_mutex> lock(mem_mu_);
  auto it = memory_.find(id);
  if (it == memory_.end()) {
    MORI_THROW(NotFoundError, "memory ", id, " is not registered with engine '", key_, "'");
  }
  return it->second;
}

bool IoEngine::FindRegion(uint64_t id, MemoryRegion* out) const {
  std::shared_lock<std::shared_mutex> lock(mem_mu_);
  auto it = memory_.find(id);
  if (it == memory_.end()) return false;
  *out = it->second;
  return true;
}

IoEngine::Lookup IoEngine::CheckTarget(uint64_t mem_id, uint64_t offset, uint64_t length,
                                       bool enter, bool allow_gpu) const {
  std::shared_lock<std::shared_mutex> lock(mem_mu_);
  auto it = memory_.find(mem_id);
  if (it == memory_.end()) return {wire::WireStatus::kUnknownMemory, nullptr};
  return CheckRegion(it->second, offset, length, enter, allow_gpu);
}

IoEngine::Lookup IoEngine::CheckRegion(const MemoryRegion& r, uint64_t offset, uint64_t length,
                                       bool enter, bool allow_gpu) {
  int gpu = -1;
  if (r.loc != MemoryLocationType::CPU) {
    if (!allow_gpu || !staging::Unavailable().empty() || length > kMaxStagedPart) {
      return {wire::WireStatus::kNotHostMemory, nullptr};
    }
    gpu = r.device_id;
  }
  if (length > r.size || offset > r.size - length) return {wire::WireStatus::kOutOfBounds, nullptr};
  if (enter && !r.use->Enter()) return {wire::WireStatus::kUnknownMemory, nullptr};
  return {wire::WireStatus::kOk, reinterpret_cast<char*>(r.addr), enter ? r.use.get() : nullptr,
          gpu};
}

void IoEngine::RegisterRemoteEngine(const std::string& key, const std::string& host, uint16_t port,
                                    const std::string& host_id, int pid, bool remote_shm,
                                    bool remote_p2p, bool remote_rdma, const std::string& secret) {
  MORI_CHECK_ARG(!key.empty(), "register_remote_engine: empty engine key");
  MORI_CHECK_ARG(secret.empty() || secret.size() == wire::kSecretBytes,
                 "register_remote_engine: secret of ", secret.size(), " bytes (expected ",
                 wire::kSecretBytes, ")");
  auto peer = std::make_shared<Peer>();
  peer->key = key;
  peer->host = host;
  peer->port = port;
  peer->secret = secret;
  peer->host_id = host_id;
  peer->pid = pid;
  peer->remote_shm = remote_shm;
  peer->remote_p2p = remote_p2p;
  peer->remote_rdma = remote_rdma;
  std::shared_ptr<Peer> old;
  {
    std::unique_lock<std::shared_mutex> lock(peer_mu_);
    peer->generation = next_peer_generation_++;
    auto& slot = peers_[key];
    old = std::move(slot);
    slot = peer;
    peer_epoch_.fetch_add(1, std::memory_order_release);
  }
  if (old && rdma_) rdma_->DisconnectPeer(key, "the remote engine was registered again");
  if (old) {
    // Its reactors see the shutdown as a hang-up and fail what was pending on it.
    if (PeerConnections* pc = old->published.load(std::memory_order_acquire)) {
      for (auto& c : pc->conns) {
        std::lock_guard<std::mutex> lock(c->mu);
        if (!c->dead) ::shutdown(c->fd, SHUT_RDWR);
      }
    }
  }
}

void IoEngine::DeregisterRemoteEngine(const std::string& key) {
  std::shared_ptr<Peer> old;
  {
    std::unique_lock<std::shared_mutex> lock(peer_mu_);
    auto it = peers_.find(key);
    if (it == peers_.end()) {
      MORI_THROW(NotFoundError, "remote engine '", key, "' is not registered with engine '", key_,
                 "'");
    }
    old = std::move(it->second);
    peers_.erase(it);
    peer_epoch_.fetch_add(1, std::memory_order_release);
  }
  old->MarkFailed("the remote engine was deregistered");
  if (rdma_) rdma_->DisconnectPeer(key, "the remote engine was deregistered");
  if (PeerConnections* pc = old->published.load(std::memory_order_acquire)) {
    for (auto& c : pc->conns) {
      std::lock_guard<std::mutex> lock(c->mu);
      if (!c->dead) ::shutdown(c->fd, SHUT_RDWR);
    }
  }
}

bool IoEngine::HasRemoteEngine(const std::string& key) const { return FindPeer(key) != nullptr; }

std::shared_ptr<Peer> IoEngine::FindPeer(const std::string& key) const {
  std::shared_lock<std::shared_mutex> lock(peer_mu_);
  auto it = peers_.find(key);
  return it == peers_.end() ? nullptr : it->second;
}

std::string IoEngine::HelloMessage(const Peer& peer) const {
  wire::Header hello = MakeHeader(wire::MsgType::kHello);
  // A peer registered without a secret (an EngineDesc that carried none) gets zeros,
  // which it refuses: the hello keeps its layout.
  std::string secret = peer.secret;
  secret.resize(wire::kSecretBytes, '\0');
  hello.num_parts = static_cast<uint32_t>(key_.size());
  hello.length = 2 * wire::kSecretBytes + key_.size();
  return std::string(reinterpret_cast<const char*>(&hello), kHdr) + secret + key_ +
         InitiatorCredential(secret_, secret, key_);
}

bool IoEngine::SecretMatches(const char* data, size_t n) const {
  return SecretEqual(secret_, data, n);
}

bool IoEngine::InitiatorAccepted(const std::string& key, const std::string& credential,
                                 std::string* why_not) {
  std::shared_ptr<Peer> peer = FindPeer(key);
  if (peer && !peer->secret.empty()) {
    // Registered here: its EngineDesc's secret is known, so its hellos must prove it.
    std::string expected = InitiatorCredential(peer->secret, secret_, key);
    if (SecretEqual(expected, credential.data(), credential.size())) return true;
    *why_not = credential.empty() ? "no credential, and that engine is registered here"
                                  : "its credential is not that of the registered EngineDesc";
    return false;
  }
  // Not registered (MORI's flows need not register the reading side): the first
  // connection of the key binds its credential while any of its connections is open.
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto range = inbound_by_key_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    std::shared_ptr<Conn> c = it->second.lock();
    if (!c) continue;
    std::lock_guard<std::mutex> cl(c->mu);
    if (!c->dead && !SecretEqual(c->credential, credential.data(), credential.size())) {
      *why_not = "another credential than that of its connections already open here";
      return false;
    }
  }
  return true;
}

PeerConnections* IoEngine::Connect(const std::shared_ptr<Peer>& peer_ptr, std::string* error) {
  Peer& peer = *peer_ptr;
  std::lock_guard<std::mutex> lock(peer.connect_mu);
  if (PeerConnections* pc = peer.published.load(std::memory_order_acquire)) return pc;
  auto pc = std::make_unique<PeerConnections>();
  int timeout = tcp_config_.peer_timeout_ms;
  std::string addr = StrCat(peer.host, ":", peer.port);
  const std::string msg = HelloMessage(peer);
  for (int i = 0; i < tcp_config_.qp_per_transfer; ++i) {
    int fd = ConnectTo(peer.host, peer.port, timeout, error);
    if (fd < 0 || !SendAll(fd, msg.data(), msg.size(), timeout, error)) {
      if (fd >= 0) ::close(fd);
      for (auto& c : pc->conns) ::close(c->fd);
      *error = StrCat("cannot reach remote engine ", LogSafe(peer.key), " at ", addr, ": ", *error);
      return nullptr;
    }
    SetSocketOptions(fd, tcp_config_);
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->outbound = true;
    c->remote_key = peer.key;
    c->peer = peer_ptr;
    c->peer_addr = addr;
    c->shm_pid = peer.pid;
    pc->conns.push_back(std::move(c));
  }
  pc->host_choice =
      ChooseBackend(ChoiceInput(peer, MemoryLocationType::CPU, MemoryLocationType::CPU));
  if (pc->host_choice.backend == BackendType::kShm) {
    // The first use of CMA for this pair, before any transfer relies on it.
    std::string why = ProbeShmPeer(pc->conns[0]->fd, peer);
    if (!why.empty()) {
      BackendChoiceInput in = ChoiceInput(peer, MemoryLocationType::CPU, MemoryLocationType::CPU);
      in.cma_ok = false;
      in.cma_reason = why;
      pc->host_choice = ChooseBackend(in);
      MORI_LOG_WARN(kIo, "engine '", key_, "' -> ", LogSafe(peer.key), ": ",
                    pc->host_choice.reason);
    }
  }
  for (auto& c : pc->conns) {
    workers_[next_worker_.fetch_add(1, std::memory_order_relaxed) % workers_.size()]->Add(c);
  }
  peer.owned = std::move(pc);
  // Published once: readers load it with acquire and never take connect_mu.
  peer.published.store(peer.owned.get(), std::memory_order_release);
  MORI_LOG_DEBUG(kIo, "engine '", key_, "' connected to ", LogSafe(peer.key), " at ", addr,
                 " with ", tcp_config_.qp_per_transfer,
                 " connection(s); host memory: ", BackendTypeName(peer.owned->host_choice.backend),
                 " (", peer.owned->host_choice.reason, ")");
  return peer.owned.get();
}

PeerConnections* IoEngine::Connected(const std::shared_ptr<Peer>& peer, std::string* error) {
  PeerConnections* pc;
  if (options_.lockfree_endpoint) {
    pc = peer->published.load(std::memory_order_acquire);
  } else {
    std::lock_guard<std::mutex> lock(peer->connect_mu);
    pc = peer->owned.get();
  }
  return pc != nullptr ? pc : Connect(peer, error);
}

void IoEngine::CompletePart(uint64_t record_id, StatusDetail code, const std::string& message) {
  TransferRecord* rec = ledger_->Lookup(record_id);
  if (rec == nullptr) {
    MORI_LOG_ERROR(kIo, "engine '", key_, "': completion for record ", record_id,
                   " that is not live");
    return;
  }
  if (code != StatusDetail::SUCCESS) {
    uint32_t none = 0;
    if (rec->error_code.compare_exchange_strong(none, static_cast<uint32_t>(code),
                                                std::memory_order_acq_rel)) {
      rec->error_message = message;
    }
  }
  if (rec->parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::shared_ptr<TransferState> state = std::move(rec->state);
  auto err = static_cast<StatusDetail>(rec->error_code.load(std::memory_order_acquire));
  std::string msg = err != StatusDetail::SUCCESS ? std::move(rec->error_message) : std::string();
  RegionUse* use = rec->local_use;
  rec->local_use = nullptr;
  ledger_->Release(record_id);
  // Before Finish: a caller that saw the transfer finish may deregister its memory.
  if (use != nullptr) use->Leave();
  if (state) state->Finish(err, std::move(msg));
}

void IoEngine::RecordInboundParts(const std::string& remote_key, const InboundPart* parts,
                                  size_t n) {
  if (!tcp_config_.enable_notification) return;
  std::lock_guard<std::mutex> lock(inbound_mu_);
  auto& by_uid = inbound_[remote_key];
  std::shared_ptr<const std::string>& shared_key = inbound_keys_[remote_key];
  if (!shared_key) shared_key = std::make_shared<const std::string>(remote_key);
  InboundEntry* e = nullptr;
  uint64_t uid = 0;
  const size_t cap = tcp_config_.max_inbound_statuses;
  for (size_t i = 0; i < n; ++i) {
    const InboundPart& p = parts[i];
    // unordered_map references stay valid across inserts, so a run of one uid reuses it
    // (eviction removes only older entries: never the one just inserted).
    if (e == nullptr || p.uid != uid) {
      auto [it, inserted] = by_uid.try_emplace(p.uid);
      e = &it->second;
      uid = p.uid;
      if (inserted) {
        e->seq = ++inbound_seq_;
        inbound_order_.push_back({shared_key, p.uid, e->seq});
        ++inbound_count_;
        EvictInboundLocked(cap);
      }
    }
    e->total = p.num_parts;
    ++e->seen;
    if (p.status != wire::WireStatus::kOk && !e->failed) {
      e->failed = true;
      e->message = StrCat("inbound transfer ", p.uid, " from ", LogSafe(remote_key), ": ", p.length,
                          " bytes at offset ", p.offset, " of memory ", p.mem_id,
                          " refused: ", WireStatusText(p.status));
    }
  }
}

std::shared_ptr<TransferState> IoEngine::PopInboundTransferStatus(const std::string& remote_key,
                                                                  uint64_t uid) {
  DrainNotices(&remote_key);
  std::lock_guard<std::mutex> lock(inbound_mu_);
  auto it = inbound_.find(remote_key);
  if (it == inbound_.end()) return nullptr;
  auto e = it->second.find(uid);
  // RDMA notifications carry the uid's low 24 bits (the immediate data's room).
  if (e == it->second.end() && rdma_) e = it->second.find(uid & rdma::kImmUidMask);
  if (e == it->second.end() || e->second.seen < e->second.total) return nullptr;
  auto state = std::make_shared<TransferState>();
  state->Finish(e->second.failed ? StatusDetail::ERR_TRANSPORT : StatusDetail::SUCCESS,
                e->second.message);
  it->second.erase(e);
  --inbound_count_;
  // Popped entries leave stale order items; drop them once they outnumber live ones,
  // so the order queue stays within twice the held statuses (amortized O(1)).
  while (!inbound_order_.empty() && !InboundLive(inbound_order_.front())) {
    inbound_order_.pop_front();
  }
  if (inbound_order_.size() > 2 * inbound_count_ + 64) {
    std::deque<InboundOrder> kept;
    for (InboundOrder& o : inbound_order_) {
      if (InboundLive(o)) kept.push_back(std::move(o));
    }
    inbound_order_.swap(kept);
  }
  return state;
}

bool IoEngine::InboundLive(const InboundOrder& o) const {
  auto k = inbound_.find(*o.key);
  if (k == inbound_.end()) return false;
  auto e = k->second.find(o.uid);
  return e != k->second.end() && e->second.seq == o.seq;
}

void IoEngine::EvictInboundLocked(size_t cap) {
  while (inbound_count_ > cap && !inbound_order_.empty()) {
    InboundOrder o = std::move(inbound_order_.front());
    inbound_order_.pop_front();
    if (!InboundLive(o)) continue;
    auto& by_uid = inbound_[*o.key];
    const InboundEntry& e = by_uid[o.uid];
    MORI_LOG_DEBUG(kIo, "engine '", key_, "': dropping the unpopped inbound status of transfer ",
                   o.uid, " from ", LogSafe(*o.key), " (", e.seen, "/", e.total, " parts",
                   e.failed ? ", failed" : "", "): more than max_inbound_statuses ", cap, " held");
    by_uid.erase(o.uid);
    --inbound_count_;
    ++inbound_evicted_;
  }
}

size_t IoEngine::inbound_held() {
  DrainNotices(nullptr);
  std::lock_guard<std::mutex> lock(inbound_mu_);
  return inbound_count_;
}

void IoEngine::DrainNoticesLocked(const std::string& key, GrantedRing& ring) {
  std::vector<NoticeRecord> records;
  while (NoticeRing::Drain(reinterpret_cast<void*>(ring.addr), ring.capacity, &ring.head, 4096,
                           &records) > 0) {
    std::vector<InboundPart> parts;
    parts.reserve(records.size());
    for (const NoticeRecord& r : records) {
      parts.push_back({r.uid, 1, wire::WireStatus::kOk, r.mem_id, 0, r.bytes});
    }
    RecordInboundParts(key, parts.data(), parts.size());
    records.clear();
  }
}

void IoEngine::DrainNotices(const std::string* key) {
  std::lock_guard<std::mutex> lock(notice_mu_);
  if (notice_rings_.empty()) return;
  if (key != nullptr) {
    auto it = notice_rings_.find(*key);
    if (it != notice_rings_.end()) DrainNoticesLocked(it->first, it->second);
    return;
  }
  for (auto& [k, ring] : notice_rings_) DrainNoticesLocked(k, ring);
}

void IoEngine::FreeNoticeRings() {
  std::lock_guard<std::mutex> lock(notice_mu_);
  for (auto& [k, ring] : notice_rings_) FreeSharedHost(ring.addr);  // peers keep their pages
  notice_rings_.clear();
}

size_t IoEngine::notice_rings_granted() {
  std::lock_guard<std::mutex> lock(notice_mu_);
  return notice_rings_.size();
}

bool IoEngine::HasLiveInbound(const std::string& key) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto range = inbound_by_key_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    if (std::shared_ptr<Conn> c = it->second.lock()) {
      std::lock_guard<std::mutex> cl(c->mu);
      if (!c->dead) return true;
    }
  }
  return false;
}

wire::WireStatus IoEngine::NoticeRingFor(const std::string& initiator_key, std::string* payload) {
  const uint32_t slots = options_.notice_ring_slots;
  // Rings carry announcements of one-sided same-host writes, which only SHM and P2P make.
  if (slots == 0 || (!shm_created_ && !p2p_)) return wire::WireStatus::kNotShareable;
  const size_t cap = options_.max_notice_rings;
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
      if (!HasLiveInbound(k)) gone.push_back(k);
    }
  }
  const uint64_t bytes = NoticeRing::BytesFor(slots);
  SharedHostBlock b;
  try {
    b = AllocateSharedHost(bytes);
  } catch (const std::exception& e) {
    MORI_LOG_WARN(kIo, "engine '", key_, "': no notice ring for ", LogSafe(initiator_key), " (",
                  e.what(), "): its announcements come over TCP");
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
    MORI_LOG_WARN(kIo, "engine '", key_, "': no notice ring for ", LogSafe(initiator_key), " (",
                  notice_rings_.size(), " granted, MORI_IO_MAX_NOTICE_RINGS ", cap,
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

std::shared_ptr<ShmMapping> IoEngine::NoticeRingOf(const std::shared_ptr<Peer>& peer) {
  if (!options_.notice_ring) return nullptr;
  // Every write asks: after the first, one acquire load and no lock.
  if (peer->notice_state.load(std::memory_order_acquire) != 0) return peer->notice_ring;
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  if (peer->notice_state.load(std::memory_order_relaxed) != 0) return peer->notice_ring;
  std::string answer, error;
  StatusDetail code = StatusDetail::SUCCESS;
  wire::WireStatus status = wire::WireStatus::kOk;
  std::shared_ptr<ShmMapping> m;
  if (SideRequest(*peer, wire::MsgType::kNoticeRingReq, wire::MsgType::kNoticeRingGrant, 0, {},
                  &answer, &code, &error, &status)) {
    try {
      m = MapPeerRegion(UnpackShmMapGrant(answer), &error);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (m && !NoticeRing::Check(m->region, m->size, &error)) m.reset();
  }
  if (!m) {
    MORI_LOG_INFO(kIo, "engine '", key_, "': write announcements to ", LogSafe(peer->key),
                  " go over TCP (no notice ring: ", error.empty() ? "not granted" : error, ")");
    peer->notice_state.store(-1, std::memory_order_release);
    return nullptr;
  }
  peer->notice_ring = m;
  peer->notice_state.store(1, std::memory_order_release);
  return m;
}

int IoEngine::NoticeRingState(const std::string& remote_key) {
  if (!options_.notice_ring) return -1;
  std::shared_ptr<Peer> peer = FindPeer(remote_key);
  if (!peer) return 0;
  return peer->notice_state.load(std::memory_order_acquire);
}

uint64_t IoEngine::inbound_evicted() {
  std::lock_guard<std::mutex> lock(inbound_mu_);
  return inbound_evicted_;
}

namespace {
std::shared_ptr<TransferState> Finished(StatusDetail code, std::string message) {
  auto s = std::make_shared<TransferState>();
  s->Finish(code, std::move(message));
  return s;
}
}  // namespace

std::shared_ptr<TransferState> IoEngine::RemoteBoundsError(Op op, const TransferSpan* spans,
                                                           size_t n, uint64_t limit,
                                                           uint64_t remote_mem,
                                                           const std::string& peer_key) {
  for (size_t i = 0; i < n; ++i) {
    const TransferSpan& s = spans[i];
    if (s.size > limit || s.remote_offset > limit - s.size) {
      return Finished(StatusDetail::ERR_OUT_OF_BOUNDS,
                      StrCat(op == Op::kWrite ? "write " : "read ", i, ": remote range [",
                             s.remote_offset, ", +", s.size, ") exceeds memory ", remote_mem,
                             " as registered with '", peer_key, "' (", limit, " bytes)"));
    }
  }
  return nullptr;
}

std::shared_ptr<TransferState> IoEngine::BeginTransfer(const MemoryRegion& local, uint32_t parts,
                                                       bool long_spin, uint64_t* rid) {
  *rid = SubmissionLedger::kNoRecord;
  RegionUse* use = local.use.get();
  if (use != nullptr && !use->Enter()) {
    return Finished(
        StatusDetail::ERR_NOT_FOUND,
        StrCat("local memory ", local.id, " was deregistered from engine '", key_, "'"));
  }
  uint64_t id = ledger_->Admit();
  if (id == SubmissionLedger::kNoRecord) {
    if (use != nullptr) use->Leave();
    return Finished(StatusDetail::ERR_BAD_STATE,
                    StrCat("too many transfers in flight: ", ledger_->window(),
                           " records span the submission ledger's admission limit of ",
                           ledger_->admission_limit(), "; wait for earlier transfers"));
  }
  auto state = std::make_shared<TransferState>();
  if (long_spin) state->SetLongSpin();
  state->SetInProgress();
  TransferRecord* rec = ledger_->Lookup(id);
  rec->state = state;
  rec->local_use = use;
  rec->parts_left.store(parts, std::memory_order_release);
  *rid = id;
  return state;
}

std::shared_ptr<TransferState> IoEngine::Transfer(Op op, uint64_t local_mem,
                                                  const std::string& remote_key,
                                                  uint64_t remote_mem, uint64_t remote_size,
                                                  MemoryLocationType remote_loc,
                                                  const TransferSpan* spans, size_t n,
                                                  uint64_t uid) {
  MemoryRegion local;
  {
    std::shared_lock<std::shared_mutex> lock(mem_mu_);
    auto it = memory_.find(local_mem);
    if (it == memory_.end()) {
      return Finished(StatusDetail::ERR_NOT_FOUND,
                      StrCat("local memory ", local_mem, " is not registered with engine '", key_,
                             "' (never, or deregistered)"));
    }
    local = it->second;
  }
  return Submit(op, local, FindPeer(remote_key), remote_key, remote_mem, remote_size, remote_loc,
                spans, n, uid);
}

std::shared_ptr<TransferState> IoEngine::Submit(Op op, const MemoryRegion& local,
                                                const std::shared_ptr<Peer>& peer,
                                                const std::string& remote_key, uint64_t remote_mem,
                                                uint64_t remote_size, MemoryLocationType remote_loc,
                                                const TransferSpan* spans, size_t n, uint64_t uid) {
  MORI_SCOPED_TIMER(kIo, "io.submit");
  const char* verb = op == Op::kWrite ? "write" : "read";
  if (workers_.empty()) {
    return Finished(StatusDetail::ERR_BAD_STATE,
                    StrCat("engine '", key_,
                           "' has no backend: call create_backend(BackendType.TCP or SHM) first"));
  }
  if (!peer) {
    return Finished(StatusDetail::ERR_NOT_FOUND,
                    StrCat("remote engine '", remote_key, "' is not registered with engine '", key_,
                           "': call register_remote_engine with its EngineDesc"));
  }
  const bool gpu = local.loc != MemoryLocationType::CPU || remote_loc != MemoryLocationType::CPU;
  const bool p2p = gpu && UseP2p(*peer, local.loc, remote_loc);
  const bool rdma = !p2p && UseRdma(*peer, local.loc, remote_loc);
  // GPU memory over TCP: local GPU bytes are staged here (parts of at most kGpuChunk),
  // the target stages its own GPU memory (or refuses where it cannot).
  const bool local_gpu = local.loc == MemoryLocationType::GPU && !p2p && !rdma;
  if (local_gpu && !staging::Unavailable().empty()) {
    return Finished(StatusDetail::ERR_INVALID_ARGS,
                    StrCat(verb, " from/into local GPU memory ", local.id,
                           " over TCP needs staging, and ", staging::Unavailable(), " (",
                           ChooseBackend(ChoiceInput(*peer, local.loc, remote_loc)).reason, ")"));
  }
  uint64_t chunk = tcp_config_.enable_chunking ? tcp_config_.chunk_size : ~uint64_t{0};
  if (gpu && !p2p && !rdma) chunk = std::min(chunk, kGpuChunk);
  uint64_t parts = 0;
  uint64_t extent_lo = ~uint64_t{0};  // the lowest offset and highest end of the spans
  uint64_t extent_hi = 0;
  for (size_t i = 0; i < n; ++i) {
    const TransferSpan& s = spans[i];
    if (s.size > local.size || s.local_offset > local.size - s.size) {
      return Finished(StatusDetail::ERR_OUT_OF_BOUNDS,
                      StrCat(verb, " ", i, ": local range [", s.local_offset, ", +", s.size,
                             ") exceeds local memory ", local.id, " of ", local.size, " bytes"));
    }
    if (s.size > remote_size || s.remote_offset > remote_size - s.size) {
      return Finished(StatusDetail::ERR_OUT_OF_BOUNDS,
                      StrCat(verb, " ", i, ": remote range [", s.remote_offset, ", +", s.size,
                             ") exceeds remote memory ", remote_mem, " of '", remote_key, "' (",
                             remote_size, " bytes)"));
    }
    // Not (size + chunk - 1) / chunk: with chunking off, chunk is UINT64_MAX and that
    // sum wraps to zero parts.
    if (s.size > 0) {
      parts += (s.size - 1) / chunk + 1;
      extent_lo = std::min(extent_lo, s.remote_offset);
      extent_hi = std::max(extent_hi, s.remote_offset + s.size);
    }
  }
  if (parts > UINT32_MAX) {
    return Finished(StatusDetail::ERR_INVALID_ARGS,
                    StrCat("transfer of ", parts, " parts is too large"));
  }
  if (peer->failed.load(std::memory_order_acquire)) {
    return Finished(StatusDetail::ERR_PEER_LOST,
                    StrCat("remote engine '", remote_key, "' is unreachable (", peer->FailReason(),
                           "); register it again to retry"));
  }
  std::string connect_error;
  PeerConnections* pc = Connected(peer, &connect_error);
  if (pc == nullptr) {
    peer->MarkFailed(connect_error);
    return Finished(StatusDetail::ERR_PEER_LOST, connect_error);
  }
  if (p2p) return SubmitP2p(op, local, peer, pc, remote_mem, spans, n, uid);
  if (rdma) return SubmitRdma(op, local, peer, remote_mem, spans, n, uid);
  if (parts == 0) return Finished(StatusDetail::SUCCESS, {});
  const bool shm = pc->host_choice.backend == BackendType::kShm &&
                   local.loc == MemoryLocationType::CPU && remote_loc == MemoryLocationType::CPU &&
                   !peer->shm_refused.load(std::memory_order_relaxed);
  if (shm && options_.shm_map) {
    if (std::shared_ptr<ShmMapping> m = ShmMappingFor(peer, remote_mem)) {
      return SubmitShmMapped(op, local, peer, pc, remote_mem, std::move(m), spans, n, uid);
    }
  }
  if (shm && options_.cma_cache) {
    StatusDetail code = StatusDetail::SUCCESS;
    std::string error;
    std::shared_ptr<CmaRemote> g = CmaRemoteFor(peer, remote_mem, &code, &error);
    if (!g) return Finished(code, std::move(error));
    return SubmitShmCma(op, local, peer, pc, remote_mem, std::move(g), spans, n, uid);
  }

  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state =
      BeginTransfer(local, static_cast<uint32_t>(parts), false, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;

  const size_t nconn = pc->conns.size();
  const uint32_t start = peer->next_conn.fetch_add(1, std::memory_order_relaxed);
  auto type = shm ? (op == Op::kWrite ? wire::MsgType::kShmWriteReq : wire::MsgType::kShmReadReq)
                  : (op == Op::kWrite ? wire::MsgType::kWrite : wire::MsgType::kRead);
  const bool payload = type == wire::MsgType::kWrite;
  char* local_base = reinterpret_cast<char*>(local.addr);
  wire::Header h{};
  h.type = static_cast<uint8_t>(type);
  h.version = wire::kVersion;
  h.num_parts = static_cast<uint32_t>(parts);
  h.uid = uid;
  h.mem_id = remote_mem;
  for (size_t k = 0; k < nconn && k < parts; ++k) {
    Conn& c = *pc->conns[(start + k) % nconn];
    uint32_t refused = 0;
    uint32_t unstaged = 0;
    int err = 0;
    std::string dead_reason;
    std::string stage_error;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.pending.empty()) c.progress_ns = NowNs();  // the stall clock starts now
      if (parts > 1 && !c.dead) {  // the target checks the whole before any part
        wire::Header x = h;
        x.type = static_cast<uint8_t>(wire::MsgType::kTransferExtent);
        x.offset = extent_lo;
        x.length = extent_hi - extent_lo;
        c.sendq.push_back({x, nullptr, 0, 0, nullptr});
      }
      uint64_t p = 0;  // part index across the transfer; part p goes to connection p % nconn
      for (size_t i = 0; i < n; ++i) {
        const TransferSpan& s = spans[i];
        for (uint64_t off = 0; off < s.size; off += chunk, ++p) {
          if (p % nconn != k) continue;
          uint64_t len = std::min(chunk, s.size - off);
          if (c.dead) {
            ++refused;
            continue;
          }
          h.offset = s.remote_offset + off;
          h.length = len;
          char* local_ptr = local_base + s.local_offset + off;
          std::shared_ptr<char> staged;
          if (payload && local_gpu) {
            try {
              staged = staging::Buffer(len);
              staging::ToHost(staged.get(), local_ptr, len, local.device_id);
            } catch (const std::exception& e) {
              ++unstaged;
              stage_error = StrCat("staging ", len, " bytes of local GPU memory ", local.id,
                                   " failed: ", e.what());
              continue;
            }
          }
          const char* src = staged ? staged.get() : local_ptr;
          c.sendq.push_back({h, payload ? src : nullptr, payload ? len : 0, 0, nullptr, staged});
          c.pending.push_back({rid, type, local_ptr, len, remote_mem, h.offset, uid, h.num_parts,
                               local_gpu ? local.device_id : -1});
        }
      }
      if (c.dead) {
        dead_reason = c.dead_reason;
      } else {
        err = c.worker->FlushLocked(c);
        // The reactor notices the shutdown as a hang-up and fails this connection's
        // pending requests, ours included.
        if (err != 0) ::shutdown(c.fd, SHUT_RDWR);
      }
    }
    for (uint32_t r = 0; r < refused; ++r) {
      CompletePart(rid, StatusDetail::ERR_PEER_LOST,
                   StrCat("connection to remote engine '", remote_key, "' lost: ", dead_reason,
                          "; register it again to retry"));
    }
    for (uint32_t r = 0; r < unstaged; ++r)
      CompletePart(rid, StatusDetail::ERR_GPU_OP, stage_error);
  }
  return state;
}

void IoEngine::CreateP2pBackend(const P2pBackendConfig& config) {
  MORI_CHECK_ARG(p2p_ == nullptr, "engine '", key_, "' already has a P2P backend");
  auto backend = std::make_unique<P2pBackend>(config);  // throws where CUDA is missing
  if (workers_.empty()) CreateTcpBackend(TcpBackendConfig{});
  p2p_ = std::move(backend);
}

void IoEngine::RecordGrant(uint64_t mem_id, const std::string& initiator_key) {
  // Recorded before the grant leaves: a deregistration from here on revokes it.
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto& keys = p2p_granted_[mem_id];
  if (std::find(keys.begin(), keys.end(), initiator_key) == keys.end()) {
    keys.push_back(initiator_key);
  }
}

bool IoEngine::HasP2pGrants(uint64_t id) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  return p2p_granted_.count(id) != 0;
}

void IoEngine::ForgetGrant(uint64_t mem_id, const std::string& initiator_key) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto it = p2p_granted_.find(mem_id);
  if (it == p2p_granted_.end()) return;
  auto& keys = it->second;
  keys.erase(std::remove(keys.begin(), keys.end(), initiator_key), keys.end());
  if (keys.empty()) p2p_granted_.erase(it);
}

// A grant of `mem_id` to `initiator_key`, for map and CMA grants: the region is checked,
// the grant recorded, and the region checked again. A deregistration sets `withdrawn`
// and then looks for records (under p2p_mu_); so either it finds this record and
// revokes the grant, or the second check sees the withdrawal and the grant is refused.
// Refused requests leave no record (a peer asking for many ids costs no memory).
wire::WireStatus IoEngine::RecordCheckedGrant(uint64_t mem_id, const std::string& initiator_key,
                                              MemoryRegion* r) {
  if (!shm_created_) return wire::WireStatus::kNoShm;
  if (!FindRegion(mem_id, r) || r->use->withdrawn.load(std::memory_order_seq_cst)) {
    return wire::WireStatus::kUnknownMemory;
  }
  if (r->loc != MemoryLocationType::CPU) return wire::WireStatus::kNotHostMemory;
  RecordGrant(mem_id, initiator_key);
  MemoryRegion again;
  if (!FindRegion(mem_id, &again)) {
    ForgetGrant(mem_id, initiator_key);  // deregistered already: no revoke will come
    return wire::WireStatus::kUnknownMemory;
  }
  // Withdrawn: the deregistration in progress revokes the record (and drops it).
  if (again.use->withdrawn.load(std::memory_order_seq_cst)) return wire::WireStatus::kUnknownMemory;
  return wire::WireStatus::kOk;
}

wire::WireStatus IoEngine::ShmMapGrantFor(uint64_t mem_id, const std::string& initiator_key,
                                          std::string* payload) {
  if (!shm_created_) return wire::WireStatus::kNoShm;
  MemoryRegion r;
  SharedHostBlock b;
  if (FindRegion(mem_id, &r) && r.loc == MemoryLocationType::CPU &&
      !FindSharedHost(r.addr, r.size, &b)) {
    return wire::WireStatus::kNotShareable;
  }
  wire::WireStatus st = RecordCheckedGrant(mem_id, initiator_key, &r);
  if (st != wire::WireStatus::kOk) return st;
  if (!FindSharedHost(r.addr, r.size, &b)) {  // its block was freed meanwhile
    ForgetGrant(mem_id, initiator_key);
    return wire::WireStatus::kNotShareable;
  }
  ShmMapGrant g;
  g.pid = static_cast<int32_t>(::getpid());
  g.fd = b.fd;
  g.block_size = b.size;
  g.region_offset = r.addr - b.addr;
  g.region_size = r.size;
  if (liveness_) g.live = liveness_->Grant();
  *payload = PackShmMapGrant(g);
  return wire::WireStatus::kOk;
}

wire::WireStatus IoEngine::ShmCmaGrantFor(uint64_t mem_id, const std::string& initiator_key,
                                          std::string* payload) {
  MemoryRegion r;
  wire::WireStatus st = RecordCheckedGrant(mem_id, initiator_key, &r);
  if (st != wire::WireStatus::kOk) return st;
  CmaGrant g;
  g.pid = static_cast<int32_t>(::getpid());
  g.addr = r.addr;
  g.size = r.size;
  if (liveness_) g.live = liveness_->Grant();
  *payload = PackCmaGrant(g);
  return wire::WireStatus::kOk;
}

wire::WireStatus IoEngine::P2pGrant(uint64_t mem_id, const std::string& initiator_key,
                                    std::string* payload) {
  if (!p2p_) return wire::WireStatus::kNoP2p;
  MemoryRegion r;
  if (!FindRegion(mem_id, &r) || r.use->withdrawn.load(std::memory_order_seq_cst)) {
    return wire::WireStatus::kUnknownMemory;
  }
  RecordGrant(mem_id, initiator_key);
  if (r.loc != MemoryLocationType::GPU) return wire::WireStatus::kNotGpuMemory;
  try {
    *payload = p2p_->Export(r.id, r.addr, r.size, r.device_id);
  } catch (const std::exception& e) {
    *payload = e.what();
    MORI_LOG_WARN(kIo, "engine '", key_, "': P2P export of memory ", mem_id, " failed: ", e.what());
    return wire::WireStatus::kExportFailed;
  }
  // Deregistered meanwhile: do not hand out a mapping of memory the caller may free.
  if (!FindRegion(mem_id, &r) || r.use->withdrawn.load(std::memory_order_seq_cst)) {
    p2p_->Forget(mem_id);
    payload->clear();
    return wire::WireStatus::kUnknownMemory;
  }
  return wire::WireStatus::kOk;
}

void IoEngine::NoteInbound(const std::string& initiator_key, std::weak_ptr<Conn> conn) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  // Drop entries of closed connections as they accumulate.
  for (auto it = inbound_by_key_.begin(); it != inbound_by_key_.end();) {
    it = it->second.expired() ? inbound_by_key_.erase(it) : std::next(it);
  }
  inbound_by_key_.emplace(initiator_key, std::move(conn));
}

void IoEngine::RevokeP2pGrants(uint64_t id) {
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    auto it = p2p_granted_.find(id);
    if (it == p2p_granted_.end()) return;
    keys = it->second;
  }
  std::vector<std::string> unreachable;
  for (const std::string& key : keys) {
    std::shared_ptr<Conn> conn;
    {
      std::lock_guard<std::mutex> lock(p2p_mu_);
      auto range = inbound_by_key_.equal_range(key);
      for (auto it = range.first; it != range.second && !conn; ++it) {
        std::shared_ptr<Conn> c = it->second.lock();
        if (c) {
          std::lock_guard<std::mutex> cl(c->mu);
          if (!c->dead) conn = c;
        }
      }
      if (conn) p2p_revoking_.emplace_back(key, id);
    }
    if (!conn) {
      // No connection from it is left: its engine is gone or disconnected, and its
      // transfers to us have failed; a process that died holds no mapping.
      unreachable.push_back(key);
      continue;
    }
    PostOnConn(*conn, MakeHeader(wire::MsgType::kP2pRevoke, id), nullptr);
  }
  for (const std::string& key : unreachable) {
    MORI_LOG_WARN(kIo, "engine '", key_, "': deregistering memory ", id, ": ", LogSafe(key),
                  " holds a grant of it (P2P, shared-memory map or CMA) but has no connection "
                  "left to be asked to let go of it");
  }
  std::unique_lock<std::mutex> lock(p2p_mu_);
  auto pending = [&] {
    return std::any_of(p2p_revoking_.begin(), p2p_revoking_.end(),
                       [&](const auto& r) { return r.second == id; });
  };
  const auto limit = std::chrono::milliseconds(tcp_config_.transfer_timeout_ms);
  if (!p2p_cv_.wait_for(lock, limit, [&] { return !pending(); })) {
    std::string late;
    for (auto it = p2p_revoking_.begin(); it != p2p_revoking_.end();) {
      if (it->second == id) {
        late += (late.empty() ? "'" : ", '") + it->first + "'";
        it = p2p_revoking_.erase(it);
      } else {
        ++it;
      }
    }
    MORI_THROW(TimeoutError, "deregister_memory: memory ", id, " of engine '", key_,
               "' is still held (a P2P or shared-memory mapping, or a CMA grant) by ", late,
               ", which did not confirm letting go of it within ", tcp_config_.transfer_timeout_ms,
               " ms; it stays registered");
  }
  p2p_granted_.erase(id);
}

void IoEngine::OnP2pRevokeAck(const std::string& initiator_key, uint64_t mem_id) {
  std::lock_guard<std::mutex> lock(p2p_mu_);
  auto it = std::find(p2p_revoking_.begin(), p2p_revoking_.end(),
                      std::pair<std::string, uint64_t>(initiator_key, mem_id));
  if (it == p2p_revoking_.end()) return;  // late (after a timeout) or unasked
  p2p_revoking_.erase(it);
  p2p_cv_.notify_all();
}

void IoEngine::OnP2pRevoke(const std::string& target_key, uint64_t mem_id,
                           std::weak_ptr<Conn> conn) {
  auto ack = [conn, mem_id] {
    if (std::shared_ptr<Conn> c = conn.lock()) {
      PostOnConn(*c, MakeHeader(wire::MsgType::kP2pRevokeAck, mem_id), nullptr);
    }
  };
  std::vector<std::shared_ptr<P2pMapping>> maps;  // one per local GPU that mapped it
  std::shared_ptr<ShmMapping> shm;                // shared host memory mapped here
  std::shared_ptr<CmaRemote> cma;                 // a CMA grant held here
  if (std::shared_ptr<Peer> peer = FindPeer(target_key)) {
    std::lock_guard<std::mutex> lock(peer->p2p_mu);
    for (auto it = peer->p2p_maps.begin(); it != peer->p2p_maps.end();) {
      if (it->first.first == mem_id) {
        maps.push_back(std::move(it->second));
        it = peer->p2p_maps.erase(it);
      } else {
        ++it;
      }
    }
    auto sit = peer->shm_maps.find(mem_id);
    if (sit != peer->shm_maps.end()) {
      shm = std::move(sit->second);
      peer->shm_maps.erase(sit);
    }
    peer->shm_unmapped_why.erase(mem_id);
    auto cit = peer->cma_grants.find(mem_id);
    if (cit != peer->cma_grants.end()) {
      cma = std::move(cit->second);
      peer->cma_grants.erase(cit);
    }
  }
  if (maps.empty() && !shm && !cma) {
    ack();
    return;
  }
  // Acknowledged once every mapping is gone — the last copy holding one ended and all
  // are unmapped: here if none is in flight, else on the completion thread.
  auto all_released = std::shared_ptr<void>(nullptr, [ack](void*) { ack(); });
  for (auto& m : maps) m->released = [all_released] {};
  if (shm) shm->released = [all_released] {};
  if (cma) cma->released = [all_released] {};
}

int IoEngine::ShmMappingState(const std::string& remote_key, uint64_t mem_id) {
  std::shared_ptr<Peer> peer = FindPeer(remote_key);
  if (!peer) return -1;
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  auto it = peer->shm_maps.find(mem_id);
  return it == peer->shm_maps.end() ? -1 : (it->second ? 1 : 0);
}

int IoEngine::ShmCmaGrantState(const std::string& remote_key, uint64_t mem_id) {
  std::shared_ptr<Peer> peer = FindPeer(remote_key);
  if (!peer) return 0;
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  return peer->cma_grants.count(mem_id) != 0 ? 1 : 0;
}

std::string IoEngine::ShmLiveness(const std::string& remote_key) {
  std::shared_ptr<Peer> peer = FindPeer(remote_key);
  if (!peer) return {};
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  if (!peer->liveness) return {};
  return peer->liveness->uses_word() ? "word" : "pidfd";
}

int IoEngine::P2pMappingKind(const std::string& remote_key, uint64_t mem_id) {
  std::shared_ptr<Peer> peer = FindPeer(remote_key);
  if (!peer) return -1;
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  for (const auto& [key, m] : peer->p2p_maps) {
    if (key.first == mem_id) return m->kind;
  }
  return -1;
}

bool IoEngine::UseP2p(const Peer& peer, MemoryLocationType local_loc,
                      MemoryLocationType remote_loc) const {
  return p2p_ != nullptr && peer.remote_p2p && local_loc == MemoryLocationType::GPU &&
         remote_loc == MemoryLocationType::GPU && override_ != BackendOverride::kTcp &&
         !peer.host_id.empty() && peer.host_id == host_id_;
}

bool IoEngine::SideRequest(const Peer& peer, wire::MsgType type, wire::MsgType answer_type,
                           uint64_t mem_id, const std::string& payload, std::string* answer,
                           StatusDetail* code, std::string* error, wire::WireStatus* status_out) {
  const int timeout = tcp_config_.peer_timeout_ms;
  std::string why;
  int fd = ConnectTo(peer.host, peer.port, timeout, &why);
  auto fail = [&](StatusDetail c, const std::string& text) {
    if (fd >= 0) ::close(fd);
    *code = c;
    *error = text;
    return false;
  };
  if (fd < 0) return fail(StatusDetail::ERR_PEER_LOST, why);
  std::string msg = HelloMessage(peer);
  wire::Header h = MakeHeader(type, mem_id);
  h.length = payload.size();
  msg.append(reinterpret_cast<const char*>(&h), kHdr);
  msg += payload;
  wire::Header r{};
  if (!SendAll(fd, msg.data(), msg.size(), timeout, &why) ||
      !RecvAll(fd, reinterpret_cast<char*>(&r), kHdr, timeout, &why)) {
    return fail(StatusDetail::ERR_PEER_LOST, why);
  }
  if (r.type != static_cast<uint8_t>(answer_type) || r.version != wire::kVersion ||
      r.length > kMaxP2pGrantBytes) {
    return fail(StatusDetail::ERR_TRANSPORT,
                StrCat("unexpected answer (type ", int(r.type), ", version ", r.version, ", ",
                       r.length, " bytes)"));
  }
  answer->assign(r.length, '\0');
  if (!RecvAll(fd, answer->data(), answer->size(), timeout, &why)) {
    return fail(StatusDetail::ERR_PEER_LOST, why);
  }
  auto status = static_cast<wire::WireStatus>(r.status);
  if (status_out != nullptr) *status_out = status;
  if (status != wire::WireStatus::kOk) {
    std::string text = WireStatusText(status);
    if (!answer->empty()) text += ": " + LogSafe(*answer, 512);
    return fail(WireStatusCode(status), text);
  }
  ::close(fd);
  return true;
}

std::shared_ptr<P2pMapping> IoEngine::P2pMappingFor(const std::shared_ptr<Peer>& peer,
                                                    uint64_t mem_id, int device, StatusDetail* code,
                                                    std::string* error) {
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  auto it = peer->p2p_maps.find({mem_id, device});
  if (it != peer->p2p_maps.end()) return it->second;
  const std::string what =
      StrCat("P2P: cannot map memory ", mem_id, " of remote engine ", LogSafe(peer->key), ": ");
  std::string payload;
  if (!SideRequest(*peer, wire::MsgType::kP2pOpenReq, wire::MsgType::kP2pGrant, mem_id, {},
                   &payload, code, error)) {
    *error = what + *error;
    return nullptr;
  }
  std::shared_ptr<P2pMapping> m;
  try {
    m = p2p_->Import(UnpackP2pExport(payload.data(), payload.size()), device);
  } catch (const std::exception& e) {
    *code = StatusDetail::ERR_TRANSPORT;
    *error = what + e.what();
    return nullptr;
  }
  peer->p2p_maps.emplace(std::make_pair(mem_id, device), m);
  return m;
}

void IoEngine::CreateRdmaBackend(const rdma::RdmaBackendConfig& config) {
  MORI_CHECK_ARG(rdma_ == nullptr, "engine '", key_, "' already has an RDMA backend");
  std::unique_ptr<rdma::RdmaBackend> backend = rdma::LoopbackBackendRequested()
                                                   ? rdma::CreateLoopbackBackend(config)
                                                   : rdma::RdmaBackend::Create(config);
  if (workers_.empty()) CreateTcpBackend(TcpBackendConfig{});
  // Completed inbound RDMA transfers: `parts` notifications per (peer, uid & 24 bits).
  backend->SetInboundHandler(
      [this](const std::string& peer_key, uint32_t uid24, uint32_t parts, bool) {
        InboundPart part{uid24, parts, wire::WireStatus::kOk, 0, 0, 0};
        RecordInboundParts(peer_key, &part, 1);
      });
  std::unique_lock<std::shared_mutex> lock(mem_mu_);
  for (const auto& [id, r] : memory_) rdma_keys_[id] = backend->RegisterRegion(id, r.addr, r.size);
  rdma_ = std::move(backend);
  MORI_LOG_INFO(kIo, "engine '", key_, "': RDMA backend on ", rdma_->Describe());
}

wire::WireStatus IoEngine::RdmaAccept(const std::string& initiator_key, const std::string& request,
                                      std::string* answer) {
  if (!rdma_) return wire::WireStatus::kNoRdma;
  try {
    *answer = rdma_->AcceptInitiator(initiator_key, request);
  } catch (const std::exception& e) {
    *answer = e.what();
    MORI_LOG_WARN(kIo, "engine '", key_, "': RDMA connect from ", LogSafe(initiator_key),
                  " refused: ", e.what());
    return wire::WireStatus::kExportFailed;
  }
  return wire::WireStatus::kOk;
}

wire::WireStatus IoEngine::RdmaRegionKey(uint64_t mem_id, std::string* answer) {
  if (!rdma_) return wire::WireStatus::kNoRdma;
  std::shared_lock<std::shared_mutex> lock(mem_mu_);
  auto it = rdma_keys_.find(mem_id);
  if (it == rdma_keys_.end()) return wire::WireStatus::kUnknownMemory;
  *answer = it->second;
  return wire::WireStatus::kOk;
}

bool IoEngine::UseRdma(const Peer& peer, MemoryLocationType local_loc,
                       MemoryLocationType remote_loc) const {
  if (rdma_ == nullptr || !peer.remote_rdma || override_ == BackendOverride::kTcp) return false;
  // ChooseBackend copies host ids and builds reason strings: decide once per (peer,
  // location pair, override) instead of on every submission.
  const uint32_t pair = (local_loc == MemoryLocationType::GPU ? 2u : 0u) |
                        (remote_loc == MemoryLocationType::GPU ? 1u : 0u);
  const uint32_t ov = static_cast<uint32_t>(override_) + 1;
  const uint32_t cached = peer.rdma_cache.load(std::memory_order_acquire);
  const bool same_override = (cached >> 8) == ov;
  if (same_override && (cached & (1u << pair)) != 0) return (cached & (16u << pair)) != 0;
  const bool use =
      ChooseBackend(ChoiceInput(peer, local_loc, remote_loc)).backend == BackendType::kRdma;
  const uint32_t base = same_override ? cached : ov << 8;
  peer.rdma_cache.store(base | (1u << pair) | (use ? 16u << pair : 0u), std::memory_order_release);
  return use;
}

std::shared_ptr<TransferState> IoEngine::SubmitRdma(Op op, const MemoryRegion& local,
                                                    const std::shared_ptr<Peer>& peer,
                                                    uint64_t remote_mem, const TransferSpan* spans,
                                                    size_t n, uint64_t uid) {
  rdma::RegionKey key;
  {
    std::lock_guard<std::mutex> lock(peer->rdma_mu);
    StatusDetail code = StatusDetail::SUCCESS;
    std::string error;
    if (!peer->rdma_connected) {
      std::string reply;
      try {
        std::string request = rdma_->OpenInitiator(peer->key);
        if (!SideRequest(*peer, wire::MsgType::kRdmaConnect, wire::MsgType::kRdmaConnectAck, 0,
                         request, &reply, &code, &error)) {
          return Finished(code, StrCat("RDMA: cannot connect to remote engine ", LogSafe(peer->key),
                                       ": ", error));
        }
        rdma_->CompleteInitiator(peer->key, reply);
      } catch (const std::exception& e) {
        return Finished(
            StatusDetail::ERR_TRANSPORT,
            StrCat("RDMA: cannot connect to remote engine ", LogSafe(peer->key), ": ", e.what()));
      }
      peer->rdma_connected = true;
    }
    auto it = peer->rdma_keys.find(remote_mem);
    if (it == peer->rdma_keys.end()) {
      std::string blob;
      if (!SideRequest(*peer, wire::MsgType::kRdmaRegionReq, wire::MsgType::kRdmaRegionKey,
                       remote_mem, {}, &blob, &code, &error)) {
        return Finished(code, StrCat("RDMA: no key for memory ", remote_mem, " of remote engine ",
                                     LogSafe(peer->key), ": ", error));
      }
      try {
        it = peer->rdma_keys.emplace(remote_mem, rdma::DecodeRegionKey(blob)).first;
      } catch (const std::exception& e) {
        return Finished(StatusDetail::ERR_TRANSPORT, e.what());
      }
    }
    key = it->second;
  }
  // The target's registered length (from its key) bounds the transfer, not the
  // caller's MemoryDesc; the NIC enforces it again (remote access error).
  if (auto err = RemoteBoundsError(op, spans, n, key.length, remote_mem, peer->key)) return err;
  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state = BeginTransfer(local, 1, false, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;
  static_assert(sizeof(TransferSpan) == sizeof(rdma::PlanSpan), "one span layout");
  try {
    rdma_->Submit(
        op == Op::kWrite ? rdma::RdmaOp::kWrite : rdma::RdmaOp::kRead, local.id, peer->key, key,
        reinterpret_cast<const rdma::PlanSpan*>(spans), n, uid,
        [this, rid, weak = std::weak_ptr<Peer>(peer)](StatusDetail c, const std::string& m) {
          if (c != StatusDetail::SUCCESS) {
            // A failed work request leaves its RC QP in the error state (a stale
            // key after the target deregistered, a lost link): forget the QPs
            // and keys so the next transfer reconnects instead of every later
            // transfer to this peer failing behind the one bad request.
            if (std::shared_ptr<Peer> p = weak.lock()) {
              std::lock_guard<std::mutex> lock(p->rdma_mu);
              p->rdma_connected = false;
              p->rdma_keys.clear();
            }
          }
          CompletePart(rid, c, m);
        });
  } catch (const std::exception& e) {
    CompletePart(rid, StatusDetail::ERR_INVALID_ARGS, StrCat("RDMA: ", e.what()));
  }
  return state;
}

namespace {
// Announces a completed P2P or mapped-SHM write to its target (which records the
// inbound status); dropped if the connection is gone, as the transfer itself already
// succeeded. Sent by the connection's reactor (PostOnConn), so the submitting or
// completion thread does not run a loopback TCP send per transfer.
// After a same-host write's bytes are in place: through the target's notice ring when
// it granted one and it has room, else as a message.
void NotifyP2pWrite(ShmMapping* ring, const std::shared_ptr<Conn>& conn, uint64_t uid,
                    uint64_t mem_id, uint64_t bytes) {
  if (ring != nullptr && NoticeRing::Push(ring->region, NoticeRecord{uid, mem_id, bytes})) return;
  wire::Header d = MakeHeader(wire::MsgType::kP2pWriteDone, mem_id);
  d.num_parts = 1;
  d.uid = uid;
  d.length = bytes;
  PostOnConn(*conn, d, nullptr);  // not answered
}
}  // namespace

static_assert(sizeof(TransferSpan) == sizeof(P2pSpan) &&
                  offsetof(TransferSpan, local_offset) == offsetof(P2pSpan, local_offset) &&
                  offsetof(TransferSpan, remote_offset) == offsetof(P2pSpan, remote_offset) &&
                  offsetof(TransferSpan, size) == offsetof(P2pSpan, size),
              "TransferSpan and P2pSpan share one layout");

std::shared_ptr<TransferState> IoEngine::SubmitP2p(Op op, const MemoryRegion& local,
                                                   const std::shared_ptr<Peer>& peer,
                                                   PeerConnections* pc, uint64_t remote_mem,
                                                   const TransferSpan* spans, size_t n,
                                                   uint64_t uid) {
  StatusDetail code = StatusDetail::SUCCESS;
  std::string error;
  std::shared_ptr<P2pMapping> remote =
      P2pMappingFor(peer, remote_mem, local.device_id, &code, &error);
  if (!remote) return Finished(code, std::move(error));
  // The target's registered size, not the caller's MemoryDesc, bounds the copy: a
  // forged or stale descriptor cannot reach past what the target exported.
  if (auto err = RemoteBoundsError(op, spans, n, remote->size, remote_mem, peer->key)) return err;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) bytes += spans[i].size;
  if (bytes == 0) return Finished(StatusDetail::SUCCESS, {});
  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state = BeginTransfer(local, 1, true, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;
  std::shared_ptr<Conn> conn;
  std::shared_ptr<ShmMapping> ring;
  if (op == Op::kWrite) {
    conn = pc->conns[peer->next_conn.fetch_add(1, std::memory_order_relaxed) % pc->conns.size()];
    ring = NoticeRingOf(peer);
  }
  p2p_->Submit(op == Op::kWrite, local.device_id, reinterpret_cast<char*>(local.addr),
               std::move(remote), reinterpret_cast<const P2pSpan*>(spans), n,
               [this, rid, conn, ring, uid, remote_mem, bytes](StatusDetail c, std::string m) {
                 // Announced first: once the write's status completes, a pop at the target
                 // finds it (when the ring took it; a TCP announcement follows shortly).
                 if (conn && c == StatusDetail::SUCCESS)
                   NotifyP2pWrite(ring.get(), conn, uid, remote_mem, bytes);
                 CompletePart(rid, c, m);
               });
  return state;
}

std::shared_ptr<ShmMapping> IoEngine::ShmMappingFor(const std::shared_ptr<Peer>& peer,
                                                    uint64_t mem_id, std::string* why_not) {
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  auto it = peer->shm_maps.find(mem_id);
  if (it != peer->shm_maps.end()) {
    if (!it->second && why_not != nullptr) *why_not = peer->shm_unmapped_why[mem_id];
    return it->second;
  }
  std::string answer, error;
  StatusDetail code = StatusDetail::SUCCESS;
  wire::WireStatus status = wire::WireStatus::kOk;
  if (!SideRequest(*peer, wire::MsgType::kShmMapReq, wire::MsgType::kShmMapGrant, mem_id, {},
                   &answer, &code, &error, &status)) {
    // Not shareable: CMA from now on for this region. Anything else (unknown memory,
    // an unreachable peer) is left to the CMA path to report, and asked again later.
    if (status == wire::WireStatus::kNotShareable) {
      error = "the target region is not in shared host memory (allocate_shared_host_memory)";
      peer->shm_maps.emplace(mem_id, nullptr);
      peer->shm_unmapped_why[mem_id] = error;
    }
    if (why_not != nullptr) {
      *why_not = status == wire::WireStatus::kNotShareable ? error : "no mapping granted: " + error;
    }
    return nullptr;
  }
  std::shared_ptr<ShmMapping> m;
  try {
    const ShmMapGrant g = UnpackShmMapGrant(answer);
    std::shared_ptr<const TargetLiveness> owner = LivenessOf(*peer, g.pid, g.live, &error);
    if (owner) m = MapPeerRegion(g, &error);
    if (m) m->owner = std::move(owner);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!m) {
    MORI_LOG_WARN(kIo, "engine '", key_, "': mapping memory ", mem_id, " of ", LogSafe(peer->key),
                  " failed (", error, "); CMA moves it");
    peer->shm_unmapped_why[mem_id] = "mapping the target's shared region failed: " + error;
    if (why_not != nullptr) *why_not = peer->shm_unmapped_why[mem_id];
  }
  peer->shm_maps.emplace(mem_id, m);
  return m;
}

std::shared_ptr<const TargetLiveness> IoEngine::LivenessOf(Peer& peer, int pid,
                                                           const LivenessGrant& live,
                                                           std::string* error) {
  // The pid of the process that answered is not taken on trust: our copies go to the
  // pid of the EngineDesc (same host identity, so the same pid namespace).
  if (peer.pid > 0 && pid != peer.pid) {
    *error = StrCat("the grant names pid ", pid, ", the remote EngineDesc pid ", peer.pid);
    return nullptr;
  }
  if (peer.liveness) return peer.liveness;
  std::shared_ptr<TargetLiveness> t =
      TargetLiveness::Open(pid, live, options_.liveness_word, error);
  if (!t) return nullptr;
  if (options_.liveness_word && !t->uses_word()) {
    MORI_LOG_INFO(kIo, "engine '", key_, "': ", LogSafe(peer.key),
                  " offers no liveness word; its pidfd is polled per same-host copy");
  }
  peer.liveness = std::move(t);
  return peer.liveness;
}

std::shared_ptr<CmaRemote> IoEngine::CmaRemoteFor(const std::shared_ptr<Peer>& peer,
                                                  uint64_t mem_id, StatusDetail* code,
                                                  std::string* error) {
  std::lock_guard<std::mutex> lock(peer->p2p_mu);
  auto it = peer->cma_grants.find(mem_id);
  if (it != peer->cma_grants.end()) return it->second;
  // Held across the request: a revoke of this region (OnP2pRevoke takes p2p_mu) that
  // the target sent after granting is handled only once the grant is cached here.
  const std::string what = StrCat("SHM: no CMA grant for memory ", mem_id, " of remote engine ",
                                  LogSafe(peer->key), ": ");
  std::string answer;
  if (!SideRequest(*peer, wire::MsgType::kShmCmaReq, wire::MsgType::kShmCmaGrant, mem_id, {},
                   &answer, code, error)) {
    *error = what + *error;
    return nullptr;
  }
  auto r = std::make_shared<CmaRemote>();
  try {
    const CmaGrant g = UnpackCmaGrant(answer);
    r->owner = LivenessOf(*peer, g.pid, g.live, error);
    r->pid = g.pid;
    r->addr = g.addr;
    r->size = g.size;
  } catch (const std::exception& e) {
    *error = e.what();
  }
  if (!r->owner) {
    *code = StatusDetail::ERR_TRANSPORT;
    *error = what + *error;
    return nullptr;
  }
  peer->cma_grants.emplace(mem_id, r);
  return r;
}

static_assert(sizeof(TransferSpan) == sizeof(CmaSpan) &&
                  offsetof(TransferSpan, local_offset) == offsetof(CmaSpan, local_offset) &&
                  offsetof(TransferSpan, remote_offset) == offsetof(CmaSpan, remote_offset) &&
                  offsetof(TransferSpan, size) == offsetof(CmaSpan, size),
              "TransferSpan and CmaSpan share one layout");

namespace {
// A CMA transfer of at least this many bytes is copied by two threads, the submitting
// one and a reactor, half each: from about 8 MiB the copy leaves the caches and one
// thread's process_vm_writev is bound by what it alone can pull from memory.
constexpr uint64_t kCmaSplitBytes = 8 << 20;

// Splits `spans` into two shares of about half the bytes each (a span may be cut).
void SplitCmaSpans(const TransferSpan* spans, size_t n, uint64_t bytes, std::vector<CmaSpan>* a,
                   std::vector<CmaSpan>* b) {
  uint64_t left = bytes / 2;
  for (size_t i = 0; i < n; ++i) {
    CmaSpan s{spans[i].local_offset, spans[i].remote_offset, spans[i].size};
    if (left >= s.size) {
      a->push_back(s);
      left -= s.size;
      continue;
    }
    if (left > 0) {
      a->push_back({s.local_offset, s.remote_offset, left});
      s = {s.local_offset + left, s.remote_offset + left, s.size - left};
      left = 0;
    }
    b->push_back(s);
  }
}
}  // namespace

// One CMA transfer in flight: its shares (one, or two for large transfers) each copy
// and complete one part of its ledger record; the last to finish checks the target's
// liveness and announces the write before its part completes the record.
struct IoEngine::CmaJob {
  std::shared_ptr<CmaRemote> remote;  // reset by the last share: a revoke may then be acked
  std::shared_ptr<Peer> peer;
  std::shared_ptr<ShmMapping> ring;
  std::shared_ptr<Conn> conn;  // for the announcement when the ring has no room
  char* local_base = nullptr;
  uint64_t rid = 0;
  uint64_t uid = 0;
  uint64_t remote_mem = 0;
  uint64_t bytes = 0;
  bool write = false;
  std::atomic<uint32_t> shares_left{1};
  std::atomic<bool> failed{false};
};

std::string IoEngine::CmaLost(CmaJob& job) {
  const std::string why =
      StrCat("remote engine ", LogSafe(job.peer->key), " (pid ", job.remote->pid,
             ") exited or was closed; its memory ", job.remote_mem, " is gone");
  job.peer->MarkFailed(why);
  return StrCat(job.write ? "write" : "read", " failed: ", why, "; register it again to retry");
}

void IoEngine::CopyCmaShare(CmaJob& job, const CmaSpan* spans, size_t n) {
  int err;
  {
    MORI_SCOPED_TIMER(kIo, "io.shm.cma_copy");
    err = CmaCopySpans(job.remote->pid, job.write, job.local_base, job.remote->addr, spans, n);
  }
  StatusDetail code = StatusDetail::SUCCESS;
  std::string error;
  if (err == ESRCH) {
    code = StatusDetail::ERR_PEER_LOST;
    error = CmaLost(job);
  } else if (err != 0) {
    code = StatusDetail::ERR_TRANSPORT;
    error =
        StrCat(job.write ? "process_vm_writev" : "process_vm_readv", " of ", n,
               " span(s) with pid ", job.remote->pid, " (remote engine ", LogSafe(job.peer->key),
               ", memory ", job.remote_mem, ") failed: ", ErrnoText(err));
    if (err == EPERM) {
      // Allowed at connect, refused now: later transfers of this pair go over TCP.
      job.peer->shm_refused.store(true, std::memory_order_release);
      MORI_LOG_WARN(kIo, "engine '", key_, "': ", error, "; transfers to it fall back to TCP");
    }
  }
  if (code != StatusDetail::SUCCESS) job.failed.store(true, std::memory_order_release);
  // The other share's copy happens before this decrement's acquire, so the last share's
  // liveness check below comes after every byte of the transfer was in place.
  if (job.shares_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (!job.failed.load(std::memory_order_acquire)) {
      // As for mapped copies: success only if the target still ran after the bytes were
      // in place (written) or taken (read).
      if (MORI_UNLIKELY(!job.remote->owner->Alive())) {
        code = StatusDetail::ERR_PEER_LOST;
        error = CmaLost(job);
      } else if (job.write) {  // announced before the status completes, as for mapped writes
        job.remote.reset();
        NotifyP2pWrite(job.ring.get(), job.conn, job.uid, job.remote_mem, job.bytes);
      }
    }
    job.remote.reset();  // a revoke waiting for this copy may be acknowledged now
  }
  CompletePart(job.rid, code, error);
}

std::shared_ptr<TransferState> IoEngine::SubmitShmCma(Op op, const MemoryRegion& local,
                                                      const std::shared_ptr<Peer>& peer,
                                                      PeerConnections* pc, uint64_t remote_mem,
                                                      std::shared_ptr<CmaRemote> remote,
                                                      const TransferSpan* spans, size_t n,
                                                      uint64_t uid) {
  MORI_SCOPED_TIMER(kIo, "io.shm.cma_direct");
  // The grant's size is the target's registered size: the whole transfer is checked
  // against it before any byte moves.
  if (auto err = RemoteBoundsError(op, spans, n, remote->size, remote_mem, peer->key)) return err;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) bytes += spans[i].size;
  const bool split = bytes >= kCmaSplitBytes;
  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state = BeginTransfer(local, split ? 2 : 1, false, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;
  CmaJob stack_job;
  std::shared_ptr<CmaJob> shared_job = split ? std::make_shared<CmaJob>() : nullptr;
  CmaJob& job = split ? *shared_job : stack_job;
  job.write = op == Op::kWrite;
  job.peer = peer;
  job.rid = rid;
  job.uid = uid;
  job.remote_mem = remote_mem;
  job.bytes = bytes;
  job.local_base = reinterpret_cast<char*>(local.addr);
  if (job.write) {
    job.ring = NoticeRingOf(peer);
    job.conn =
        pc->conns[peer->next_conn.fetch_add(1, std::memory_order_relaxed) % pc->conns.size()];
  }
  job.remote = std::move(remote);
  // The grant names a pid, and a pid is reused once its process is gone: copy only while
  // the target's engine is known to run (one load), so a cached grant never reaches a
  // later process that got the same pid. (What remains is the time from this load to the
  // syscall: the pid would have to be freed and handed to a new process within it, as
  // between a per-transfer grant's arrival and its copy before.)
  if (MORI_UNLIKELY(!job.remote->owner->Alive())) {
    const std::string error = CmaLost(job);
    for (uint32_t p = split ? 2 : 1; p > 0; --p)
      CompletePart(rid, StatusDetail::ERR_PEER_LOST, error);
    return state;
  }
  if (!split) {
    CopyCmaShare(job, reinterpret_cast<const CmaSpan*>(spans), n);
    return state;
  }
  auto first = std::make_shared<std::vector<CmaSpan>>();
  std::vector<CmaSpan> second;
  SplitCmaSpans(spans, n, bytes, first.get(), &second);
  job.shares_left.store(2, std::memory_order_relaxed);
  workers_[next_worker_.fetch_add(1, std::memory_order_relaxed) % workers_.size()]->Post(
      [this, shared_job, first] { CopyCmaShare(*shared_job, first->data(), first->size()); });
  CopyCmaShare(job, second.data(), second.size());
  return state;
}

std::shared_ptr<TransferState> IoEngine::SubmitShmMapped(Op op, const MemoryRegion& local,
                                                         const std::shared_ptr<Peer>& peer,
                                                         PeerConnections* pc, uint64_t remote_mem,
                                                         std::shared_ptr<ShmMapping> remote,
                                                         const TransferSpan* spans, size_t n,
                                                         uint64_t uid) {
  MORI_SCOPED_TIMER(kIo, "io.shm.memcpy");
  if (auto err = RemoteBoundsError(op, spans, n, remote->size, remote_mem, peer->key)) return err;
  std::shared_ptr<ShmMapping> ring = op == Op::kWrite ? NoticeRingOf(peer) : nullptr;
  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state = BeginTransfer(local, 1, false, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;
  // One copy, on this thread, into or out of the target's pages mapped here; the
  // mapping (held by `remote`) cannot be unmapped by a revoke meanwhile.
  char* l = reinterpret_cast<char*>(local.addr);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const TransferSpan& s = spans[i];
    if (op == Op::kWrite) {
      std::memcpy(remote->region + s.remote_offset, l + s.local_offset, s.size);
    } else {
      std::memcpy(l + s.local_offset, remote->region + s.remote_offset, s.size);
    }
    bytes += s.size;
  }
  // The copy "succeeds" even into a dead target (our mapping keeps its pages), and its
  // TCP connections report the death only later: a copy that ends after the target
  // exited fails, and so does every later transfer. Alive() orders the copy before its
  // load of the target's liveness word (no syscall), so success means the bytes were in
  // place while the target's engine still ran; a target that dies after that check is
  // one that died after receiving the write (as after a TCP write's acknowledgement).
  if (MORI_UNLIKELY(!remote->owner->Alive())) {
    const std::string why =
        StrCat("remote engine ", LogSafe(peer->key), " (pid ", remote->owner->pid(),
               ") exited or was closed; its memory ", remote_mem, " is gone");
    peer->MarkFailed(why);
    remote.reset();
    CompletePart(rid, StatusDetail::ERR_PEER_LOST,
                 StrCat(op == Op::kWrite ? "write" : "read", " failed: ", why,
                        "; register it again to retry"));
    return state;
  }
  remote.reset();
  if (op == Op::kWrite) {  // announced before the status completes, as for P2P
    NotifyP2pWrite(
        ring.get(),
        pc->conns[peer->next_conn.fetch_add(1, std::memory_order_relaxed) % pc->conns.size()], uid,
        remote_mem, bytes);
  }
  CompletePart(rid, StatusDetail::SUCCESS, {});
  return state;
}

std::shared_ptr<Session> IoEngine::CreateSession(uint64_t local_mem, const std::string& remote_key,
                                                 uint64_t remote_mem, uint64_t remote_size,
                                                 MemoryLocationType remote_loc) {
  MemoryRegion local = LocalRegion(local_mem);
  if (!FindPeer(remote_key)) {
    MORI_THROW(NotFoundError, "create_session: remote engine '", remote_key,
               "' is not registered with engine '", key_, "'");
  }
  return std::make_shared<Session>(this, local, remote_key, remote_mem, remote_size, remote_loc);
}

Session::Session(IoEngine* engine, MemoryRegion local, std::string remote_key, uint64_t remote_mem,
                 uint64_t remote_size, MemoryLocationType remote_loc)
    : engine_(engine),
      local_(local),
      remote_key_(std::move(remote_key)),
      remote_mem_(remote_mem),
      remote_size_(remote_size),
      remote_loc_(remote_loc) {}

BackendChoice Session::Backend() {
  return engine_->BackendFor(local_.loc, remote_key_, remote_mem_, remote_loc_);
}

std::shared_ptr<Peer> Session::CurrentPeer() {
  if (!engine_->options().epoch_snapshot) return engine_->FindPeer(remote_key_);
  // The engine's peer table changes rarely; the cached peer is reused until its epoch
  // moves, so the hot path takes no engine-wide lock.
  uint64_t epoch = engine_->peer_epoch();
  if (epoch != epoch_) {
    std::lock_guard<std::mutex> lock(mu_);
    peer_ = engine_->FindPeer(remote_key_);
    epoch_ = epoch;
  }
  return peer_;
}

std::shared_ptr<TransferState> Session::Transfer(Op op, const TransferSpan* spans, size_t n,
                                                 uint64_t uid) {
  return engine_->Submit(op, local_, CurrentPeer(), remote_key_, remote_mem_, remote_size_,
                         remote_loc_, spans, n, uid);
}

bool Session::Alive() {
  std::shared_ptr<Peer> peer = CurrentPeer();
  return peer != nullptr && !peer->failed.load(std::memory_order_acquire);
}

}  // namespace mori::io
