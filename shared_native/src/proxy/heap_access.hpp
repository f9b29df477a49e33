// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// What the transports know of the symmetric heap and the job: this pe's heap (host
// or CUDA), every pe's node, and how to name a pe in an error. Private to the proxy.

#include <cstdint>
#include <string>
#include <vector>

#include "mori/core/error.hpp"

namespace mori::proxy::internal {

struct PeerInfo {
  std::string node;     // shmem's node key (what makes a local group)
  std::string host_id;  // hostname/boot_id/pid namespace: same-host paths need equality
  std::string address;  // where its TCP listener is reached from another host
  uint16_t port = 0;
  int64_t pid = 0;
  uint64_t heap_base = 0;  // address of its heap in its own process (CMA)
  int transport = 0;       // its TransportChoice (every pe must make the same)
};

class HeapAccess {
 public:
  HeapAccess() = default;
  HeapAccess(int my_pe, int n_pes, char* my_base, uint64_t heap_size, bool cuda, int device)
      : my_pe_(my_pe),
        n_pes_(n_pes),
        my_base_(my_base),
        heap_size_(heap_size),
        cuda_(cuda),
        device_(device) {}

  int my_pe() const { return my_pe_; }
  int n_pes() const { return n_pes_; }
  char* my_base() const { return my_base_; }
  uint64_t heap_size() const { return heap_size_; }
  bool cuda() const { return cuda_; }
  int device() const { return device_; }  // the CUDA heap's device
  std::vector<PeerInfo>& peers() { return peers_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }

  // "proxy of pe 0 (node 'env:0')": how this process's messages start.
  std::string Self() const {
    return StrCat("proxy of pe ", my_pe_, " (node '", NodeOf(my_pe_), "')");
  }
  std::string NodeOf(int pe) const {
    return pe >= 0 && pe < static_cast<int>(peers_.size()) ? peers_[pe].node : std::string("?");
  }

  // "pe 3 (node 'env:1')".
  std::string PeName(int pe) const {
    if (pe < 0 || pe >= static_cast<int>(peers_.size())) return StrCat("pe ", pe);
    return StrCat("pe ", pe, " (node '", peers_[pe].node, "')");
  }

  bool InHeap(uint64_t offset, uint64_t nbytes) const {
    return offset <= heap_size_ && nbytes <= heap_size_ - offset;
  }

  // Release-ordered atomic add on the own heap's word, host heaps only (a CUDA
  // heap's adds go through a DeviceLane: device_lane.hpp).
  void HostAtomicAdd(uint64_t offset, uint64_t value) const {
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(my_base_ + offset), value, __ATOMIC_RELEASE);
  }

 private:
  int my_pe_ = 0;
  int n_pes_ = 1;
  char* my_base_ = nullptr;
  uint64_t heap_size_ = 0;
  bool cuda_ = false;
  int device_ = 0;
  std::vector<PeerInfo> peers_;
};

}  // namespace mori::proxy::internal
