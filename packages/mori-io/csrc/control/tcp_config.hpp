// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>

namespace mori::io {

struct TcpBackendConfig {
  int num_worker_threads = 1;  // epoll reactors
  int qp_per_transfer = 2;     // TCP connections per remote engine
  bool enable_chunking = true;
  uint64_t chunk_size = 1 << 20;  // bytes per part when chunking
  int peer_timeout_ms = 5000;     // connect timeout and TCP_USER_TIMEOUT
  // SO_SNDBUF/SO_RCVBUF; 0 leaves the kernel's autotuning (setting them switches it
  // off; 4 MiB measured within the noise of autotuning on loopback, BENCHMARKS.md).
  int sock_buf_bytes = 0;
  // A connection with requests outstanding that neither sends nor receives a byte for
  // this long is declared stuck (a live but hung peer): it is closed, its transfers
  // fail with ERR_TIMEOUT and the peer stays failed until registered again.
  int transfer_timeout_ms = 5000;
  // An authenticated inbound connection that carried nothing for this long (and whose
  // initiator holds nothing of this engine that outlives it: grants, notice rings, RDMA
  // queue pairs) is told kIdleClose and closed; its initiator connects again on its next
  // transfer. 0: never (unauthenticated ones are bounded by peer_timeout_ms).
  int idle_timeout_ms = 600000;
  // Inbound connections still in their hello at a time (a peer that only connects
  // costs one descriptor and a few KiB each); past it the oldest is closed and counted
  // (Engine.hellos_dropped). Initiators send their hello as they connect, so a real one
  // waits only while the reactor reaches it.
  uint64_t max_pending_hellos = 128;
  // Open inbound connections per initiator key (qp_per_transfer, at most 64, plus the
  // short-lived ones of grants and keys); a hello past it is refused (kIdleClose: its
  // initiator connects again on its next transfer) and counted in hellos_refused.
  uint64_t max_connections_per_peer = 128;
  // Inbound statuses kept for pop_inbound_transfer_status; beyond it the oldest is
  // dropped (debug log), so a target whose application never pops stays bounded.
  uint64_t max_inbound_statuses = 1 << 16;
  // The same bound in bytes (each initiator's key once while it has statuses held, plus
  // about 150 bytes per status; registry/inbound_statuses.hpp): beyond it the oldest is
  // dropped too. 65,536 statuses of a few initiators take about 10 MiB. At least 65536.
  uint64_t max_inbound_status_bytes = 32 << 20;
  // MORI's switch: false keeps no inbound statuses at all (pop_inbound_transfer_status
  // finds none), for targets that learn of completion another way.
  bool enable_notification = true;
};

}  // namespace mori::io
