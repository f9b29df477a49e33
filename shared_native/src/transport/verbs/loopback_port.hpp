// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// ============================================================================
//  TEST DOUBLE. NOT AN RDMA TRANSPORT. COMPILED ONLY INTO THE C++ UNIT TESTS.
//
//  The loopback port implements RdmaPort (rdma_port.hpp) for ports that live in
//  ONE process: RDMA WRITE is a memcpy into the peer port's registered memory, a
//  SEND a memcpy into the peer QP's next posted receive. It lets the proxy's
//  verbs transport be tested on machines without an RDMA NIC. It is not part of
//  libmori_core (shared_native/tests/CMakeLists.txt compiles it into the test
//  executable); nothing in a wheel can select it.
// ============================================================================
//
// What it mirrors of an RC QP, so the transport cannot tell the difference:
//  - Work requests execute in posting order, asynchronously: PostSend only queues
//    them; they run when the INITIATOR's port is polled (a transport that never
//    polls never sees its WRs complete, as with a NIC whose CQ is not drained).
//  - A SEND with no receive posted at the target waits (RNR retry without limit,
//    rnr_retry = 7) and blocks the WRs behind it on that QP; a SEND longer than the
//    receive buffer fails with kWcLocLenError.
//  - A WRITE whose remote range is not inside a live registration of the target port
//    with that rkey fails with kWcRemAccessError; a local buffer outside a
//    registration of its own port with that lkey fails with kWcLocProtError; a
//    target QP (or port) that was destroyed fails the WR with kWcRetryExceeded. The
//    first failure puts the QP in ERROR: it and every later WR on it complete with
//    an error (kWcFlushError after the first), signaled or not, as a NIC reports.
//  - PostSend past send_depth outstanding WRs returns ENOMEM (a WR counts until a
//    signaled WR at or after it completes); PostRecv past recv_depth, ENOMEM.
//  - Endpoints carry the GID "mori loopbackQP" and the QP number; Connect runs the
//    real BuildInit/Rtr/RtsTransition on them and refuses an endpoint of a real NIC.
// Where it differs: one lock for all ports; completions are delivered only by Poll.

#include <memory>

#include "mori/transport/verbs/rdma_port.hpp"

namespace mori::transport::verbs::testing {

std::unique_ptr<RdmaPort> CreateLoopbackPort(uint64_t max_message_bytes = uint64_t{1} << 30);

}  // namespace mori::transport::verbs::testing
