// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The inter-node leg of the inter-node protocols (internode/protocol.hpp): every byte
// a pe sends to a pe of another node is a command on a CrossNodeLink: a write into the
// peer's copy of the op's block, or a signal (a 64-bit release store) that is applied
// only after every earlier write to that peer has landed. A link is the seam where a
// transport plugs in: ProxyLink (internode/proxy_link.hpp) pushes them into a
// mori-core proxy command queue, whose proxy thread moves them (same-host mapping or
// CMA, TCP); HeapCopyLink (here) applies them at once through the host heap, for
// nodes emulated on one host whose pes map each other's heaps (a baseline without
// the proxy).

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "mori/shmem/context.hpp"

namespace mori::ep {

// What the link has moved, in bytes, by kind of content (the byte accounting of the
// README: token payload vs the metadata that travels with it vs signal words).
struct LinkBytes {
  uint64_t token = 0;   // token or combine-row payload
  uint64_t meta = 0;    // weights, scales, indices, source positions, masks
  uint64_t signal = 0;  // 8 per signal word
  uint64_t writes = 0;  // write commands
  uint64_t signals = 0;
  void Clear() { *this = LinkBytes{}; }
};

enum class LinkPayload : int { kToken, kMeta };

class CrossNodeLink {
 public:
  virtual ~CrossNodeLink() = default;
  virtual const char* name() const = 0;
  // Copies `bytes` from `src` to byte `offset` of pe `pe`'s copy of the op's block.
  virtual void Write(int pe, size_t offset, const void* src, size_t bytes) = 0;
  // Stores `value` (release) at byte `offset` of pe's block, after every earlier
  // Write to `pe` has landed there.
  virtual void Signal(int pe, size_t offset, uint64_t value) = 0;
  // Returns once every command issued so far has been applied at its peer.
  virtual void Quiet() = 0;
  // Payload bytes of writes the transport has moved since the link was made (signal
  // words not included).
  virtual uint64_t moved_bytes() const = 0;
  // Throws the transport's error (naming the lost pe and its node) if it failed.
  virtual void CheckHealth() const {}
};

// Nodes emulated on one host whose pes map each other's heaps (MORI's gpu_per_node
// split of one local group): each command is applied at once, by the calling thread,
// through the heap (memcpy; signals release stores), so order per peer is program
// order.
class HeapCopyLink final : public CrossNodeLink {
 public:
  HeapCopyLink(const shmem::DeviceContext& ctx, char* block) : ctx_(ctx), block_(block) {}
  const char* name() const override { return "same-host heap copy"; }
  void Write(int pe, size_t offset, const void* src, size_t bytes) override;
  void Signal(int pe, size_t offset, uint64_t value) override;
  void Quiet() override {}
  uint64_t moved_bytes() const override { return moved_; }

 private:
  shmem::DeviceContext ctx_;
  char* block_;
  uint64_t moved_ = 0;
};

}  // namespace mori::ep
