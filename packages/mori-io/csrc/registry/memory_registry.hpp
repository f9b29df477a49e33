// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "registry/backend_select.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

// Who still uses a registered region. Deregistration sets `withdrawn` and then reads
// `inflight`; a user adds to `inflight` and then reads `withdrawn` (both seq_cst), so
// either deregistration sees the use and refuses, or the user sees the withdrawal and
// backs off: no byte moves into or out of a region after its deregistration returned.
struct RegionUse {
  std::atomic<uint64_t> inflight{0};  // local transfers + inbound writes mid-payload
  std::atomic<bool> withdrawn{false};
  // True if the caller may touch the region (and must call Leave after).
  bool Enter() noexcept {
    inflight.fetch_add(1, std::memory_order_seq_cst);
    if (!withdrawn.load(std::memory_order_seq_cst)) return true;
    inflight.fetch_sub(1, std::memory_order_release);
    return false;
  }
  void Leave() noexcept { inflight.fetch_sub(1, std::memory_order_release); }
};

struct MemoryRegion {
  uint64_t id;
  uintptr_t addr;
  uint64_t size;
  int device_id;
  MemoryLocationType loc;
  // Drawn from getrandom at registration, never 0, carried in the region's MemoryDesc:
  // a peer names the region by (id, capability), and ids are small sequential integers.
  uint64_t capability;
  // Shared by the registry and every copy of the region (sessions, reactor caches);
  // the registry drops its reference only once no transfer uses the region.
  std::shared_ptr<RegionUse> use;
};

// A target's check of a request against a registered region.
struct RegionLookup {
  wire::WireStatus status;
  char* base;
  RegionUse* use = nullptr;  // entered (when `enter` and kOk): Leave once done with it
  int gpu_device = -1;       // >= 0: GPU memory of this device, moved through staging
};

// What deregistration asks of the transports and the grant registry, in its order.
struct WithdrawalSteps {
  std::function<uint64_t(uint64_t id)> in_flight;  // uses the registry cannot see (a NIC's)
  std::function<bool(uint64_t id)> granted;        // peers hold a mapping or grant of it
  std::function<void(uint64_t id)> revoke;         // ask them to let go, wait (may throw)
  std::function<void(uint64_t id)> withdrawn;      // gone from the registry (lock held)
};

// The regions registered with one engine, by id.
class MemoryRegistry {
 public:
  explicit MemoryRegistry(std::string engine_key) : engine_key_(std::move(engine_key)) {}

  // `on_add` runs under the registry's lock before the region is visible, and may throw
  // (nothing is registered then).
  MemoryRegion Add(uintptr_t addr, uint64_t size, int device_id, MemoryLocationType loc,
                   const std::function<void(const MemoryRegion&)>& on_add);
  // Refuses (InvalidStateError) while transfers use the region; see RegionUse.
  void Remove(uint64_t id, const WithdrawalSteps& steps);
  // Runs `fn` with every region under the exclusive lock (no region added meanwhile).
  void WithAllExclusive(
      const std::function<void(const std::unordered_map<uint64_t, MemoryRegion>&)>& fn);

  // Copy of the region, or throws NotFoundError.
  MemoryRegion Get(uint64_t id) const;
  // Copies region `id` into *out; false if it is not registered.
  bool Find(uint64_t id, MemoryRegion* out) const;
  // Find for a peer's request: false also when `capability` is not the region's (the
  // peer is answered as for an id never registered).
  bool FindNamed(uint64_t id, uint64_t capability, MemoryRegion* out) const;
  // `allow_gpu`: a GPU region is served through staging buffers (TCP) where this build
  // can; otherwise (and for SHM) it is refused as kNotHostMemory. A peer's request:
  // `capability` must be the region's.
  RegionLookup Check(uint64_t mem_id, uint64_t capability, uint64_t offset, uint64_t length,
                     bool enter, bool allow_gpu) const;

 private:
  static RegionLookup CheckRegion(const MemoryRegion& r, uint64_t offset, uint64_t length,
                                  bool enter, bool allow_gpu);
  std::string engine_key_;
  mutable std::shared_mutex mu_;
  std::unordered_map<uint64_t, MemoryRegion> regions_;
  uint64_t next_id_ = 1;
};

}  // namespace mori::io
