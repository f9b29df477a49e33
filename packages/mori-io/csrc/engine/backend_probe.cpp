// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/backend_probe.hpp"

#include <dlfcn.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "mori/core/cuda.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
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

BackendAvailability ProbeIbverbs() {
  void* lib = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return {false, StrCat("libibverbs.so.1 cannot be loaded: ", why ? why : "unknown error")};
  }
  using GetList = void** (*)(int*);
  using FreeList = void (*)(void**);
  auto get_list = reinterpret_cast<GetList>(::dlsym(lib, "ibv_get_device_list"));
  auto free_list = reinterpret_cast<FreeList>(::dlsym(lib, "ibv_free_device_list"));
  if (get_list == nullptr || free_list == nullptr) {
    ::dlclose(lib);
    return {false, "libibverbs.so.1 lacks ibv_get_device_list/ibv_free_device_list"};
  }
  int count = 0;
  void** list = get_list(&count);
  if (list != nullptr) free_list(list);
  ::dlclose(lib);
  if (count <= 0) return {false, "libibverbs loaded but lists no RDMA devices"};
  return {true, StrCat(count, " RDMA device(s)")};
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
