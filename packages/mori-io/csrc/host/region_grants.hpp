// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "registry/inbound_statuses.hpp"
#include "registry/memory_registry.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class TransportHost;
class ControlHandlers;

// Which initiators hold a mapping or grant of which local region (P2P exports, shared
// host memory maps, CMA grants), and the revoke protocol deregistration runs over
// them: the target sends kP2pRevoke on an inbound connection of each holder and waits
// (bounded) for its kP2pRevokeAck, which the initiator sends once its last copy using
// the region ended.
//
// Bounded: at most `max_holders` initiators hold grants, `max_grants` (initiator,
// region) pairs in all; a grant past either is refused (kTooManyGrants) and counted.
// A holder whose last connection closed holds nothing usable any more (an initiator
// that loses a connection to us fails or replaces its peer, and with it every grant it
// cached; it asks again when it connects again), so its grants are dropped once no
// connection it may have opened before is still in its hello (DropGone).
class RegionGrants {
 public:
  explicit RegionGrants(TransportHost* host) : host_(host) {}
  // kP2pRevokeAck (target side) and kP2pRevoke (initiator side).
  void RegisterHandlers(ControlHandlers& handlers);
  // MORI_IO_MAX_GRANT_HOLDERS and MORI_IO_MAX_GRANTS (before use).
  void Configure(uint32_t max_holders, uint32_t max_grants) {
    max_holders_ = max_holders;
    max_grants_ = max_grants;
  }

  // Recorded before the grant leaves: a deregistration from then on revokes it. False,
  // recording nothing, when a bound is reached (counted). *added: whether this call made
  // the record (false: it held one already).
  bool Record(uint64_t mem_id, const std::string& initiator_key, bool* added = nullptr);
  // Drops the record (a grant refused after this request made it: Record's *added).
  void Forget(uint64_t mem_id, const std::string& initiator_key);
  bool Has(uint64_t mem_id);
  // Whether `initiator_key` holds a grant of any region.
  bool HoldsAny(const std::string& initiator_key);
  // Removes from `parts` the announcements of writes into regions `initiator_key` holds
  // no grant of (a one-sided write needs one: it cannot have made them); how many.
  size_t DropUngranted(const std::string& initiator_key, std::vector<InboundPart>* parts);
  // Checks registered host region `mem_id` under the request's `capability` (into *r),
  // records its grant to `initiator_key` and checks it again (see the definition);
  // *added as Record's.
  wire::WireStatus RecordChecked(uint64_t mem_id, uint64_t capability,
                                 const std::string& initiator_key, MemoryRegion* r, bool* added);
  // Revokes the region's grants and waits (bounded) for every acknowledgement; throws
  // TimeoutError naming the initiators that did not confirm.
  void Revoke(uint64_t mem_id);

  // An inbound connection of `initiator_key` that had passed its hello closed: with no
  // connection of that key left, a revocation waiting for it ends (it cannot be asked,
  // and its transfers to us have failed) and its grants are marked for DropGone.
  void ConnectionClosed(const std::string& initiator_key);
  // Drops the grants of marked holders that still have no connection, once every
  // connection accepted before their last one closed has passed or failed its hello (a
  // live initiator's own connections were opened before the short-lived one that asked
  // for a grant; ControlChannel::HellosSettledSince). Their write announcements are
  // taken first. Reactor threads call it on each scan (one atomic load when none).
  void DropGone();

  struct Stats {
    size_t holders = 0;    // initiators holding a grant
    size_t grants = 0;     // (initiator, region) pairs
    uint64_t refused = 0;  // grants refused at a bound
    uint64_t dropped = 0;  // grants dropped because their holder had no connection left
  };
  Stats stats();

 private:
  struct Holder {
    std::vector<uint64_t> regions;
    int64_t gone_since_ns = 0;  // its last connection closed then (0: it has one)
  };
  using Holders = std::unordered_map<std::string, Holder>;
  void OnRevokeAck(const std::string& initiator_key, uint64_t mem_id);
  // With mu_ held: removes region `mem_id` from holder `it` (and the holder once it
  // holds none); the iterator is invalid afterwards.
  void EraseLocked(Holders::iterator it, uint64_t mem_id);
  void SetGoneLocked(Holder& h, int64_t since_ns);

  TransportHost* host_;
  uint32_t max_holders_ = 1024;
  uint32_t max_grants_ = 1 << 16;
  std::mutex mu_;
  std::condition_variable cv_;
  Holders holders_;                                    // each key held once
  std::unordered_map<uint64_t, uint32_t> holders_of_;  // region -> how many hold it
  size_t grants_ = 0;
  std::atomic<uint32_t> gone_{0};  // holders marked (gone_since_ns != 0)
  uint64_t refused_ = 0;
  uint64_t dropped_ = 0;
  std::vector<std::pair<std::string, uint64_t>> revoking_;  // (initiator, region)
};

}  // namespace mori::io
