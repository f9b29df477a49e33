// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// The reactor's limits, shared by its files (reactor.cpp: the loop, sends, closes;
// reactor_read.cpp: the read path; reactor_hello.cpp: accepts and hellos).
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/wire_protocol.hpp"

namespace mori::io::reactor_limits {

inline constexpr size_t kHdr = sizeof(wire::Header);
// Payloads at least this large, with nothing buffered, are received straight into
// their destination (no staging copy).
inline constexpr uint64_t kDirectRecvMin = 32 << 10;
// Bytes one connection may consume per readiness event before the reactor serves the
// others (level-triggered epoll brings it back).
inline constexpr size_t kReadBudget = 8 << 20;
inline constexpr int kMaxIov = 512;
inline constexpr size_t kMaxSideAnswers = 16;
// The slowest an inbound payload may arrive on average, after transfer_timeout_ms
// (Reactor::DeadlineMissed): a peer trickling bytes resets the stuck clock with each
// one, and would otherwise hold its connection (and, for a write into a region, keep the
// region from being deregistered) for as long as it liked.
inline constexpr uint64_t kMinPayloadBytesPerS = 1 << 20;
// Accepts per wake-up of the listener: the connections a flood brings in are counted
// against max_pending_hellos (and the oldest dropped) between batches, so the
// descriptors they hold stay near that bound.
inline constexpr int kAcceptBatch = 32;
// A connection that read nothing for this long gives back its large receive buffer.
inline constexpr int64_t kRecvBufIdleNs = 1'000'000'000;
// A target stops reading requests from a connection whose answers pile up unsent (the
// initiator does not read them), and reads again once they drained: so a peer that
// floods requests cannot grow the queue without bound, and its stalled connection is
// then closed as stuck (it otherwise kept the stuck clock fresh by sending).
inline constexpr size_t kPauseQueuedItems = 4096;
inline constexpr uint64_t kPauseQueuedBytes = 64 << 20;
inline constexpr size_t kResumeQueuedItems = 1024;
inline constexpr uint64_t kResumeQueuedBytes = 16 << 20;

}  // namespace mori::io::reactor_limits
