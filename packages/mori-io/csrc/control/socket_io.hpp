// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The socket helpers live in mori-core (mori/transport/socket.hpp), shared with the
// proxy's TCP transport; this header only adapts mori-io's TCP config to them.

#include "control/tcp_config.hpp"
#include "mori/transport/socket.hpp"

namespace mori::io {

using transport::ConnectTo;
using transport::ListenOn;
using transport::RecvAll;
using transport::SendAll;

// Nodelay, keepalive and TCP_USER_TIMEOUT from the config: a silent peer is noticed
// within about peer_timeout_ms.
inline void SetSocketOptions(int fd, const TcpBackendConfig& cfg) {
  transport::SocketOptions options;
  options.peer_timeout_ms = cfg.peer_timeout_ms;
  options.sock_buf_bytes = cfg.sock_buf_bytes;
  transport::SetSocketOptions(fd, options);
}

}  // namespace mori::io
