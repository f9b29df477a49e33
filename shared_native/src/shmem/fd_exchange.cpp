// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "heap_backend.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"

namespace mori::shmem::internal {
namespace {

using Clock = std::chrono::steady_clock;

std::string Errno() { return StrCat(std::strerror(errno), " (errno ", errno, ")"); }

// Abstract-namespace address: no file to clean up, gone when the socket closes.
// Named by global pe, so groups that only pretend to be on different nodes
// (MORI_SHMEM_NODE_ID) cannot collide.
sockaddr_un AddressOf(const LocalGroup& g, int local_index, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string name = StrCat("mori-shmem-", g.group_id, "-", g.local_pes[local_index]);
  MORI_CHECK(name.size() + 1 < sizeof(addr.sun_path), "socket name too long: ", name);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

void WaitFor(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (rc > 0) return;
    if (rc == 0) MORI_THROW(TimeoutError, "shmem fd exchange: timed out ", what);
    if (errno != EINTR) MORI_THROW(TransportError, "shmem fd exchange: poll ", what, ": ", Errno());
  }
}

// One message: a 4-byte local index, and the descriptor (when present) as
// SCM_RIGHTS ancillary data.
void SendFd(int sock, int my_index, int fd) {
  int32_t payload = my_index;
  iovec iov{&payload, sizeof(payload)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(payload))) {
    MORI_THROW(TransportError, "shmem fd exchange: sendmsg failed: ", Errno());
  }
}

int RecvFd(int sock, int expected_index, Clock::time_point deadline) {
  WaitFor(sock, POLLIN, deadline,
          StrCat("waiting for local pe ", expected_index, "'s descriptor").c_str());
  int32_t payload = -1;
  iovec iov{&payload, sizeof(payload)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n != static_cast<ssize_t>(sizeof(payload))) {
    MORI_THROW(TransportError, "shmem fd exchange: local pe ", expected_index,
               " sent no descriptor message (", n < 0 ? Errno() : "connection closed", ")");
  }
  MORI_CHECK(payload == expected_index, "got local pe ", payload, " instead of ", expected_index);
  int fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    }
  }
  return fd;
}

}  // namespace

std::vector<int> ExchangeFds(bootstrap::Bootstrap& b, const LocalGroup& g, int my_fd,
                             std::chrono::milliseconds timeout) {
  const int n = static_cast<int>(g.local_pes.size());
  const int me = g.my_local_index;
  std::vector<int> out(n, -1);
  if (my_fd >= 0) {
    out[me] = ::fcntl(my_fd, F_DUPFD_CLOEXEC, 0);
    if (out[me] < 0) MORI_THROW(TransportError, "shmem fd exchange: dup failed: ", Errno());
  }
  if (n == 1) {
    b.Barrier();
    return out;
  }
  const auto deadline = Clock::now() + timeout;

  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) MORI_THROW(TransportError, "shmem fd exchange: socket: ", Errno());
  socklen_t len;
  sockaddr_un addr = AddressOf(g, me, &len);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listener, n) != 0) {
    std::string why = Errno();
    ::close(listener);
    MORI_THROW(TransportError,
               "shmem fd exchange: cannot listen on an abstract Unix socket: ", why);
  }
  // Every pe listens before anyone connects.
  b.Barrier();

  std::exception_ptr server_error;
  std::thread server([&] {
    try {
      for (int served = 0; served < n - 1; ++served) {
        WaitFor(listener, POLLIN, deadline, "waiting for local pes to connect");
        int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (conn < 0) MORI_THROW(TransportError, "shmem fd exchange: accept: ", Errno());
        try {
          SendFd(conn, me, my_fd);
        } catch (...) {
          ::close(conn);
          throw;
        }
        ::close(conn);
      }
    } catch (...) {
      server_error = std::current_exception();
    }
  });

  std::exception_ptr client_error;
  try {
    for (int k = 1; k < n; ++k) {
      const int peer = (me + k) % n;
      int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (sock < 0) MORI_THROW(TransportError, "shmem fd exchange: socket: ", Errno());
      sockaddr_un peer_addr = AddressOf(g, peer, &len);
      if (::connect(sock, reinterpret_cast<sockaddr*>(&peer_addr), len) != 0) {
        std::string why = Errno();
        ::close(sock);
        MORI_THROW(TransportError, "shmem fd exchange: cannot reach local pe ", peer,
                   " (global pe ", g.local_pes[peer], "): ", why,
                   "; are the processes in different network namespaces?");
      }
      try {
        out[peer] = RecvFd(sock, peer, deadline);
      } catch (...) {
        ::close(sock);
        throw;
      }
      ::close(sock);
    }
  } catch (...) {
    client_error = std::current_exception();
  }
  server.join();
  ::close(listener);
  if (client_error || server_error) {
    for (int& fd : out) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
    std::rethrow_exception(client_error ? client_error : server_error);
  }
  return out;
}

}  // namespace mori::shmem::internal
