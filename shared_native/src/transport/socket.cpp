// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/socket.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mori/core/error.hpp"
#include "mori/core/str.hpp"

namespace mori::transport {

std::string ErrnoText(int err) { return StrCat(std::strerror(err), " (errno ", err, ")"); }

void SetSocketOptions(int fd, const SocketOptions& cfg) {
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

int ListenOn(const std::string& host, uint16_t port, const std::string& owner,
             uint16_t* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0)
    MORI_THROW(InvalidArgumentError, "cannot resolve host '", host, "': ", ::gai_strerror(rc));
  std::string error;
  int listen_fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      listen_fd = fd;
      break;
    }
    error = ErrnoText(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd < 0) {
    MORI_THROW(TransportError, owner, " cannot listen on ", host, ":", port, ": ", error);
  }
  return listen_fd;
}

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
      *error = StrCat("no progress sending within ", timeout_ms, " ms");
      return false;
    }
    *error = StrCat("send failed: ", ErrnoText(errno));
    return false;
  }
  return true;
}

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

}  // namespace mori::transport
