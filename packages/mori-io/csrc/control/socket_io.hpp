// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <string>

#include "control/tcp_config.hpp"

namespace mori::io {

// Nodelay, keepalive and TCP_USER_TIMEOUT from the config: a silent peer is noticed
// within about peer_timeout_ms.
void SetSocketOptions(int fd, const TcpBackendConfig& cfg);
// A non-blocking listening socket on host:port (0: any port); *bound_port is the port.
// Throws InvalidArgumentError (unresolvable host) or TransportError.
int ListenOn(const std::string& host, uint16_t port, const std::string& engine_key,
             uint16_t* bound_port);
// Connects with a deadline; returns the fd (non-blocking) or -1 with *error set.
int ConnectTo(const std::string& host, uint16_t port, int timeout_ms, std::string* error);
// Blocking sends/receives of exactly len bytes on a non-blocking fd, each wait bounded by
// timeout_ms; false with *error set otherwise.
bool SendAll(int fd, const char* data, size_t len, int timeout_ms, std::string* error);
bool RecvAll(int fd, char* data, size_t len, int timeout_ms, std::string* error);

}  // namespace mori::io
