// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include "heap_backend.hpp"

#include <string>

namespace mori::shmem::internal {

// This process's node key: "env:<MORI_SHMEM_NODE_ID>" when set, else
// "<hostname>/<boot_id>". Pes with equal keys form a local group.
std::string NodeKey();

// Collective: finds which pes share this node (same hostname and boot id, or the
// same MORI_SHMEM_NODE_ID when set, which tests use to emulate several nodes on
// one machine) and agrees on a group id unique to this Init.
LocalGroup DiscoverLocalGroup(bootstrap::Bootstrap& bootstrap);

}  // namespace mori::shmem::internal
