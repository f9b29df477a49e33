// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "topology/gpu.hpp"

#include "mori/core/cuda.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/version.hpp"
#include "topology/sysfs.hpp"

#if MORI_CORE_WITH_CUDA
#include <cuda.h>  // driver API types only: its functions come from DriverEntryPoint
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#endif

namespace mori::topology::detail {

#if MORI_CORE_WITH_CUDA
namespace {

// ---------------------------------------------------------------------------
// NVML, loaded with dlopen: linking it would make libmori_core unloadable on
// machines without the NVIDIA driver. The toolkit image ships no nvml.h, so the
// few pieces of its ABI used here are declared to match nvml.h (r535 and later).

using NvmlReturn = int;  // nvmlReturn_t
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlNvLinkMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (Hopper, Blackwell)
constexpr int kNvmlFeatureEnabled = 1;        // NVML_FEATURE_ENABLED
constexpr int kNvmlNvLinkDeviceGpu = 0x00;    // nvmlIntNvLinkDeviceType_t values
constexpr int kNvmlNvLinkDeviceIbmNpu = 0x01;
constexpr int kNvmlNvLinkDeviceSwitch = 0x02;

// nvmlPciInfo_t.
struct NvmlPciInfo {
  char bus_id_legacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
};
static_assert(sizeof(NvmlPciInfo) == 68, "nvmlPciInfo_t layout");

struct NvmlApi {
  NvmlReturn (*init)();  // nvmlInit_v2
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*handle_by_pci_bus_id)(const char*, NvmlDevice*);              // _v2
  NvmlReturn (*nvlink_state)(NvmlDevice, unsigned, int*);                    // nvmlEnableState_t*
  NvmlReturn (*nvlink_remote_pci_info)(NvmlDevice, unsigned, NvmlPciInfo*);  // _v2
  // Absent from drivers older than r450; then the far end is classified by bus id.
  NvmlReturn (*nvlink_remote_device_type)(NvmlDevice, unsigned, int*);
};

struct NvmlLoad {
  NvmlApi api{};
  bool ok = false;
  std::string error;
};

// Loaded once and never unloaded: NVML may keep threads, and other libraries in
// the process (torch, NCCL) hold their own references anyway.
const NvmlLoad& LoadNvml() {
  static const NvmlLoad load = [] {
    NvmlLoad l;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      l.error = StrCat("dlopen(libnvidia-ml.so.1) failed: ", why ? why : "unknown error");
      return l;
    }
    auto sym = [&](const char* name, auto* fn) {
      *reinterpret_cast<void**>(fn) = dlsym(lib, name);
      if (*reinterpret_cast<void**>(fn) == nullptr && l.error.empty()) {
        l.error = StrCat("libnvidia-ml.so.1 lacks ", name);
      }
    };
    sym("nvmlInit_v2", &l.api.init);
    sym("nvmlShutdown", &l.api.shutdown);
    sym("nvmlErrorString", &l.api.error_string);
    sym("nvmlDeviceGetHandleByPciBusId_v2", &l.api.handle_by_pci_bus_id);
    sym("nvmlDeviceGetNvLinkState", &l.api.nvlink_state);
    sym("nvmlDeviceGetNvLinkRemotePciInfo_v2", &l.api.nvlink_remote_pci_info);
    l.ok = l.error.empty();
    l.api.nvlink_remote_device_type = reinterpret_cast<NvmlReturn (*)(NvmlDevice, unsigned, int*)>(
        dlsym(lib, "nvmlDeviceGetNvLinkRemoteDeviceType"));
    return l;
  }();
  return load;
}

std::string NvmlErrorText(const NvmlApi& api, NvmlReturn rc) {
  const char* text = api.error_string ? api.error_string(rc) : nullptr;
  return StrCat(text ? text : "unknown error", " (", rc, ")");
}

// The bus id NVML reports for a link's far end, normalized.
std::string RemoteBusId(const NvmlPciInfo& pci) {
  const bool v2 = pci.bus_id[0] != '\0';
  const char* text = v2 ? pci.bus_id : pci.bus_id_legacy;
  try {
    return NormalizePciBusId(
        std::string(text, strnlen(text, v2 ? sizeof(pci.bus_id) : sizeof(pci.bus_id_legacy))));
  } catch (const Error&) {
    // The numeric fields lack the function number; NVLink peers are function 0.
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.0", pci.domain, pci.bus, pci.device);
    return buf;
  }
}

// NVLink counts per GPU pair, or nullopt with `status` saying why NVML could not
// answer. nvmlInit_v2/nvmlShutdown are reference counted, so this coexists with
// other NVML users in the process.
std::optional<NvLinkCounts> QueryNvLinks(const std::vector<Gpu>& gpus, std::string* status) {
  const NvmlLoad& load = LoadNvml();
  if (!load.ok) {
    *status = load.error;
    return std::nullopt;
  }
  const NvmlApi& api = load.api;
  NvmlReturn rc = api.init();
  if (rc != kNvmlSuccess) {
    *status = StrCat("nvmlInit_v2 failed: ", NvmlErrorText(api, rc));
    return std::nullopt;
  }
  struct Shutdown {
    const NvmlApi& api;
    ~Shutdown() { api.shutdown(); }
  } shutdown{api};

  const size_t n = gpus.size();
  std::vector<NvmlDevice> handles(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    rc = api.handle_by_pci_bus_id(gpus[i].pci_bus_id.c_str(), &handles[i]);
    if (rc != kNvmlSuccess) {
      *status = StrCat("nvmlDeviceGetHandleByPciBusId_v2(", gpus[i].pci_bus_id,
                       ") failed: ", NvmlErrorText(api, rc));
      return std::nullopt;
    }
  }

  NvLinkCounts counts;
  counts.direct.assign(n, std::vector<int>(n, 0));
  counts.switch_links.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int to_unseen_gpus = 0;
    for (unsigned link = 0; link < kNvmlNvLinkMaxLinks; ++link) {
      int state = 0;
      // Links past the device's count answer NOT_SUPPORTED or INVALID_ARGUMENT.
      if (api.nvlink_state(handles[i], link, &state) != kNvmlSuccess ||
          state != kNvmlFeatureEnabled) {
        continue;
      }
      NvmlPciInfo pci{};
      rc = api.nvlink_remote_pci_info(handles[i], link, &pci);
      if (rc != kNvmlSuccess) {
        MORI_LOG_DEBUG(kCore, "topology: GPU ", i, " NVLink ", link,
                       ": nvmlDeviceGetNvLinkRemotePciInfo_v2 failed: ", NvmlErrorText(api, rc));
        continue;
      }
      int type = -1;
      if (api.nvlink_remote_device_type != nullptr &&
          api.nvlink_remote_device_type(handles[i], link, &type) != kNvmlSuccess) {
        type = -1;
      }
      if (type == kNvmlNvLinkDeviceSwitch) {
        ++counts.switch_links[i];
        continue;
      }
      if (type == kNvmlNvLinkDeviceIbmNpu) continue;  // a CPU link, not a GPU path
      const std::string remote = RemoteBusId(pci);
      auto peer = std::find_if(gpus.begin(), gpus.end(),
                               [&](const Gpu& g) { return g.pci_bus_id == remote; });
      if (peer != gpus.end()) {
        ++counts.direct[i][peer - gpus.begin()];
      } else if (type == kNvmlNvLinkDeviceGpu) {
        ++to_unseen_gpus;  // a GPU hidden by CUDA_VISIBLE_DEVICES
      } else {
        // Without a device type, a far end that is no visible GPU is taken for an
        // NVSwitch, as NCCL does on old drivers.
        ++counts.switch_links[i];
      }
    }
    MORI_LOG_DEBUG(kCore, "topology: GPU ", i, " (", gpus[i].pci_bus_id,
                   "): ", counts.switch_links[i], " NVLinks to NVSwitches, ", to_unseen_gpus,
                   " to GPUs not visible to CUDA");
  }
  status->clear();
  return counts;
}

bool CudaOk(cudaError_t err, const char* call, int device) {
  if (err == cudaSuccess) return true;
  // Clears the sticky last-error slot so the next call starts clean.
  (void)cudaGetLastError();
  MORI_LOG_WARN(kCore, "topology: ", call, " failed for device ", device, ": ",
                cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  return false;
}

// cuMem shareable-handle support, read with the driver API that only the
// driver-entry-point lookup reaches.
void ReadHandleSupport(std::vector<Gpu>* gpus) {
  using CuDeviceGetFn = CUresult (*)(CUdevice*, int);
  using CuDeviceGetAttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  CuDeviceGetFn device_get = nullptr;
  CuDeviceGetAttributeFn get_attribute = nullptr;
  try {
    device_get = reinterpret_cast<CuDeviceGetFn>(cuda::DriverEntryPoint("cuDeviceGet", 12000));
    get_attribute = reinterpret_cast<CuDeviceGetAttributeFn>(
        cuda::DriverEntryPoint("cuDeviceGetAttribute", 12000));
  } catch (const Error& e) {
    MORI_LOG_WARN(kCore, "topology: cannot read cuMem handle support: ", e.what());
    return;
  }
  for (Gpu& gpu : *gpus) {
    CUdevice dev = 0;
    CUresult rc = device_get(&dev, gpu.index);
    if (rc != CUDA_SUCCESS) {
      MORI_LOG_WARN(kCore, "topology: cuDeviceGet(", gpu.index, ") failed: CUresult ", rc);
      continue;
    }
    int value = 0;
    rc =
        get_attribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
    gpu.posix_fd_handle_supported = rc == CUDA_SUCCESS && value != 0;
    if (rc != CUDA_SUCCESS) {
      MORI_LOG_WARN(kCore, "topology: cuDeviceGetAttribute(POSIX_FD) failed for device ", gpu.index,
                    ": CUresult ", rc);
    }
#if CUDA_VERSION >= 12030
    value = 0;
    rc = get_attribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev);
    gpu.fabric_handle_supported = rc == CUDA_SUCCESS && value != 0;
    // Drivers before 12.3 do not know the attribute; that means "no fabric".
    if (rc != CUDA_SUCCESS) {
      MORI_LOG_DEBUG(kCore, "topology: cuDeviceGetAttribute(FABRIC) failed for device ", gpu.index,
                     ": CUresult ", rc);
    }
#endif
  }
}

Gpu DescribeGpu(int index, const std::string& sysfs_root) {
  Gpu gpu;
  gpu.index = index;
  cudaDeviceProp prop{};
  if (CudaOk(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties", index)) {
    gpu.name = prop.name;
    gpu.compute_capability_major = prop.major;
    gpu.compute_capability_minor = prop.minor;
    gpu.total_memory_bytes = prop.totalGlobalMem;
    gpu.sm_count = prop.multiProcessorCount;
  }
  char bus_id[32] = {};
  if (CudaOk(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index), "cudaDeviceGetPCIBusId",
             index)) {
    try {
      gpu.pci_bus_id = NormalizePciBusId(bus_id);
    } catch (const Error& e) {
      MORI_LOG_WARN(kCore, "topology: device ", index, ": ", e.what());
    }
  }
  if (!gpu.pci_bus_id.empty()) {
    gpu.pci_path = CanonicalPath(JoinPath(sysfs_root, "bus/pci/devices/" + gpu.pci_bus_id));
    if (!gpu.pci_path.empty()) gpu.numa_node = PciNumaNode(gpu.pci_path);
  }
  return gpu;
}

}  // namespace

GpuDiscovery DiscoverGpus(const std::string& sysfs_root) {
  GpuDiscovery out;
  const int n = cuda::DeviceCount();
  if (n == 0) {
    out.unavailable_reason = cuda::UnavailableReason();
    return out;
  }
  for (int i = 0; i < n; ++i) out.gpus.push_back(DescribeGpu(i, sysfs_root));
  ReadHandleSupport(&out.gpus);

  std::vector<std::vector<bool>> p2p(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int can = 0;
      if (CudaOk(cudaDeviceCanAccessPeer(&can, i, j), "cudaDeviceCanAccessPeer", i)) {
        p2p[i][j] = can != 0;
      }
    }
  }

  std::optional<NvLinkCounts> nvlink = QueryNvLinks(out.gpus, &out.nvml_status);
  if (nvlink) {
    out.link_source = "nvml";
  } else {
    out.link_source = "cuda";
    MORI_LOG_DEBUG(kCore, "topology: NVLink counts unavailable, reporting CUDA peer access only: ",
                   out.nvml_status);
  }
  out.links = BuildGpuLinkMatrix(p2p, nvlink ? &*nvlink : nullptr);

  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j || !p2p[i][j]) continue;
      GpuLink& link = out.links[i][j];
      int value = 0;
      if (CudaOk(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrPerformanceRank, i, j),
                 "cudaDeviceGetP2PAttribute(PerformanceRank)", i)) {
        link.performance_rank = value;
      }
      value = 0;
      if (CudaOk(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrNativeAtomicSupported, i, j),
                 "cudaDeviceGetP2PAttribute(NativeAtomicSupported)", i)) {
        link.native_atomics = value != 0;
      }
    }
  }
  return out;
}

#else  // !MORI_CORE_WITH_CUDA

GpuDiscovery DiscoverGpus(const std::string& /*sysfs_root*/) {
  GpuDiscovery out;
  out.unavailable_reason = cuda::UnavailableReason();
  return out;
}

#endif  // MORI_CORE_WITH_CUDA

}  // namespace mori::topology::detail
