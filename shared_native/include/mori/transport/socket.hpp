// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// POSIX socket helpers shared by every TCP user of mori (mori-io's control channel,
// the proxy's TCP transport): listen, connect with a deadline, full sends and
// receives with bounded waits, errno text.

#include <cstddef>
#include <cstdint>
#include <string>

#include "mori/core/macros.hpp"

namespace mori::transport {

// "Connection refused (errno 111)".
MORI_API std::string ErrnoText(int err);

struct SocketOptions {
  // A silent peer is noticed within about this long (keepalive, TCP_USER_TIMEOUT).
  int peer_timeout_ms = 30000;
  // SO_SNDBUF / SO_RCVBUF; 0 keeps the kernel's.
  int sock_buf_bytes = 0;
};

// Nodelay, keepalive and TCP_USER_TIMEOUT from the options.
MORI_API void SetSocketOptions(int fd, const SocketOptions& options);
// A non-blocking listening socket on host:port (0: any port); *bound_port is the
// port. `owner` names the listener in errors. Throws InvalidArgumentError
// (unresolvable host) or TransportError.
MORI_API int ListenOn(const std::string& host, uint16_t port, const std::string& owner,
                      uint16_t* bound_port);
// Connects with a deadline; returns the fd (non-blocking) or -1 with *error set.
MORI_API int ConnectTo(const std::string& host, uint16_t port, int timeout_ms, std::string* error);
// Sends/receives exactly len bytes on a non-blocking fd, each wait for progress
// bounded by timeout_ms; false with *error set otherwise.
MORI_API bool SendAll(int fd, const char* data, size_t len, int timeout_ms, std::string* error);
MORI_API bool RecvAll(int fd, char* data, size_t len, int timeout_ms, std::string* error);

}  // namespace mori::transport
