// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/inbound_statuses.hpp"
#include "engine/memory_registry.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class IoEngine;
class ControlHandlers;

// Which initiators hold a mapping or grant of which local region (P2P exports, shared
// host memory maps, CMA grants), and the revoke protocol deregistration runs over
// them: the target sends kP2pRevoke on an inbound connection of each holder and waits
// (bounded) for its kP2pRevokeAck, which the initiator sends once its last copy using
// the region ended.
class RegionGrants {
 public:
  explicit RegionGrants(IoEngine* engine) : engine_(engine) {}
  // kP2pRevokeAck (target side) and kP2pRevoke (initiator side).
  void RegisterHandlers(ControlHandlers& handlers);

  // Recorded before the grant leaves: a deregistration from then on revokes it.
  void Record(uint64_t mem_id, const std::string& initiator_key);
  // Drops the record (a grant refused after it was recorded).
  void Forget(uint64_t mem_id, const std::string& initiator_key);
  bool Has(uint64_t mem_id);
  // Whether `initiator_key` holds a grant of any region.
  bool HoldsAny(const std::string& initiator_key);
  // Removes from `parts` the announcements of writes into regions `initiator_key` holds
  // no grant of (a one-sided write needs one: it cannot have made them); how many.
  size_t DropUngranted(const std::string& initiator_key, std::vector<InboundPart>* parts);
  // Checks registered host region `mem_id` under the request's `capability` (into *r),
  // records its grant to `initiator_key` and checks it again (see the definition).
  wire::WireStatus RecordChecked(uint64_t mem_id, uint64_t capability,
                                 const std::string& initiator_key, MemoryRegion* r);
  // Revokes the region's grants and waits (bounded) for every acknowledgement; throws
  // TimeoutError naming the initiators that did not confirm.
  void Revoke(uint64_t mem_id);

 private:
  void OnRevokeAck(const std::string& initiator_key, uint64_t mem_id);
  IoEngine* engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, std::vector<std::string>> granted_;
  std::vector<std::pair<std::string, uint64_t>> revoking_;  // (initiator, region)
};

}  // namespace mori::io
