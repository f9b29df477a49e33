// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <string>
#include <vector>

#include "mori/topology/topology.hpp"

namespace mori::topology::detail {

struct GpuDiscovery {
  std::vector<Gpu> gpus;
  std::vector<std::vector<GpuLink>> links;
  std::string unavailable_reason;  // why gpus is empty
  std::string link_source;         // "nvml" or "cuda"
  std::string nvml_status;         // why NVML was not used
};

// CUDA devices through the CUDA runtime, their NVLinks through NVML, their NUMA
// nodes through sysfs. Never throws for an absent or failing driver: what could
// not be read is logged and left at its default.
GpuDiscovery DiscoverGpus(const std::string& sysfs_root);

}  // namespace mori::topology::detail
