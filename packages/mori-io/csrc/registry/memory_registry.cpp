// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "registry/memory_registry.hpp"

#include <cstring>
#include <mutex>

#include "mori/core/error.hpp"
#include "registry/gpu_staging.hpp"
#include "wire/secret.hpp"

namespace mori::io {

MemoryRegion MemoryRegistry::Add(uintptr_t addr, uint64_t size, int device_id,
                                 MemoryLocationType loc,
                                 const std::function<void(const MemoryRegion&)>& on_add) {
  MORI_CHECK_ARG(addr != 0 || size == 0, "register_memory: null pointer with size ", size);
  MORI_CHECK_ARG(loc == MemoryLocationType::CPU || loc == MemoryLocationType::GPU,
                 "register_memory: location must be CPU or GPU");
  MORI_CHECK_ARG(loc != MemoryLocationType::GPU || device_id >= 0,
                 "register_memory: GPU memory needs its device id (got ", device_id, ")");
  uint64_t capability = 0;
  while (capability == 0) {  // 0 is what a request naming no region carries
    const std::string bytes = RandomSecret(sizeof(capability));
    std::memcpy(&capability, bytes.data(), sizeof(capability));
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  MemoryRegion r{next_id_, addr, size, device_id, loc, capability, std::make_shared<RegionUse>()};
  on_add(r);  // may throw
  ++next_id_;
  regions_[r.id] = r;
  return r;
}

void MemoryRegistry::Remove(uint64_t id, const WithdrawalSteps& steps) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    MORI_THROW(NotFoundError, "deregister_memory: memory ", id, " is not registered with engine '",
               engine_key_, "'");
  }
  // Refuse rather than fail the transfers: a part already on the wire would still land
  // in (or be read from) memory the caller is about to free. See RegionUse.
  RegionUse& use = *it->second.use;
  use.withdrawn.store(true, std::memory_order_seq_cst);
  uint64_t inflight = use.inflight.load(std::memory_order_seq_cst);
  // Remote RDMA reads and writes into the region are the NIC's: its count says.
  if (inflight == 0) inflight = steps.in_flight(id);
  if (inflight > 0) {
    use.withdrawn.store(false, std::memory_order_seq_cst);
    MORI_THROW(InvalidStateError, "deregister_memory: memory ", id, " of engine '", engine_key_,
               "' has ", inflight,
               " transfer(s) in flight (this engine's transfers using it, or remote reads and "
               "writes being served from it); wait for them to finish or fail first");
  }
  if (steps.granted(id)) {
    // Peers that mapped it (P2P, shared host memory) copy on their own: ask each to let go and wait
    // for the confirmations, without the registry lock (reactors need it meanwhile; the region is
    // withdrawn, so nothing new reaches it).
    std::shared_ptr<RegionUse> hold = it->second.use;
    lock.unlock();
    try {
      steps.revoke(id);
    } catch (...) {
      hold->withdrawn.store(false, std::memory_order_seq_cst);
      throw;
    }
    lock.lock();
    it = regions_.find(id);
    if (it == regions_.end()) return;  // a concurrent deregistration finished it
  }
  regions_.erase(it);
  steps.withdrawn(id);
}

void MemoryRegistry::WithAllExclusive(
    const std::function<void(const std::unordered_map<uint64_t, MemoryRegion>&)>& fn) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  fn(regions_);
}

MemoryRegion MemoryRegistry::Get(uint64_t id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    MORI_THROW(NotFoundError, "memory ", id, " is not registered with engine '", engine_key_, "'");
  }
  return it->second;
}

bool MemoryRegistry::Find(uint64_t id, MemoryRegion* out) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return false;
  *out = it->second;
  return true;
}

bool MemoryRegistry::FindNamed(uint64_t id, uint64_t capability, MemoryRegion* out) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second.capability != capability) return false;
  *out = it->second;
  return true;
}

RegionLookup MemoryRegistry::Check(uint64_t mem_id, uint64_t capability, uint64_t offset,
                                   uint64_t length, bool enter, bool allow_gpu) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = regions_.find(mem_id);
  if (it == regions_.end() || it->second.capability != capability) {
    return {wire::WireStatus::kUnknownMemory, nullptr};
  }
  return CheckRegion(it->second, offset, length, enter, allow_gpu);
}

RegionLookup MemoryRegistry::CheckRegion(const MemoryRegion& r, uint64_t offset, uint64_t length,
                                         bool enter, bool allow_gpu) {
  int gpu = -1;
  if (r.loc != MemoryLocationType::CPU) {
    if (!allow_gpu || !staging::Unavailable().empty() || length > staging::kMaxStagedPart) {
      return {wire::WireStatus::kNotHostMemory, nullptr};
    }
    gpu = r.device_id;
  }
  if (length > r.size || offset > r.size - length) return {wire::WireStatus::kOutOfBounds, nullptr};
  if (enter && !r.use->Enter()) return {wire::WireStatus::kUnknownMemory, nullptr};
  return {wire::WireStatus::kOk, reinterpret_cast<char*>(r.addr), enter ? r.use.get() : nullptr,
          gpu};
}

}  // namespace mori::io
