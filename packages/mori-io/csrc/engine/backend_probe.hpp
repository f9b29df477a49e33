// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <string>

#include "registry/backend_select.hpp"

namespace mori::io {

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
