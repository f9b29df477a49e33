// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// CUDA heap backend: this pe's heap is one cuMemCreate'd allocation exported as a
// fabric handle or a POSIX fd; every local pe's allocation is imported and mapped
// into one reserved VA range (local index i at base + i * stride), readable and
// writable by this pe's GPU. Driver calls go through DriverEntryPoint (nothing
// links libcuda); cudart (static) is used directly.
#include "mori/core/env.hpp"
#include "mori/core/version.hpp"
#include "shmem/heap_backend.hpp"

#if MORI_CORE_WITH_CUDA

#include <cuda.h>  // driver API types only: its functions come from DriverEntryPoint
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mori/core/cuda.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/str.hpp"
#include "mori/core/timeout.hpp"
#include "shmem/shmem_kernels.hpp"

namespace mori::shmem::internal {
namespace {

// Driver API, resolved once. The signatures are those of the CUDA 12.0 ABI that
// DriverEntryPoint is asked for.
struct Driver {
  CUresult (*GetErrorName)(CUresult, const char**);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*MemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                          CUmemAllocationGranularity_flags);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                        unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                         CUmemAllocationHandleType, unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*,
                                           CUmemAllocationHandleType);
  CUresult (*MemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
};

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d{};
    cuda::ResolveDriver(d.GetErrorName, "cuGetErrorName");
    cuda::ResolveDriver(d.DeviceGet, "cuDeviceGet");
    cuda::ResolveDriver(d.DeviceGetAttribute, "cuDeviceGetAttribute");
    cuda::ResolveDriver(d.MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    cuda::ResolveDriver(d.MemCreate, "cuMemCreate");
    cuda::ResolveDriver(d.MemRelease, "cuMemRelease");
    cuda::ResolveDriver(d.MemExportToShareableHandle, "cuMemExportToShareableHandle");
    cuda::ResolveDriver(d.MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    cuda::ResolveDriver(d.MemAddressReserve, "cuMemAddressReserve");
    cuda::ResolveDriver(d.MemAddressFree, "cuMemAddressFree");
    cuda::ResolveDriver(d.MemMap, "cuMemMap");
    cuda::ResolveDriver(d.MemUnmap, "cuMemUnmap");
    cuda::ResolveDriver(d.MemSetAccess, "cuMemSetAccess");
    return d;
  }();
  return driver;
}

std::string CuName(CUresult r) {
  const char* name = nullptr;
  if (GetDriver().GetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) {
    return StrCat("CUresult ", static_cast<int>(r));
  }
  return name;
}

// Throws CudaError naming the driver call, its arguments and the error's name.
template <typename... Args>
void CheckCu(CUresult r, const char* call, const Args&... details) {
  if (MORI_UNLIKELY(r != CUDA_SUCCESS)) {
    MORI_THROW(CudaError, call, " failed: ", CuName(r), details...);
  }
}

// Logs instead of throwing (teardown paths).
template <typename... Args>
void LogCu(CUresult r, const char* call, const Args&... details) {
  if (r != CUDA_SUCCESS) {
    MORI_LOG_ERROR(kShmem, call, " failed during release: ", CuName(r), details...);
  }
}

void LogCudart(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    MORI_LOG_ERROR(kShmem, call, " failed during release: ", cudaGetErrorName(err), " (",
                   cudaGetErrorString(err), ")");
    (void)cudaGetLastError();
  }
}

#if CUDA_VERSION >= 12030
constexpr bool kHaveFabric = true;
constexpr CUmemAllocationHandleType kFabricType = CU_MEM_HANDLE_TYPE_FABRIC;
constexpr size_t kFabricHandleBytes = sizeof(CUmemFabricHandle);
#else
constexpr bool kHaveFabric = false;
constexpr CUmemAllocationHandleType kFabricType = static_cast<CUmemAllocationHandleType>(0x8);
constexpr size_t kFabricHandleBytes = 64;
#endif

CUmemAllocationHandleType ToCu(HandleType type) {
  return type == HandleType::kFabric ? kFabricType : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

// What each pe tells the others after its local probe.
struct ProbeResult {
  int32_t handle_type;  // HandleType that worked here, or -1
  int32_t pad;
  uint64_t alloc_size;  // heap size rounded to this device's granularity
};
static_assert(sizeof(ProbeResult) == 16, "ProbeResult is exchanged as bytes");

class CudaBackend final : public HeapBackend {
 public:
  CudaBackend(bootstrap::Bootstrap& bootstrap, const LocalGroup& group,
              const BackendOptions& options)
      : group_(group), options_(options), n_pes_(bootstrap.WorldSize()) {
    try {
      Setup(bootstrap);
    } catch (...) {
      Teardown();
      throw;
    }
  }

  ~CudaBackend() override {
    if (!released_) Teardown();
  }

  MemoryKind kind() const override { return MemoryKind::kCuda; }
  char* base(int pe) const override {
    if (pe < 0 || pe >= n_pes_) return nullptr;
    const int idx = group_.local_index_of[pe];
    return idx < 0 ? nullptr : reinterpret_cast<char*>(va_) + static_cast<size_t>(idx) * stride_;
  }
  size_t size() const override { return options_.heap_size; }
  HandleType handle_type() const override { return type_; }
  std::string handle_notes() const override { return notes_; }
  // Pinned host memory mapped into the device (same address under UVA): readable
  // by shmem.cpp's host code and by any kernel.
  char* const* peer_bases_for_kernels() const override { return peer_bases_dev_; }

  void Copy(void* dst, const void* src, size_t nbytes) override {
    if (nbytes == 0) return;
    ScopedDevice guard(options_.device);
    // A private non-blocking stream: the copy neither waits for nor is waited on
    // by the user's streams (a kernel of theirs may be spinning on our signal).
    MORI_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_));
    MORI_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void SignalWord(uint64_t* addr, uint64_t value, SignalOp op) override {
    ScopedDevice guard(options_.device);
    // Every earlier Copy of this process has completed (each synchronizes), so
    // the word is written after the data it publishes.
    if (op == SignalOp::kSet) {
      *host_word_ = value;
      MORI_CUDA_CHECK(
          cudaMemcpyAsync(addr, host_word_, sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
    } else {
      LaunchSignalAdd(addr, value, stream_);
    }
    MORI_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  uint64_t LoadWord(const uint64_t* addr) override {
    ScopedDevice guard(options_.device);
    MORI_CUDA_CHECK(
        cudaMemcpyAsync(host_word_, addr, sizeof(uint64_t), cudaMemcpyDeviceToHost, stream_));
    MORI_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return *host_word_;
  }

  void BarrierOnStream(const DeviceContext& ctx, uintptr_t stream) override {
    // No allocation and no synchronization here: this may be under graph capture.
    ScopedDevice guard(options_.device);
    const uint64_t timeout_ns = KernelTimeoutNs(options_.timeout, "shmem timeout");
    LaunchBarrierOnStream(ctx, reinterpret_cast<cudaStream_t>(stream), timeout_ns);
  }

  void Release() override {
    if (released_) return;
    Teardown();
  }

 private:
  void Setup(bootstrap::Bootstrap& bootstrap) {
    MORI_CUDA_CHECK(cudaSetDevice(options_.device));
    MORI_CUDA_CHECK(cudaFree(nullptr));  // the primary context is current for the driver calls
    const Driver& drv = GetDriver();
    CheckCu(drv.DeviceGet(&cu_device_, options_.device), "cuDeviceGet", " (ordinal ",
            options_.device, ")");

    const HandleType requested = ResolveRequested();
    std::vector<HandleType> attempts;
    if (requested == HandleType::kAuto) {
      attempts = {HandleType::kFabric, HandleType::kPosixFd};
    } else {
      attempts = {requested};
    }
    HandleType mine = ProbeLocally(attempts);

    // Collective agreement: every pe must use the same handle type and size.
    auto results = GatherProbe(bootstrap, mine);
    HandleType agreed = mine;
    std::string failed_pes;
    bool mixed = false;
    for (int pe = 0; pe < n_pes_; ++pe) {
      if (results[pe].handle_type < 0)
        failed_pes += StrCat(failed_pes.empty() ? "" : ", ", pe);
      else if (static_cast<HandleType>(results[pe].handle_type) != agreed)
        mixed = true;
    }
    if (failed_pes.empty() && mixed && requested == HandleType::kAuto) {
      // Some pe could not use fabric handles: POSIX fds everywhere.
      if (mine != HandleType::kPosixFd) {
        ReleaseOwnAllocation();
        notes_ += "; fabric: usable here but not on every pe, falling back to posix_fd";
        mine = ProbeLocally({HandleType::kPosixFd});
      }
      results = GatherProbe(bootstrap, mine);
      failed_pes.clear();
      mixed = false;
      for (int pe = 0; pe < n_pes_; ++pe) {
        if (results[pe].handle_type < 0)
          failed_pes += StrCat(failed_pes.empty() ? "" : ", ", pe);
        else if (static_cast<HandleType>(results[pe].handle_type) != HandleType::kPosixFd) {
          mixed = true;
        }
      }
    }
    if (!failed_pes.empty()) {
      MORI_THROW(CudaError, "CUDA symmetric heap: no usable ", HandleTypeName(requested),
                 " handle on pe(s) ", failed_pes, " (device ", options_.device,
                 " here); attempts on this pe: ", notes_.empty() ? "none" : notes_);
    }
    if (mixed) {
      MORI_THROW(CudaError, "CUDA symmetric heap: pes chose different handle types with ",
                 HandleTypeName(requested), " requested; attempts here: ", notes_);
    }
    type_ = mine;
    for (int pe = 0; pe < n_pes_; ++pe) {
      if (results[pe].alloc_size != alloc_size_) {
        MORI_THROW(InternalError, "CUDA symmetric heap: pe ", pe, " allocated ",
                   results[pe].alloc_size, " bytes but this pe ", alloc_size_,
                   " (allocation granularities differ)");
      }
    }
    stride_ = alloc_size_;
    MORI_LOG_INFO(kShmem, "CUDA heap on device ", options_.device, ": ", alloc_size_,
                  " bytes per pe, ", HandleTypeName(type_), " handles, ", group_.local_pes.size(),
                  " local pe(s); attempts: ", notes_);

    ImportPeers(bootstrap);
    MapAll();

    std::vector<char*> bases(n_pes_);
    for (int pe = 0; pe < n_pes_; ++pe) bases[pe] = base(pe);
    MORI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&peer_bases_dev_), sizeof(char*) * n_pes_));
    MORI_CUDA_CHECK(
        cudaMemcpy(peer_bases_dev_, bases.data(), sizeof(char*) * n_pes_, cudaMemcpyHostToDevice));
    MORI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MORI_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_word_), sizeof(uint64_t)));
    // The heap starts zeroed (signals and barrier counters rely on it).
    MORI_CUDA_CHECK(cudaMemset(base(group_.local_pes[group_.my_local_index]), 0, alloc_size_));
    MORI_CUDA_CHECK(cudaDeviceSynchronize());
    // The signal kernel's first launch loads it (CUDA's lazy module loading), which may
    // synchronize the context: done here, so that a host signal (or barrier_all) later
    // never waits for a user kernel that itself waits for that signal. Adds 0.
    LaunchSignalAdd(reinterpret_cast<uint64_t*>(base(group_.local_pes[group_.my_local_index])), 0,
                    stream_);
    MORI_CUDA_CHECK(cudaStreamSynchronize(stream_));
    // No pe touches another's heap before every heap is zeroed.
    bootstrap.Barrier();
  }

  HandleType ResolveRequested() const {
    if (options_.handle_type != HandleType::kAuto) return options_.handle_type;
    const auto name = env::Get("MORI_SHMEM_HANDLE");
    return name ? ParseHandleType(*name) : HandleType::kAuto;
  }

  // Tries each handle type in order: cuMemCreate with it, then an export (a
  // driver may accept the allocation and refuse the export). Keeps the first that
  // works; records every attempt in notes_. Returns the type, or -1 if none.
  HandleType ProbeLocally(const std::vector<HandleType>& attempts) {
    const Driver& drv = GetDriver();
    for (HandleType type : attempts) {
      const char* name = HandleTypeName(type);
      auto note = [&](const std::string& what) {
        notes_ += StrCat(notes_.empty() ? "" : "; ", name, ": ", what);
      };
      if (type == HandleType::kFabric) {
        if (!kHaveFabric) {
          note("not available in the CUDA headers libmori_core was built with (< 12.3)");
          continue;
        }
        int supported = 0;
        CUresult r = drv.DeviceGetAttribute(
            &supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, cu_device_);
        if (r != CUDA_SUCCESS || !supported) {
          note(r != CUDA_SUCCESS
                   ? StrCat("cuDeviceGetAttribute(FABRIC_SUPPORTED) returned ", CuName(r))
                   : "device attribute HANDLE_TYPE_FABRIC_SUPPORTED is 0");
          continue;
        }
      }
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = cu_device_;
      prop.requestedHandleTypes = ToCu(type);
      size_t granularity = 0;
      CUresult r = drv.MemGetAllocationGranularity(&granularity, &prop,
                                                   CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      if (r != CUDA_SUCCESS || granularity == 0) {
        note(StrCat("cuMemGetAllocationGranularity returned ", CuName(r)));
        continue;
      }
      const size_t size = RoundUp(options_.heap_size, granularity);
      CUmemGenericAllocationHandle handle = 0;
      r = drv.MemCreate(&handle, size, &prop, 0);
      if (r != CUDA_SUCCESS) {
        note(StrCat("cuMemCreate(", size, " bytes) returned ", CuName(r)));
        continue;
      }
      // Export once to prove the handle type is usable; keep the result.
      if (type == HandleType::kFabric) {
        r = drv.MemExportToShareableHandle(fabric_handle_, handle, ToCu(type), 0);
      } else {
        int fd = -1;
        r = drv.MemExportToShareableHandle(&fd, handle, ToCu(type), 0);
        if (r == CUDA_SUCCESS) own_fd_ = fd;
      }
      if (r != CUDA_SUCCESS) {
        note(StrCat("cuMemExportToShareableHandle returned ", CuName(r)));
        LogCu(drv.MemRelease(handle), "cuMemRelease", " (probe allocation)");
        continue;
      }
      note("ok");
      own_handle_ = handle;
      have_own_handle_ = true;
      alloc_size_ = size;
      granularity_ = granularity;
      return type;
    }
    return static_cast<HandleType>(-1);
  }

  void ReleaseOwnAllocation() {
    if (own_fd_ >= 0) {
      ::close(own_fd_);
      own_fd_ = -1;
    }
    if (have_own_handle_) {
      CheckCu(GetDriver().MemRelease(own_handle_), "cuMemRelease", " (own allocation)");
      have_own_handle_ = false;
    }
  }

  std::vector<ProbeResult> GatherProbe(bootstrap::Bootstrap& bootstrap, HandleType mine) {
    ProbeResult me{};
    me.handle_type = static_cast<int>(mine) >= 0 ? static_cast<int32_t>(mine) : -1;
    me.alloc_size = me.handle_type >= 0 ? alloc_size_ : 0;
    std::vector<ProbeResult> all(n_pes_);
    bootstrap.AllGather(&me, sizeof(me), all.data());
    return all;
  }

  void ImportPeers(bootstrap::Bootstrap& bootstrap) {
    const Driver& drv = GetDriver();
    const int local_n = static_cast<int>(group_.local_pes.size());
    handles_.assign(local_n, 0);
    imported_.assign(local_n, false);
    handles_[group_.my_local_index] = own_handle_;
    if (type_ == HandleType::kFabric) {
      std::vector<uint8_t> all(kFabricHandleBytes * n_pes_);
      bootstrap.AllGather(fabric_handle_, kFabricHandleBytes, all.data());
      for (int i = 0; i < local_n; ++i) {
        if (i == group_.my_local_index) continue;
        const int pe = group_.local_pes[i];
        CheckCu(drv.MemImportFromShareableHandle(&handles_[i], all.data() + kFabricHandleBytes * pe,
                                                 kFabricType),
                "cuMemImportFromShareableHandle", " (fabric handle of pe ", pe, ")");
        imported_[i] = true;
      }
    } else {
      std::vector<int> fds = ExchangeFds(bootstrap, group_, own_fd_, options_.timeout);
      ::close(own_fd_);
      own_fd_ = -1;
      std::string error;
      for (int i = 0; i < local_n; ++i) {
        const int fd = i < static_cast<int>(fds.size()) ? fds[i] : -1;
        if (i != group_.my_local_index && error.empty()) {
          const int pe = group_.local_pes[i];
          CUresult r = fd < 0
                           ? CUDA_ERROR_INVALID_HANDLE
                           : drv.MemImportFromShareableHandle(
                                 &handles_[i], reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
          if (r != CUDA_SUCCESS) {
            error = StrCat("cuMemImportFromShareableHandle (posix fd ", fd, " of pe ", pe,
                           ") failed: ", CuName(r));
          } else {
            imported_[i] = true;
          }
        }
        if (fd >= 0) ::close(fd);  // the imported handle keeps the memory alive
      }
      if (!error.empty()) MORI_THROW(CudaError, error);
    }
  }

  void MapAll() {
    const Driver& drv = GetDriver();
    const int local_n = static_cast<int>(group_.local_pes.size());
    size_t total = 0;
    if (__builtin_mul_overflow(stride_, static_cast<size_t>(local_n), &total)) {
      MORI_THROW(InvalidArgumentError, "CUDA heap of ", stride_, " bytes x ", local_n,
                 " pes on this node overflows the address range to reserve");
    }
    CheckCu(drv.MemAddressReserve(&va_, total, granularity_, 0, 0), "cuMemAddressReserve", " (",
            total, " bytes)");
    reserved_ = total;
    mapped_.assign(local_n, false);
    for (int i = 0; i < local_n; ++i) {
      CheckCu(drv.MemMap(va_ + stride_ * i, stride_, 0, handles_[i], 0), "cuMemMap", " (pe ",
              group_.local_pes[i], ", ", stride_, " bytes at offset ", stride_ * i, ")");
      mapped_[i] = true;
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = cu_device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CheckCu(drv.MemSetAccess(va_, total, &access, 1), "cuMemSetAccess", " (", total,
            " bytes, device ", options_.device, ")");
  }

  // Never throws: logs what fails and frees what it can.
  void Teardown() noexcept {
    released_ = true;
    try {
      LogCudart(cudaSetDevice(options_.device), "cudaSetDevice");
      // Nothing of ours may still run on the mappings.
      LogCudart(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      if (stream_ != nullptr) LogCudart(cudaStreamDestroy(stream_), "cudaStreamDestroy");
      stream_ = nullptr;
      if (host_word_ != nullptr) LogCudart(cudaFreeHost(host_word_), "cudaFreeHost");
      host_word_ = nullptr;
      if (peer_bases_dev_ != nullptr) LogCudart(cudaFree(peer_bases_dev_), "cudaFree");
      peer_bases_dev_ = nullptr;
      const Driver& drv = GetDriver();
      for (size_t i = 0; i < mapped_.size(); ++i) {
        if (mapped_[i])
          LogCu(drv.MemUnmap(va_ + stride_ * i, stride_), "cuMemUnmap", " (slot ", i, ")");
      }
      mapped_.clear();
      for (size_t i = 0; i < imported_.size(); ++i) {
        if (imported_[i]) LogCu(drv.MemRelease(handles_[i]), "cuMemRelease", " (pe slot ", i, ")");
      }
      imported_.clear();
      if (have_own_handle_) LogCu(drv.MemRelease(own_handle_), "cuMemRelease", " (own heap)");
      have_own_handle_ = false;
      if (reserved_)
        LogCu(drv.MemAddressFree(va_, reserved_), "cuMemAddressFree", " (", reserved_, " bytes)");
      reserved_ = 0;
      va_ = 0;
    } catch (const std::exception& e) {
      MORI_LOG_ERROR(kShmem, "CUDA heap release: ", e.what());
    } catch (...) {
      MORI_LOG_ERROR(kShmem, "CUDA heap release: unknown exception");
    }
    if (own_fd_ >= 0) ::close(own_fd_);
    own_fd_ = -1;
  }

  LocalGroup group_;
  BackendOptions options_;
  int n_pes_;
  CUdevice cu_device_ = 0;
  HandleType type_ = HandleType::kNone;
  std::string notes_;
  size_t alloc_size_ = 0;
  size_t granularity_ = 0;
  size_t stride_ = 0;
  CUmemGenericAllocationHandle own_handle_ = 0;
  bool have_own_handle_ = false;
  int own_fd_ = -1;
  alignas(8) unsigned char fabric_handle_[kFabricHandleBytes] = {};
  std::vector<CUmemGenericAllocationHandle> handles_;  // per local index
  std::vector<bool> imported_;
  std::vector<bool> mapped_;
  CUdeviceptr va_ = 0;
  size_t reserved_ = 0;
  char** peer_bases_dev_ = nullptr;
  cudaStream_t stream_ = nullptr;
  uint64_t* host_word_ = nullptr;  // pinned
  bool released_ = false;
};

}  // namespace

std::unique_ptr<HeapBackend> CreateCudaBackend(bootstrap::Bootstrap& bootstrap,
                                               const LocalGroup& group,
                                               const BackendOptions& options) {
  const int count = cuda::DeviceCount();
  if (count == 0) {
    MORI_THROW(NotSupportedError, "CUDA symmetric heap requested on device ", options.device,
               " but no CUDA device is usable: ", cuda::UnavailableReason());
  }
  MORI_CHECK_ARG(options.device >= 0 && options.device < count, "CUDA device ", options.device,
                 " out of range [0, ", count, ")");
  return std::make_unique<CudaBackend>(bootstrap, group, options);
}

}  // namespace mori::shmem::internal

#else  // !MORI_CORE_WITH_CUDA

#include "mori/core/error.hpp"
#include "mori/shmem/diag.hpp"

namespace mori::shmem {
namespace internal {

std::unique_ptr<HeapBackend> CreateCudaBackend(bootstrap::Bootstrap&, const LocalGroup&,
                                               const BackendOptions& options) {
  MORI_THROW(NotSupportedError, "CUDA symmetric heap requested on device ", options.device,
             ", but libmori_core was built without CUDA (MORI_CUDA=off or no nvcc)");
}

}  // namespace internal

namespace diag {
namespace {
[[noreturn]] void NoCuda(const char* what) {
  MORI_THROW(NotSupportedError, "shmem ", what,
             " needs CUDA, but libmori_core was built without CUDA (MORI_CUDA=off or no nvcc)");
}
}  // namespace

CopyLaunch ParseScope(const std::string&) { NoCuda("diagnostic kernels"); }
void PutKernel(const DeviceContext&, void*, const void*, size_t, int, const CopyLaunch&) {
  NoCuda("put kernel");
}
void GetKernel(const DeviceContext&, void*, const void*, size_t, int, const CopyLaunch&) {
  NoCuda("get kernel");
}
void SignalStressKernel(const DeviceContext&, const SignalStressArgs&) {
  NoCuda("signal stress kernel");
}
void BarrierLoopKernel(const DeviceContext&, int, uint64_t, uintptr_t) {
  NoCuda("barrier loop kernel");
}
uint64_t GlobalTimerNs(int) { NoCuda("global timer kernel"); }
void TrapProbeKernel(int, uint64_t, uint64_t, int, int, int, uintptr_t) {
  NoCuda("trap probe kernel");
}

}  // namespace diag
}  // namespace mori::shmem

#endif  // MORI_CORE_WITH_CUDA
