// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <string>

namespace mori::io {

// MORI's backend names; XGMI (AMD's GPU link) is accepted in Python as an alias of P2P.
// MORI's numbers (Unknown 0, XGMI 1, RDMA 2, TCP 3, FABRIC 4); P2P is MORI's XGMI slot
// (same-host GPU memory), SHM is mori's own. FABRIC is named but not implemented.
enum class BackendType : int { kUnknown = 0, kP2P = 1, kRdma = 2, kTcp = 3, kFabric = 4, kShm = 5 };

const char* BackendTypeName(BackendType type) noexcept;

struct BackendAvailability {
  bool available;
  std::string reason;  // why not, or what was found
};

// Whether a backend can run on this machine, and why (not). Cheap enough to call at
// engine creation: no connection is made.
//   TCP  - always;
//   SHM  - process_vm_readv works and kernel.yama.ptrace_scope lets same-user
//          processes use it;
//   P2P  - libmori_core sees at least one CUDA device;
//   RDMA - libibverbs loads (dlopen) and lists at least one device.
BackendAvailability ProbeBackend(BackendType type);

}  // namespace mori::io
