// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "registry/backend_select.hpp"
#include "registry/memory_registry.hpp"
#include "registry/peer_registry.hpp"

namespace mori::io {

enum class Op { kRead, kWrite };

struct TransferSpan {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t size;
};

// A region of a remote engine as its MemoryDesc names it. `size` is what the
// descriptor says; transports that learn the target's registered size bound the
// transfer by that instead.
struct RemoteRegion {
  std::string engine_key;
  uint64_t mem_id = 0;
  uint64_t size = 0;
  MemoryLocationType loc = MemoryLocationType::CPU;
  uint64_t capability = 0;  // the region's, from its MemoryDesc; every request carries it
};

// One transfer as the engine hands it to a transport: every span lies inside both
// regions as the caller described them; at Submit the peer is registered, reachable,
// not failed, and `conns` its control connections.
struct TransferRequest {
  Op op;
  const MemoryRegion& local;
  const std::shared_ptr<Peer>& peer;
  const RemoteRegion& remote;
  const TransferSpan* spans;
  size_t n;
  uint64_t uid;
  PeerConnections* conns = nullptr;  // null in Precheck
};

}  // namespace mori::io
