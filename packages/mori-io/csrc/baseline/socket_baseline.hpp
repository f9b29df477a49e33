// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>

namespace mori::io {

// The physical limit the TCP backend is judged against: `count` messages of `msg_size`
// bytes streamed over a loopback TCP connection between two threads with plain
// blocking send/recv (no framing, no reactor). With `ack_each`, the receiver answers
// every message with one byte and the sender waits for it (one round trip per message,
// the pattern of a single acknowledged write).
struct SocketStreamResult {
  double seconds = 0;         // first send to last byte received
  uint64_t bytes = 0;         // payload bytes moved
  double sender_cpu_s = 0;    // thread CPU time of the sending thread
  double receiver_cpu_s = 0;  // thread CPU time of the receiving thread
};

// Throws TransportError when a socket call fails or stalls for more than 10 s.
SocketStreamResult RawSocketStream(uint64_t msg_size, uint64_t count, bool ack_each,
                                   int sock_buf_bytes);

}  // namespace mori::io
