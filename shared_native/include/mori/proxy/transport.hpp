// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The one interface every proxy transport implements (TCP streams, same-host copies,
// and later ibverbs RDMA). Targets are (pe, offset in that pe's symmetric heap); the
// source of a write is an offset in this process's own heap (host or CUDA memory: a
// transport stages device memory itself). The proxy thread makes every Post* and Poll
// call of a transport; a transport may run its own threads (a receiver applying
// inbound commands).
//
// Ordering contract: everything posted to one pe is applied there in posting order —
// a write has landed in pe's heap before an add, fence or notify posted after it
// takes effect.

#include <cstdint>
#include <string>
#include <vector>

#include "mori/core/macros.hpp"

namespace mori::proxy {

struct Completion {
  enum class Kind : int {
    kFenceAck = 0,  // everything posted to `pe` before PostFence(pe, value) was applied there
    kNotify = 1,    // `pe` posted PostNotify(me, value); its earlier posts to me were applied
  };
  Kind kind;
  int pe;
  uint64_t value;
};

class MORI_API Transport {
 public:
  virtual ~Transport();
  // "tcp", "cma", "mapped".
  virtual const char* Name() const = 0;
  // Copies nbytes of this pe's heap at src_offset to pe's heap at dst_offset. The
  // source may be reused once the next Poll returns (a transport may read it until
  // then, e.g. a CUDA heap's staging copies, waited for once per proxy round).
  virtual void PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) = 0;
  // Atomically adds value to the uint64 at offset in pe's heap (release: the writes
  // posted before it are visible to whoever observes the new value).
  virtual void PostAtomicAdd(int pe, uint64_t offset, uint64_t value) = 0;
  virtual void PostFence(int pe, uint64_t token) = 0;
  virtual void PostNotify(int pe, uint64_t value) = 0;
  // Makes progress and appends what completed; on return every source posted so far
  // has been read. Throws TransportError naming the peer pe and its node when a
  // connection is lost or a peer sent something invalid.
  virtual void Poll(std::vector<Completion>* out) = 0;
  // Orderly end (after the proxies' last barrier): peers closing now are not errors.
  virtual void Shutdown() = 0;
};

}  // namespace mori::proxy
