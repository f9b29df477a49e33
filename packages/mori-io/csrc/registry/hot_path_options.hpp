// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <string>

namespace mori::io {

// The engine's switches from the environment (docs/configuration.md), read once per
// engine, when it is built.
struct HotPathOptions {
  bool shm_map = true;                // MORI_IO_SHM_MAP=0: SHM always copies with CMA, even for
                                      // regions in the target's shared host memory
  bool notice_ring = true;            // MORI_IO_NOTICE_RING=0: same-host write announcements
                                      // go over TCP instead of a shared-memory ring
  uint32_t notice_ring_slots = 4096;  // MORI_IO_NOTICE_RING_SLOTS: slots of the rings this
                                      // engine grants (a power of two; 0: grants none)
  uint32_t max_notice_rings = 256;    // MORI_IO_MAX_NOTICE_RINGS: rings this engine grants at
                                      // most at a time (beyond: announcements over TCP)
  uint32_t max_grant_holders = 1024;  // MORI_IO_MAX_GRANT_HOLDERS: initiators holding region
                                      // grants (CMA, map, P2P) at a time (beyond: refused)
  uint32_t max_grants = 1 << 16;      // MORI_IO_MAX_GRANTS: (initiator, region) grants held
                                      // at a time (beyond: refused)
  bool cma_cache = true;              // MORI_IO_CMA_CACHE=0: every CMA part asks the target
                                      // for a grant (two round trips per write)
  bool liveness_word = true;          // MORI_IO_SHM_LIVENESS_WORD=0: same-host copies poll the
                                      // target's pidfd (a syscall) instead of its liveness word
  bool tcp_waiter_reads = true;       // MORI_IO_TCP_WAITER_READS=0: the thread waiting for a
                                      // single TCP write never reads its answer itself (the
                                      // reactor reads it and wakes the waiter)
  uint32_t tcp_busy_poll_us = 20;     // MORI_IO_TCP_BUSY_POLL_US: after a read pass a reactor
                                      // polls its sockets without sleeping this long (0: off),
                                      // so the next request of a burst finds it awake; at most
                                      // this much CPU per pass (BENCHMARKS.md)
  // MORI_IO_SHM_SPLIT_BYTES: a same-host copy (mapped or cached CMA) of at least this many
  // bytes is split into shares of at least half that, copied at once by the submitting
  // thread and the reactors (one share per reactor at most, no more shares than CPUs);
  // 0: one thread always.
  uint64_t shm_split_bytes = 2 << 20;
  std::string backend;  // MORI_IO_BACKEND: auto, tcp or shm (ParseBackendOverride)
  static HotPathOptions FromEnv();
};

}  // namespace mori::io
