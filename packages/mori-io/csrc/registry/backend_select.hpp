// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <string>

namespace mori::io {

// MORI's backend names; XGMI (AMD's GPU link) is accepted in Python as an alias of P2P.
// MORI's numbers (Unknown 0, XGMI 1, RDMA 2, TCP 3, FABRIC 4); P2P is MORI's XGMI slot
// (same-host GPU memory), SHM is mori's own. FABRIC is named but not implemented.
enum class BackendType : int { kUnknown = 0, kP2P = 1, kRdma = 2, kTcp = 3, kFabric = 4, kShm = 5 };

const char* BackendTypeName(BackendType type) noexcept;

enum class MemoryLocationType : uint32_t { Unknown = 0, CPU = 1, GPU = 2 };

// A user's override of the per-pair choice: MORI_IO_BACKEND=auto|tcp|shm, or
// IOEngineConfig(backend=...), which wins over the environment.
enum class BackendOverride { kAuto, kTcp, kShm };

// Parses "", "auto", "tcp", "shm" (any case); throws InvalidArgumentError otherwise.
BackendOverride ParseBackendOverride(const std::string& text);

// Which SHM copy moves the bytes of one pair of regions: a plain memcpy into the
// target's region mapped here (it lies in the target's shared host memory), or CMA
// (process_vm_readv/writev) for any other host memory. Undecided where no remote
// region is named (the per-peer choice made at connect).
enum class ShmPath { kUndecided, kCma, kMapped };

// Everything the choice for one (local memory, remote memory) pair depends on. The
// caller gathers it; ChooseBackend is a pure function of it.
struct BackendChoiceInput {
  std::string local_host_id;   // LocalHostIdentity() of this process
  std::string remote_host_id;  // the remote EngineDesc's host_id ("" if unknown)
  MemoryLocationType local_loc = MemoryLocationType::CPU;
  MemoryLocationType remote_loc = MemoryLocationType::CPU;
  bool local_shm = false;    // this engine created the SHM backend
  bool remote_shm = false;   // the remote EngineDesc lists SHM
  bool local_p2p = false;    // this engine created the P2P backend
  bool remote_p2p = false;   // the remote EngineDesc lists P2P
  bool local_rdma = false;   // this engine created the RDMA backend
  bool remote_rdma = false;  // the remote EngineDesc lists RDMA
  bool cma_ok = true;        // CMA permitted for this pair (probe, or first use)
  std::string cma_reason;    // why not, when !cma_ok
  BackendOverride override_choice = BackendOverride::kAuto;
  ShmPath shm_path = ShmPath::kUndecided;
  std::string shm_path_why;  // with kCma: why the region is not mapped
};

struct BackendChoice {
  BackendType backend;
  std::string reason;
};

// Same host + GPU memory on both sides -> P2P (when both engines created it); same
// host + host memory on both sides -> SHM (when both engines created it and CMA works
// for the pair); otherwise RDMA when both engines created it (a NIC on each side),
// else TCP. An override of TCP always holds; an override of SHM holds only where SHM
// can work and otherwise falls back, saying why. An SHM reason names the copy that
// moves the bytes (shm_path) and why.
BackendChoice ChooseBackend(const BackendChoiceInput& in);

// "<hostname>/<boot_id>/<pid namespace>": two processes with equal identities run on
// one kernel in one pid namespace, so a pid from one names the same process in the
// other (what CMA needs).
std::string LocalHostIdentity();

}  // namespace mori::io
