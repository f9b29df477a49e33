// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Host-side measurements of a proxy queue (python -m mori.core.bench_proxy): the
// loops run in C++ so that the figures are the queue's and the proxy's, not the
// binding's.

#include <cstdint>
#include <vector>

#include "mori/core/macros.hpp"
#include "mori/proxy/command.hpp"

namespace mori::proxy {

struct ThroughputResult {
  uint64_t commands = 0;
  double seconds = 0;  // from the first push until the last command retired
};

// Pushes `count` copies of `command` back to back (a full queue back-pressures) and
// waits until the last one retired.
MORI_API ThroughputResult MeasureThroughput(const QueueView& q, const Command& command,
                                            uint64_t count);
// Pushes `count` copies one at a time, each waited for until it retired; returns the
// nanoseconds of each push -> retire round trip.
MORI_API std::vector<uint64_t> MeasureLatency(const QueueView& q, const Command& command,
                                              uint64_t count);

}  // namespace mori::proxy
