// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "registry/hot_path_options.hpp"

#include "ledger/wait_options.hpp"
#include "mori/core/env.hpp"
#include "mori/core/error.hpp"

namespace mori::io {

HotPathOptions HotPathOptions::FromEnv() {
  HotPathOptions o;
  o.shm_map = env::Bool("MORI_IO_SHM_MAP", o.shm_map);
  o.notice_ring = env::Bool("MORI_IO_NOTICE_RING", o.notice_ring);
  o.cma_cache = env::Bool("MORI_IO_CMA_CACHE", o.cma_cache);
  o.liveness_word = env::Bool("MORI_IO_SHM_LIVENESS_WORD", o.liveness_word);
  o.tcp_waiter_reads = env::Bool("MORI_IO_TCP_WAITER_READS", o.tcp_waiter_reads);
  o.tcp_busy_poll_us =
      static_cast<uint32_t>(env::Int("MORI_IO_TCP_BUSY_POLL_US", o.tcp_busy_poll_us, 0, 1'000'000));
  o.shm_split_bytes = env::Size("MORI_IO_SHM_SPLIT_BYTES", o.shm_split_bytes, 0, uint64_t{1} << 40);
  if (o.shm_split_bytes != 0 && o.shm_split_bytes < 4096) {
    MORI_THROW(InvalidArgumentError, "MORI_IO_SHM_SPLIT_BYTES='",
               *env::Get("MORI_IO_SHM_SPLIT_BYTES"),
               "': expected 0 (never split) or bytes in [4096, 2^40]");
  }
  const int64_t slots = env::Int("MORI_IO_NOTICE_RING_SLOTS", o.notice_ring_slots, 0, 1 << 20);
  if (slots == 1 || (slots & (slots - 1)) != 0) {
    MORI_THROW(InvalidArgumentError, "MORI_IO_NOTICE_RING_SLOTS='", slots,
               "': expected 0 or a power of two in [2, 1048576]");
  }
  o.notice_ring_slots = static_cast<uint32_t>(slots);
  o.max_notice_rings =
      static_cast<uint32_t>(env::Int("MORI_IO_MAX_NOTICE_RINGS", o.max_notice_rings, 0, 1 << 16));
  o.max_grant_holders =
      static_cast<uint32_t>(env::Int("MORI_IO_MAX_GRANT_HOLDERS", o.max_grant_holders, 1, 1 << 20));
  o.max_grants = static_cast<uint32_t>(env::Int("MORI_IO_MAX_GRANTS", o.max_grants, 1, 1 << 24));
  o.backend = env::String("MORI_IO_BACKEND", "");
  // The waits' options are per process: the first engine reads them, so a bad value
  // fails its construction rather than a wait.
  (void)WaitOptions::Process();
  return o;
}

}  // namespace mori::io
