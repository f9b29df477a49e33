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

// Kernel producers (Producer::kCuda queues; libmori_core built with CUDA, else
// NotSupportedError). Asynchronous on `stream` (a cudaStream_t as integer).
// `blocks` blocks, thread 0 of each pushing `per_block` copies of `command`; with
// `quiet` each then waits (device::Quiet) for its queue's earlier commands.
MORI_API void LaunchDevicePush(const QueueView& device_view, const Command& command,
                               uint64_t per_block, int blocks, bool quiet, uintptr_t stream);
// One thread pushing `count` copies one at a time, each waited for until retired;
// out_ns (device memory, count entries) receives each round trip's nanoseconds.
MORI_API void LaunchDevicePushLatency(const QueueView& device_view, const Command& command,
                                      uint64_t count, uint64_t* out_ns, uintptr_t stream);

// The baseline of a kernel's push -> retire: a host-mapped flag ping-pong on `device`.
// A kernel thread writes i to a pinned, device-mapped word and waits until the host
// (the calling thread) echoes i into a second one; returns the nanoseconds of each of
// `count` round trips (GPU globaltimer). Bounded by `timeout` per round trip (the
// kernel traps, the host throws TimeoutError). CUDA builds only.
MORI_API std::vector<uint64_t> MeasureMappedPingPong(int device, uint64_t count,
                                                     uint64_t timeout_ns);

}  // namespace mori::proxy
