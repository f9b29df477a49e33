// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/backend_probe.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "mori/core/cuda.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "rdma/rdma_backend.hpp"
#include "shm/cma_copy.hpp"

namespace mori::io {
namespace {

BackendAvailability ProbeCma() {
  char src[64] = "mori";
  char dst[64] = {};
  int err = CmaCopy(::getpid(), false, dst, reinterpret_cast<uintptr_t>(src), sizeof(src));
  if (err != 0) {
    return {false, StrCat("process_vm_readv is not permitted here: ", std::strerror(err),
                          " (errno ", err, ")")};
  }
  std::ifstream scope_file("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (scope_file >> scope && scope >= 2) {
    return {false, StrCat("kernel.yama.ptrace_scope=", scope,
                          " forbids cross-process memory access (CMA)")};
  }
  return {true, scope_file ? StrCat("CMA usable (ptrace_scope=", scope, ")") : "CMA usable"};
}

// The RDMA backend's own probe (mori-core's verbs loader: MORI_IO_IBVERBS_LIB, the
// required symbols, the device list), so there is one way libibverbs is loaded.
BackendAvailability ProbeIbverbs() {
  rdma::RdmaProbe probe = rdma::ProbeRdma();
  return {probe.available, probe.reason};
}

}  // namespace

BackendAvailability ProbeBackend(BackendType type) {
  BackendAvailability result{false, ""};
  switch (type) {
    case BackendType::kTcp:
      result = {true, "sockets"};
      break;
    case BackendType::kShm:
      result = ProbeCma();
      break;
    case BackendType::kP2P: {
      int n = cuda::DeviceCount();
      result = n > 0 ? BackendAvailability{true, StrCat(n, " CUDA device(s)")}
                     : BackendAvailability{false, cuda::UnavailableReason()};
      break;
    }
    case BackendType::kRdma:
      // A build without the backend says so (MORI_IO_RDMA_BUILD: no headers, or
      // MORI_IO_RDMA=off), whatever libibverbs this machine has.
      result = MORI_IO_WITH_RDMA ? ProbeIbverbs() : BackendAvailability{false, MORI_IO_RDMA_BUILD};
      break;
    case BackendType::kUnknown:
      result = {false, "Unknown is not a backend"};
      break;
    case BackendType::kFabric:
      result = {false, "FABRIC (a scale-up fabric across nodes) is not implemented in mori"};
      break;
    default:
      MORI_THROW(InvalidArgumentError, "unknown backend type ", static_cast<int>(type));
  }
  MORI_LOG_DEBUG(kIo, "backend ", BackendTypeName(type), ": ",
                 result.available ? "available" : "unavailable", " (", result.reason, ")");
  return result;
}

}  // namespace mori::io
