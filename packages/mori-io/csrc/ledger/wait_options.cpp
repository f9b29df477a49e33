// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "ledger/wait_options.hpp"

#include "mori/core/env.hpp"

namespace mori::io {

const WaitOptions& WaitOptions::Process() {
  static const WaitOptions options = [] {
    WaitOptions o;
    o.spins = static_cast<int>(env::Int("MORI_IO_WAIT_SPIN", o.spins, 0, 1'000'000'000));
    o.long_spin_ns = env::Int("MORI_IO_WAIT_SPIN_US", o.long_spin_ns / 1000, 0, 1'000'000) * 1000;
    o.tcp_wait_poll_ns =
        env::Int("MORI_IO_TCP_WAIT_POLL_US", o.tcp_wait_poll_ns / 1000, 0, 1'000'000) * 1000;
    return o;
  }();
  return options;
}

}  // namespace mori::io
