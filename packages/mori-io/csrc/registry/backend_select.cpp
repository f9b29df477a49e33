// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "registry/backend_select.hpp"

#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "mori/core/error.hpp"

namespace mori::io {

const char* BackendTypeName(BackendType type) noexcept {
  switch (type) {
    case BackendType::kUnknown:
      return "Unknown";
    case BackendType::kFabric:
      return "FABRIC";
    case BackendType::kTcp:
      return "TCP";
    case BackendType::kShm:
      return "SHM";
    case BackendType::kP2P:
      return "P2P";
    case BackendType::kRdma:
      return "RDMA";
  }
  return "?";
}

BackendOverride ParseBackendOverride(const std::string& text) {
  if (text.empty() || strcasecmp(text.c_str(), "auto") == 0) return BackendOverride::kAuto;
  if (strcasecmp(text.c_str(), "tcp") == 0) return BackendOverride::kTcp;
  if (strcasecmp(text.c_str(), "shm") == 0) return BackendOverride::kShm;
  MORI_THROW(InvalidArgumentError, "backend override '", text,
             "' is not one of auto, tcp, shm (MORI_IO_BACKEND or IOEngineConfig.backend)");
}

BackendChoice ChooseBackend(const BackendChoiceInput& in) {
  if (in.override_choice == BackendOverride::kTcp) {
    return {BackendType::kTcp, "TCP forced (MORI_IO_BACKEND / IOEngineConfig.backend)"};
  }
  // Where neither same-host path applies: RDMA when both engines have it, else TCP;
  // the reason says why the same-host path did not.
  const bool rdma = in.local_rdma && in.remote_rdma;
  const char* lead = in.override_choice == BackendOverride::kShm
                         ? (rdma ? "SHM forced but not usable, RDMA instead: "
                                 : "SHM forced but not usable, TCP instead: ")
                         : (rdma ? "RDMA: " : "TCP: ");
  auto other = [&](const std::string& why) {
    return BackendChoice{rdma ? BackendType::kRdma : BackendType::kTcp, lead + why};
  };
  const bool gpu_both =
      in.local_loc == MemoryLocationType::GPU && in.remote_loc == MemoryLocationType::GPU;
  if (!gpu_both &&
      (in.local_loc != MemoryLocationType::CPU || in.remote_loc != MemoryLocationType::CPU)) {
    return other("GPU memory on one side only (P2P needs GPU memory on both, SHM host memory)");
  }
  if (in.remote_host_id.empty()) return other("the remote engine's host identity is unknown");
  if (in.local_host_id != in.remote_host_id) {
    return other("different hosts (or pid namespaces): '" + in.local_host_id + "' vs '" +
                 in.remote_host_id + "'");
  }
  if (gpu_both) {
    if (!in.local_p2p) return other("this engine has no P2P backend");
    if (!in.remote_p2p) return other("the remote engine has no P2P backend");
    return {BackendType::kP2P, "same host, GPU memory on both sides (CUDA IPC)"};
  }
  if (!in.local_shm) return other("this engine has no SHM backend");
  if (!in.remote_shm) return other("the remote engine has no SHM backend");
  if (!in.cma_ok) return other("CMA not permitted: " + in.cma_reason);
  std::string reason = in.override_choice == BackendOverride::kShm ? "SHM forced; SHM: " : "SHM: ";
  switch (in.shm_path) {
    case ShmPath::kMapped:
      reason +=
          "mapped memcpy (the target region lies in the target's shared host memory, a memfd "
          "mapped into this process)";
      break;
    case ShmPath::kCma:
      reason += "CMA process_vm_readv/writev (same host, host memory on both sides; " +
                (in.shm_path_why.empty() ? std::string("the target region is not mapped here")
                                         : in.shm_path_why) +
                ")";
      break;
    case ShmPath::kUndecided:
      reason +=
          "same host, host memory on both sides, CMA permitted (per region: mapped memcpy "
          "where the target region lies in its shared host memory, else CMA)";
      break;
  }
  return {BackendType::kShm, reason};
}

std::string LocalHostIdentity() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string boot_id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot_id);
  struct stat st{};
  unsigned long long ns = ::stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
  return std::string(name) + "/" + boot_id + "/pidns:" + std::to_string(ns);
}

}  // namespace mori::io
