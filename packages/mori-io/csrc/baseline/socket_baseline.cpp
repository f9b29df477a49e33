// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "baseline/socket_baseline.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mori/core/error.hpp"

namespace mori::io {
namespace {

constexpr int kStallTimeoutS = 10;

double ThreadCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void Configure(int fd, int sock_buf_bytes) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{kStallTimeoutS, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (sock_buf_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sock_buf_bytes, sizeof(sock_buf_bytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sock_buf_bytes, sizeof(sock_buf_bytes));
  }
}

// Empty string on success, else what failed.
std::string SendFull(int fd, const char* p, size_t len) {
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return StrCat("send: ", n == 0 ? "no progress" : std::strerror(errno));
    }
  }
  return {};
}

std::string RecvFull(int fd, char* p, size_t len) {
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return StrCat("recv: ", n == 0 ? "connection closed" : std::strerror(errno));
    }
  }
  return {};
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

SocketStreamResult RawSocketStream(uint64_t msg_size, uint64_t count, bool ack_each,
                                   int sock_buf_bytes) {
  MORI_CHECK_ARG(msg_size > 0 && count > 0, "raw_socket_stream: msg_size ", msg_size, " and count ",
                 count, " must be positive");
  Fd listener;
  listener.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(addr);
  if (listener.fd < 0 || ::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0 ||
      ::listen(listener.fd, 1) != 0 ||
      ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) {
    MORI_THROW(TransportError,
               "raw_socket_stream: cannot listen on loopback: ", std::strerror(errno));
  }

  // Both buffers are touched before the clock starts, so page faults are not timed.
  std::vector<char> src(msg_size, 1), dst(msg_size, 0);
  Fd sender;
  sender.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  Configure(sender.fd, sock_buf_bytes);
  if (::connect(sender.fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0) {
    MORI_THROW(TransportError, "raw_socket_stream: connect: ", std::strerror(errno));
  }
  Fd receiver;
  receiver.fd = ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (receiver.fd < 0) {
    MORI_THROW(TransportError, "raw_socket_stream: accept: ", std::strerror(errno));
  }
  Configure(receiver.fd, sock_buf_bytes);

  SocketStreamResult result;
  std::string send_error;
  std::atomic<bool> go{false};
  std::thread tx([&] {
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    double cpu0 = ThreadCpuSeconds();
    char ack;
    for (uint64_t i = 0; i < count && send_error.empty(); ++i) {
      send_error = SendFull(sender.fd, src.data(), msg_size);
      if (ack_each && send_error.empty()) send_error = RecvFull(sender.fd, &ack, 1);
    }
    result.sender_cpu_s = ThreadCpuSeconds() - cpu0;
    if (!send_error.empty()) ::shutdown(sender.fd, SHUT_RDWR);
  });

  std::string recv_error;
  double cpu0 = ThreadCpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  const char ack = 1;
  for (uint64_t i = 0; i < count && recv_error.empty(); ++i) {
    recv_error = RecvFull(receiver.fd, dst.data(), msg_size);
    if (ack_each && recv_error.empty()) recv_error = SendFull(receiver.fd, &ack, 1);
  }
  auto t1 = std::chrono::steady_clock::now();
  result.receiver_cpu_s = ThreadCpuSeconds() - cpu0;
  if (!recv_error.empty()) ::shutdown(receiver.fd, SHUT_RDWR);
  tx.join();
  if (!send_error.empty() || !recv_error.empty()) {
    MORI_THROW(TransportError, "raw_socket_stream of ", count, " x ", msg_size,
               " bytes failed: ", send_error, send_error.empty() ? "" : "; ", recv_error);
  }
  result.seconds = std::chrono::duration<double>(t1 - t0).count();
  result.bytes = msg_size * count;
  return result;
}

}  // namespace mori::io
