// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>

namespace mori::io {

// How a thread waiting for a transfer spends its time before it sleeps. Read from the
// environment once per process (docs/configuration.md), when the first engine is built
// (a bad value fails that construction, not a later wait).
struct WaitOptions {
  int spins = 2000;                   // MORI_IO_WAIT_SPIN: polls of the status before sleeping
  int64_t long_spin_ns = 1'000'000;   // MORI_IO_WAIT_SPIN_US: a P2P waiter keeps spinning
                                      // this long (0: off)
  int64_t tcp_wait_poll_ns = 50'000;  // MORI_IO_TCP_WAIT_POLL_US: a waiter reading its own
                                      // TCP answer polls this long before poll(2)
  static const WaitOptions& Process();
};

}  // namespace mori::io
