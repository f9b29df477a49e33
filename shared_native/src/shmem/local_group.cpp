// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "local_group.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "mori/core/env.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"

namespace mori::shmem::internal {

std::string NodeKey() {
  if (const auto id = env::Get("MORI_SHMEM_NODE_ID")) return StrCat("env:", *id);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot_id);
  return StrCat(host, "/", boot_id);
}

LocalGroup DiscoverLocalGroup(bootstrap::Bootstrap& b) {
  const int n = b.WorldSize();
  const std::string key = NodeKey();
  std::vector<uint8_t> mine(key.begin(), key.end());
  auto keys = bootstrap::AllGatherBytes(b, mine);

  LocalGroup g;
  g.local_index_of.assign(n, -1);
  for (int pe = 0; pe < n; ++pe) {
    if (keys[pe] == mine) {
      g.local_index_of[pe] = static_cast<int>(g.local_pes.size());
      g.local_pes.push_back(pe);
    }
  }
  g.my_local_index = g.local_index_of[b.Rank()];

  // The id names this Init's sockets; pe 0 draws it so every pe agrees.
  std::random_device rd;
  std::string id = StrCat(std::hex, ::getpid(), "-", rd(), rd());
  std::vector<uint8_t> id_bytes(id.begin(), id.end());
  auto agreed = bootstrap::BroadcastBytes(b, id_bytes, 0);
  g.group_id.assign(agreed.begin(), agreed.end());
  MORI_LOG_DEBUG(kShmem, "pe ", b.Rank(), ": node '", key, "', ", g.local_pes.size(),
                 " local pes, group ", g.group_id);
  return g;
}

}  // namespace mori::shmem::internal
