// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/proxy/bench.hpp"

#include <chrono>

#include "mori/core/error.hpp"
#include "mori/core/version.hpp"
#include "mori/proxy/queue.hpp"

namespace mori::proxy {

using Clock = std::chrono::steady_clock;

ThroughputResult MeasureThroughput(const QueueView& q, const Command& command, uint64_t count) {
  ThroughputResult r;
  if (count == 0) return r;
  const auto t0 = Clock::now();
  uint64_t last = 0;
  for (uint64_t i = 0; i < count; ++i) last = Push(q, command);
  WaitRetired(q, last + 1);
  r.commands = count;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::vector<uint64_t> MeasureLatency(const QueueView& q, const Command& command, uint64_t count) {
  std::vector<uint64_t> ns;
  ns.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const auto t0 = Clock::now();
    const uint64_t index = Push(q, command);
    WaitRetired(q, index + 1);
    ns.push_back(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
  }
  return ns;
}

#if !MORI_CORE_WITH_CUDA
void LaunchDevicePush(const QueueView&, const Command&, uint64_t, int, bool, uintptr_t) {
  MORI_THROW(NotSupportedError, "proxy kernel producers need libmori_core built with CUDA");
}

void LaunchDevicePushLatency(const QueueView&, const Command&, uint64_t, uint64_t*, uintptr_t) {
  MORI_THROW(NotSupportedError, "proxy kernel producers need libmori_core built with CUDA");
}

std::vector<uint64_t> MeasureMappedPingPong(int, uint64_t, uint64_t) {
  MORI_THROW(NotSupportedError, "the mapped ping-pong needs libmori_core built with CUDA");
}
#endif

}  // namespace mori::proxy
