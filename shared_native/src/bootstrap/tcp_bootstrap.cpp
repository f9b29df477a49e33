// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mori/bootstrap/bootstrap.hpp"
#include "mori/core/env.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/timeout.hpp"

namespace mori::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x4d4f5242;  // "MORB"
constexpr uint32_t kFrameMagic = 0x4d4f5246;  // "MORF"

// kAbort: rank 0 found a mismatch and tells the others why (the frame's nbytes
// is the length of the message that follows) instead of leaving them waiting.
enum class Op : uint32_t { kAllGather = 1, kBroadcast = 2, kBarrier = 3, kAbort = 4 };
constexpr uint64_t kMaxAbortMessage = 4096;

const char* OpName(uint32_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllGather:
      return "AllGather";
    case Op::kBroadcast:
      return "Broadcast";
    case Op::kBarrier:
      return "Barrier";
    case Op::kAbort:
      return "Abort";
  }
  return "unknown";
}

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t world_size;
};

// Every collective message starts with a frame: a rank that calls a different
// collective, or the same one with another size, is reported instead of
// misreading bytes.
struct Frame {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;
  uint64_t nbytes;
  int32_t root;
  int32_t sender;
};

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string Errno(int err) { return StrCat(std::strerror(err), " (errno ", err, ")"); }

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

void SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    MORI_THROW(TransportError, "bootstrap: fcntl(O_NONBLOCK) failed: ", Errno(errno));
  }
}

void SetNoDelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits for `events` on fd until the deadline; throws TimeoutError naming `what`.
void WaitFd(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = RemainingMs(deadline);
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return;
    if (rc == 0) MORI_THROW(TimeoutError, "bootstrap: timed out ", what);
    if (errno != EINTR)
      MORI_THROW(TransportError, "bootstrap: poll failed ", what, ": ", Errno(errno));
  }
}

void SendAll(int fd, const void* data, size_t n, Clock::time_point deadline,
             const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t rc = ::send(fd, p, n, MSG_NOSIGNAL);
    if (rc > 0) {
      p += rc;
      n -= static_cast<size_t>(rc);
      continue;
    }
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WaitFd(fd, POLLOUT, deadline, "sending to " + peer);
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    MORI_THROW(TransportError, "bootstrap: send to ", peer, " failed: ", Errno(errno),
               " (did that process exit?)");
  }
}

void RecvAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t rc = ::recv(fd, p, n, 0);
    if (rc > 0) {
      p += rc;
      n -= static_cast<size_t>(rc);
      continue;
    }
    if (rc == 0) {
      MORI_THROW(TransportError, "bootstrap: ", peer,
                 " closed the connection (did that process exit or fail?)");
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      WaitFd(fd, POLLIN, deadline, "waiting for " + peer);
      continue;
    }
    if (errno == EINTR) continue;
    MORI_THROW(TransportError, "bootstrap: recv from ", peer, " failed: ", Errno(errno));
  }
}

addrinfo* Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  const char* node = (passive && (host.empty() || host == "0.0.0.0")) ? nullptr : host.c_str();
  int rc = ::getaddrinfo(node, port_str.c_str(), &hints, &res);
  if (rc != 0) {
    MORI_THROW(InvalidArgumentError, "bootstrap: cannot resolve host '", host, "' port ", port,
               ": ", gai_strerror(rc));
  }
  return res;
}

int EnvInt(const char* name, bool required, int fallback) {
  const auto v = env::Get(name);
  if (!v) {
    if (required) {
      MORI_THROW(InvalidArgumentError, "bootstrap: environment variable ", name,
                 " is not set (expected torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
    }
    return fallback;
  }
  return static_cast<int>(env::ParseInt(name, *v, 0, int64_t{1} << 30));
}

}  // namespace

struct TcpBootstrap::Impl {
  TcpBootstrapOptions opts;
  Fd listen_fd;
  int port = 0;
  std::vector<Fd> peers;  // rank 0: one per rank (peers[0] unused); others: peers[0] = root
  bool connected = false;
  uint64_t seq = 0;
  // After a failed collective the byte streams are at unknown positions, so every
  // later call fails fast with the original cause instead of misreading frames.
  std::string broken;

  template <typename Fn>
  void Guarded(Fn&& fn) {
    if (!broken.empty()) {
      MORI_THROW(InvalidStateError, "bootstrap: rank ", opts.rank,
                 " is unusable after an earlier failure: ", broken);
    }
    try {
      fn();
    } catch (const std::exception& e) {
      broken = e.what();
      throw;
    }
  }

  std::string PeerName(int r) const { return StrCat("rank ", r, " (", opts.host, ":", port, ")"); }
  Clock::time_point Deadline() const { return Clock::now() + opts.timeout; }

  void Listen() {
    addrinfo* res = Resolve(opts.host, opts.port, /*passive=*/true);
    std::string last_error = "no address";
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (fd.get() < 0) {
        last_error = Errno(errno);
        continue;
      }
      int one = 1;
      (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
          ::listen(fd.get(), std::max(16, opts.world_size)) != 0) {
        last_error = Errno(errno);
        continue;
      }
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
      port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
      SetNonBlocking(fd.get());
      listen_fd = std::move(fd);
      ::freeaddrinfo(res);
      MORI_LOG_DEBUG(kCore, "bootstrap: rank 0 listening on ", opts.host, ":", port);
      return;
    }
    ::freeaddrinfo(res);
    MORI_THROW(TransportError, "bootstrap: rank 0 cannot listen on ", opts.host, ":", opts.port,
               ": ", last_error);
  }

  void AcceptAll() {
    auto deadline = Deadline();
    int missing = opts.world_size - 1;
    while (missing > 0) {
      WaitFd(listen_fd.get(), POLLIN, deadline,
             StrCat("waiting for ", missing, " of ", opts.world_size - 1, " ranks to connect to ",
                    opts.host, ":", port));
      Fd fd(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd.get() < 0) {
        if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
        MORI_THROW(TransportError, "bootstrap: accept failed: ", Errno(errno));
      }
      SetNoDelay(fd.get());
      Hello hello{};
      RecvAll(fd.get(), &hello, sizeof(hello), deadline, "a connecting rank");
      if (hello.magic != kHelloMagic) {
        MORI_LOG_WARN(kCore, "bootstrap: dropping a connection that is not a mori bootstrap peer");
        continue;
      }
      if (hello.world_size != opts.world_size) {
        MORI_THROW(InvalidArgumentError, "bootstrap: rank ", hello.rank,
                   " was started with world_size ", hello.world_size, " but rank 0 has world_size ",
                   opts.world_size);
      }
      if (hello.rank <= 0 || hello.rank >= opts.world_size) {
        MORI_THROW(InvalidArgumentError, "bootstrap: a peer announced rank ", hello.rank,
                   ", outside [1, ", opts.world_size, ")");
      }
      if (peers[hello.rank].get() >= 0) {
        MORI_THROW(InvalidArgumentError, "bootstrap: two processes announced rank ", hello.rank);
      }
      peers[hello.rank] = std::move(fd);
      --missing;
    }
    listen_fd.Reset();
  }

  void Connect() {
    auto deadline = Deadline();
    std::string last_error;
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
      addrinfo* res = Resolve(opts.host, opts.port, /*passive=*/false);
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (fd.get() < 0) {
          last_error = Errno(errno);
          continue;
        }
        if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
          last_error = Errno(errno);
          continue;
        }
        SetNoDelay(fd.get());
        SetNonBlocking(fd.get());
        ::freeaddrinfo(res);
        Hello hello{kHelloMagic, opts.rank, opts.world_size};
        SendAll(fd.get(), &hello, sizeof(hello), deadline, PeerName(0));
        peers[0] = std::move(fd);
        return;
      }
      ::freeaddrinfo(res);
      if (Clock::now() + backoff >= deadline) {
        MORI_THROW(TimeoutError, "bootstrap: rank ", opts.rank, " could not connect to rank 0 at ",
                   opts.host, ":", opts.port, " within ", opts.timeout.count(),
                   " ms; last error: ", last_error);
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
  }

  void EnsureConnected() {
    if (connected) return;
    if (opts.rank == 0) AcceptAll();
    connected = true;
  }

  void CheckFrame(const Frame& got, const Frame& want, int from) const {
    if (got.magic != kFrameMagic) {
      MORI_THROW(TransportError, "bootstrap: corrupt frame from rank ", from);
    }
    if (got.op != want.op || got.seq != want.seq || got.nbytes != want.nbytes ||
        got.root != want.root) {
      MORI_THROW(InvalidStateError, "bootstrap: collective mismatch: rank ", opts.rank, " is in ",
                 OpName(want.op), " #", want.seq, " (", want.nbytes, " bytes, root ", want.root,
                 ") but rank ", from, " is in ", OpName(got.op), " #", got.seq, " (", got.nbytes,
                 " bytes, root ", got.root, ")");
    }
  }

  // Non-root side of one exchange with rank 0: optionally send, then receive.
  void ToRoot(const Frame& f, const void* send, size_t send_n) {
    auto deadline = Deadline();
    SendAll(peers[0].get(), &f, sizeof(f), deadline, PeerName(0));
    if (send_n) SendAll(peers[0].get(), send, send_n, deadline, PeerName(0));
  }

  void FromRoot(const Frame& want, void* recv, size_t recv_n) {
    auto deadline = Deadline();
    Frame got{};
    RecvAll(peers[0].get(), &got, sizeof(got), deadline, PeerName(0));
    if (got.magic == kFrameMagic && got.op == static_cast<uint32_t>(Op::kAbort) &&
        got.nbytes <= kMaxAbortMessage) {
      std::string why(got.nbytes, '\0');
      RecvAll(peers[0].get(), why.data(), why.size(), deadline, PeerName(0));
      MORI_THROW(InvalidStateError, "bootstrap: rank ", opts.rank, " in ", OpName(want.op), " #",
                 want.seq, " was stopped by rank 0: ", why);
    }
    CheckFrame(got, want, 0);
    if (recv_n) RecvAll(peers[0].get(), recv, recv_n, deadline, PeerName(0));
  }

  void RootRecv(int r, const Frame& want, void* recv, size_t n, Clock::time_point deadline) {
    Frame got{};
    RecvAll(peers[r].get(), &got, sizeof(got), deadline, PeerName(r));
    try {
      CheckFrame(got, want, r);
    } catch (const InvalidStateError& e) {
      AbortPeers(want, e.what());
      throw;
    }
    if (n) RecvAll(peers[r].get(), recv, n, deadline, PeerName(r));
  }

  // Best effort, briefly bounded: a peer that is gone or stuck sending does not
  // delay the error on rank 0.
  void AbortPeers(const Frame& at, const std::string& why) {
    const std::string msg = why.substr(0, kMaxAbortMessage);
    const Frame f{kFrameMagic, static_cast<uint32_t>(Op::kAbort), at.seq, msg.size(), 0, 0};
    const auto deadline =
        Clock::now() + std::min<Clock::duration>(opts.timeout, std::chrono::seconds(1));
    for (int r = 1; r < opts.world_size; ++r) {
      try {
        RootSend(r, f, msg.data(), msg.size(), deadline);
      } catch (const std::exception&) {
      }
    }
  }

  void RootSend(int r, const Frame& f, const void* data, size_t n, Clock::time_point deadline) {
    SendAll(peers[r].get(), &f, sizeof(f), deadline, PeerName(r));
    if (n) SendAll(peers[r].get(), data, n, deadline, PeerName(r));
  }

  Frame MakeFrame(Op op, uint64_t nbytes, int root) {
    return Frame{kFrameMagic, static_cast<uint32_t>(op), seq++, nbytes, root, opts.rank};
  }

  void AllGather(Op op, const void* send, size_t nbytes, void* recv) {
    EnsureConnected();
    char* out = static_cast<char*>(recv);
    if (nbytes) std::memmove(out + static_cast<size_t>(opts.rank) * nbytes, send, nbytes);
    if (opts.world_size == 1) return;
    Frame f = MakeFrame(op, nbytes, 0);
    const size_t total = nbytes * static_cast<size_t>(opts.world_size);
    if (opts.rank == 0) {
      auto deadline = Deadline();
      for (int r = 1; r < opts.world_size; ++r) {
        RootRecv(r, f, out + static_cast<size_t>(r) * nbytes, nbytes, deadline);
      }
      for (int r = 1; r < opts.world_size; ++r) RootSend(r, f, out, total, deadline);
    } else {
      ToRoot(f, send, nbytes);
      FromRoot(f, out, total);
    }
  }

  void Broadcast(void* buf, size_t nbytes, int root) {
    EnsureConnected();
    if (opts.world_size == 1) return;
    Frame f = MakeFrame(Op::kBroadcast, nbytes, root);
    if (opts.rank == 0) {
      auto deadline = Deadline();
      if (root != 0) RootRecv(root, f, buf, nbytes, deadline);
      for (int r = 1; r < opts.world_size; ++r) {
        if (r != root) RootSend(r, f, buf, nbytes, deadline);
      }
    } else if (opts.rank == root) {
      ToRoot(f, buf, nbytes);
    } else {
      FromRoot(f, buf, nbytes);
    }
  }
};

TcpBootstrap::TcpBootstrap(const TcpBootstrapOptions& options) : impl_(std::make_unique<Impl>()) {
  MORI_CHECK_ARG(options.world_size >= 1, "bootstrap: world_size ", options.world_size,
                 " must be >= 1");
  MORI_CHECK_ARG(options.rank >= 0 && options.rank < options.world_size, "bootstrap: rank ",
                 options.rank, " out of range [0, ", options.world_size, ")");
  MORI_CHECK_ARG(options.port >= 0 && options.port <= 65535, "bootstrap: port ", options.port,
                 " out of range [0, 65535]");
  MORI_CHECK_ARG(options.rank == 0 || options.port != 0, "bootstrap: rank ", options.rank,
                 " needs rank 0's port (got 0)");
  impl_->opts = options;
  impl_->opts.timeout = CheckedTimeout(options.timeout, "bootstrap: timeout");
  impl_->port = options.port;
  impl_->peers.resize(options.rank == 0 ? options.world_size : 1);
  if (options.world_size == 1) {
    impl_->connected = true;
  } else if (options.rank == 0) {
    impl_->Listen();
  } else {
    impl_->Connect();
    impl_->connected = true;
  }
}

TcpBootstrap::~TcpBootstrap() = default;

TcpBootstrapOptions TcpBootstrap::OptionsFromEnv() {
  TcpBootstrapOptions o;
  o.rank = EnvInt("RANK", true, 0);
  o.world_size = EnvInt("WORLD_SIZE", true, 1);
  const auto addr = env::Get("MASTER_ADDR");
  if (!addr) {
    MORI_THROW(InvalidArgumentError, "bootstrap: environment variable MASTER_ADDR is not set");
  }
  o.host = *addr;
  int master_port = EnvInt("MASTER_PORT", true, 0);
  o.port = EnvInt("MORI_BOOTSTRAP_PORT", false, master_port + 1);
  int timeout_s = EnvInt("MORI_BOOTSTRAP_TIMEOUT_S", false, 120);
  o.timeout = std::chrono::seconds(timeout_s);
  return o;
}

int TcpBootstrap::Rank() const { return impl_->opts.rank; }
int TcpBootstrap::WorldSize() const { return impl_->opts.world_size; }
int TcpBootstrap::Port() const { return impl_->port; }

void TcpBootstrap::AllGather(const void* send, size_t nbytes, void* recv) {
  impl_->Guarded([&] { impl_->AllGather(Op::kAllGather, send, nbytes, recv); });
}

void TcpBootstrap::Broadcast(void* buf, size_t nbytes, int root) {
  MORI_CHECK_ARG(root >= 0 && root < impl_->opts.world_size, "bootstrap: broadcast root ", root,
                 " out of range [0, ", impl_->opts.world_size, ")");
  impl_->Guarded([&] { impl_->Broadcast(buf, nbytes, root); });
}

void TcpBootstrap::Barrier() {
  uint8_t token = 1;
  std::vector<uint8_t> all(static_cast<size_t>(impl_->opts.world_size));
  impl_->Guarded([&] { impl_->AllGather(Op::kBarrier, &token, 1, all.data()); });
}

}  // namespace mori::bootstrap
