// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "registry/hot_path_options.hpp"

#include <strings.h>

#include <cstdlib>
#include <cstring>

#include "mori/core/error.hpp"

namespace mori::io {

namespace {

bool EnvFlag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return !(std::strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 || strcasecmp(v, "false") == 0);
}

}  // namespace

HotPathOptions HotPathOptions::FromEnv() {
  HotPathOptions o;
  o.shm_map = EnvFlag("MORI_IO_SHM_MAP", true);
  o.notice_ring = EnvFlag("MORI_IO_NOTICE_RING", true);
  o.cma_cache = EnvFlag("MORI_IO_CMA_CACHE", true);
  o.liveness_word = EnvFlag("MORI_IO_SHM_LIVENESS_WORD", true);
  o.tcp_waiter_reads = EnvFlag("MORI_IO_TCP_WAITER_READS", true);
  if (const char* us = std::getenv("MORI_IO_TCP_BUSY_POLL_US")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(us, &end, 10);
    if (end == us || *end != '\0' || v > 1000000) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_TCP_BUSY_POLL_US='", us,
                 "': expected microseconds in [0, 1000000]");
    }
    o.tcp_busy_poll_us = static_cast<uint32_t>(v);
  }
  if (const char* split = std::getenv("MORI_IO_SHM_SPLIT_BYTES")) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(split, &end, 10);
    if (end == split || *end != '\0' || (v != 0 && (v < 4096 || v > (1ull << 40)))) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_SHM_SPLIT_BYTES='", split,
                 "': expected 0 (never split) or bytes in [4096, 2^40]");
    }
    o.shm_split_bytes = v;
  }
  if (const char* slots = std::getenv("MORI_IO_NOTICE_RING_SLOTS")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(slots, &end, 10);
    if (end == slots || *end != '\0' || (v != 0 && (v < 2 || v > (1u << 20) || (v & (v - 1))))) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_NOTICE_RING_SLOTS='", slots,
                 "': expected 0 or a power of two in [2, 1048576]");
    }
    o.notice_ring_slots = static_cast<uint32_t>(v);
  }
  auto count = [](const char* name, unsigned long lo, unsigned long hi, uint32_t* out) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    char* end = nullptr;
    unsigned long n = std::strtoul(v, &end, 10);
    if (end == v || *end != '\0' || n < lo || n > hi) {
      MORI_THROW(InvalidArgumentError, name, "='", v, "': expected a count in [", lo, ", ", hi,
                 "]");
    }
    *out = static_cast<uint32_t>(n);
  };
  count("MORI_IO_MAX_GRANT_HOLDERS", 1, 1u << 20, &o.max_grant_holders);
  count("MORI_IO_MAX_GRANTS", 1, 1u << 24, &o.max_grants);
  if (const char* rings = std::getenv("MORI_IO_MAX_NOTICE_RINGS")) {
    char* end = nullptr;
    unsigned long v = std::strtoul(rings, &end, 10);
    if (end == rings || *end != '\0' || v > (1u << 16)) {
      MORI_THROW(InvalidArgumentError, "MORI_IO_MAX_NOTICE_RINGS='", rings,
                 "': expected a count in [0, 65536]");
    }
    o.max_notice_rings = static_cast<uint32_t>(v);
  }
  return o;
}

}  // namespace mori::io
