// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "p2p/p2p_backend.hpp"

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/str.hpp"

#if MORI_IO_WITH_CUDA
#include <cuda.h>  // driver API types only: its functions come from DriverEntryPoint
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "mori/core/cuda.hpp"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/telemetry.hpp"
#include "p2p/p2p_kernels.hpp"
#include "samehost/shared_host.hpp"
#endif

namespace mori::io {

#if !MORI_IO_WITH_CUDA

std::string P2pBackend::Unavailable() { return "mori-io was built without CUDA"; }
struct P2pBackend::Impl {};
P2pBackend::P2pBackend(const P2pBackendConfig& config) : config_(config) {
  MORI_THROW(NotSupportedError, "P2P backend: ", Unavailable());
}
P2pBackend::~P2pBackend() = default;
std::string P2pBackend::Export(uint64_t, uintptr_t, uint64_t, int) {
  MORI_THROW(NotSupportedError, "P2P backend: ", Unavailable());
}
void P2pBackend::Forget(uint64_t) {}
std::string P2pBackend::LegacyIpcHandle(uintptr_t, int) { return {}; }
std::shared_ptr<P2pMapping> P2pBackend::Import(const P2pExport&, int) {
  MORI_THROW(NotSupportedError, "P2P backend: ", Unavailable());
}
void P2pBackend::Submit(bool, int, char*, std::shared_ptr<P2pMapping>, const P2pSpan*, size_t,
                        P2pDone done) {
  done(StatusDetail::ERR_BAD_STATE, "P2P backend: " + Unavailable());
}

#else

namespace {

// Driver API, resolved once (CUDA 12.0 ABI signatures).
struct Driver {
  CUresult (*GetErrorName)(CUresult, const char**);
  CUresult (*PointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr);
  CUresult (*MemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle*, void*);
  CUresult (*MemGetAllocationPropertiesFromHandle)(CUmemAllocationProp*,
                                                   CUmemGenericAllocationHandle);
  CUresult (*MemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                         CUmemAllocationHandleType, unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*,
                                           CUmemAllocationHandleType);
  CUresult (*MemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
};

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d{};
    cuda::ResolveDriver(d.GetErrorName, "cuGetErrorName");
    cuda::ResolveDriver(d.PointerGetAttribute, "cuPointerGetAttribute");
    cuda::ResolveDriver(d.MemGetAddressRange, "cuMemGetAddressRange");
    cuda::ResolveDriver(d.MemRetainAllocationHandle, "cuMemRetainAllocationHandle");
    cuda::ResolveDriver(d.MemGetAllocationPropertiesFromHandle,
                        "cuMemGetAllocationPropertiesFromHandle");
    cuda::ResolveDriver(d.MemExportToShareableHandle, "cuMemExportToShareableHandle");
    cuda::ResolveDriver(d.MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    cuda::ResolveDriver(d.MemAddressReserve, "cuMemAddressReserve");
    cuda::ResolveDriver(d.MemAddressFree, "cuMemAddressFree");
    cuda::ResolveDriver(d.MemMap, "cuMemMap");
    cuda::ResolveDriver(d.MemUnmap, "cuMemUnmap");
    cuda::ResolveDriver(d.MemSetAccess, "cuMemSetAccess");
    cuda::ResolveDriver(d.MemRelease, "cuMemRelease");
    return d;
  }();
  return driver;
}

void CheckCu(CUresult r, const char* call) {
  if (MORI_LIKELY(r == CUDA_SUCCESS)) return;
  const char* name = "?";
  GetDriver().GetErrorName(r, &name);
  MORI_THROW(CudaError, call, " failed: ", name, " (CUresult ", int(r), ")");
}

#define P2P_CU(call) CheckCu((call), #call)

// Makes `device` current for the scope with its primary context bound to this thread:
// the driver calls below need a current context, which a thread that only ever ran
// cudaGetDevice (a reactor, the completion thread) does not have.
class BoundDevice {
 public:
  explicit BoundDevice(int device) : scope_(device) { MORI_CUDA_CHECK(cudaSetDevice(device)); }

 private:
  cuda::ScopedDevice scope_;
};

// Pinned, device-mapped descriptor buffers, reused by power-of-two capacity.
class DescPool {
 public:
  struct Buf {
    P2pCopyDesc* p;
    uint32_t cap;
  };
  Buf Get(uint32_t n) {
    uint32_t cap = 64;
    while (cap < n) cap <<= 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& fl = free_[cap];
      if (!fl.empty()) {
        Buf b = fl.back();
        fl.pop_back();
        return b;
      }
    }
    void* p = nullptr;
    MORI_CUDA_CHECK(cudaHostAlloc(&p, size_t{cap} * sizeof(P2pCopyDesc),
                                  cudaHostAllocPortable | cudaHostAllocMapped));
    return {static_cast<P2pCopyDesc*>(p), cap};
  }
  void Put(Buf b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[b.cap].push_back(b);
  }
  ~DescPool() {
    for (auto& [cap, fl] : free_) {
      for (Buf& b : fl) (void)cudaFreeHost(b.p);
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint32_t, std::vector<Buf> > free_;
};

struct DeviceRes {
  std::vector<cudaStream_t> streams;
  std::atomic<uint32_t> next{0};
  std::mutex event_mu;
  std::vector<cudaEvent_t> events;  // free
};

struct Inflight {
  int device;
  cudaEvent_t event;
  DescPool::Buf descs;  // p == nullptr: none
  std::shared_ptr<P2pMapping> remote;
  P2pDone done;
  uint64_t issued_ns = 0;  // telemetry only: when the copy and its event were issued
};

}  // namespace

struct P2pBackend::Impl {
  int device_count = 0;
  std::vector<std::array<uint8_t, 16> > uuids;
  std::vector<std::unique_ptr<DeviceRes> > res;  // created lazily per device
  std::mutex res_mu;
  DescPool descs;

  std::mutex export_mu;
  struct Exported {
    std::string packed;
    std::vector<int> fds;
  };
  std::unordered_map<uint64_t, Exported> exports;

  std::mutex q_mu;
  std::condition_variable q_cv;
  std::vector<Inflight> queue;      // submitted, not yet taken by the completion thread
  std::atomic<uint64_t> queued{0};  // pushes so far: the idle spin watches it lock-free
  bool sleeping = false;            // the completion thread waits on q_cv (under q_mu)
  bool stop = false;
  std::thread poller;

  DeviceRes& Res(int device, int num_streams) {
    std::lock_guard<std::mutex> lock(res_mu);
    auto& r = res[static_cast<size_t>(device)];
    if (!r) {
      auto nr = std::make_unique<DeviceRes>();
      cuda::ScopedDevice scope(device);
      for (int i = 0; i < num_streams; ++i) {
        cudaStream_t s;
        MORI_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        nr->streams.push_back(s);
      }
      r = std::move(nr);
    }
    return *r;
  }

  cudaEvent_t Event(DeviceRes& r) {
    {
      std::lock_guard<std::mutex> lock(r.event_mu);
      if (!r.events.empty()) {
        cudaEvent_t e = r.events.back();
        r.events.pop_back();
        return e;
      }
    }
    cudaEvent_t e;
    MORI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  void Finish(Inflight& f, StatusDetail code, std::string message) {
    {
      DeviceRes& r = *res[static_cast<size_t>(f.device)];
      std::lock_guard<std::mutex> lock(r.event_mu);
      r.events.push_back(f.event);
    }
    if (f.descs.p != nullptr) descs.Put(f.descs);
    f.remote.reset();
    P2pDone done = std::move(f.done);
    done(code, std::move(message));
  }

  // Polls the events of submitted copies; spins (yielding) while any is outstanding
  // and for kIdleSpin after the last, so back-to-back transfers find it awake (no
  // futex wake-up on their path); sleeps after that.
  void Poll() {
    static constexpr auto kIdleSpin = std::chrono::microseconds(200);
    std::vector<Inflight> active;
    std::vector<Inflight> incoming;
    uint64_t seen = 0;
    for (;;) {
      if (active.empty()) {
        auto until = std::chrono::steady_clock::now() + kIdleSpin;
        while (queued.load(std::memory_order_acquire) == seen &&
               std::chrono::steady_clock::now() < until) {
          std::this_thread::yield();
        }
      }
      {
        std::unique_lock<std::mutex> lock(q_mu);
        if (active.empty() && queue.empty() && !stop) {
          sleeping = true;
          q_cv.wait(lock, [&] { return stop || !queue.empty(); });
          sleeping = false;
        }
        if (stop && active.empty() && queue.empty()) return;
        incoming.swap(queue);
        seen = queued.load(std::memory_order_relaxed);
      }
      for (Inflight& f : incoming) active.push_back(std::move(f));
      incoming.clear();
      size_t kept = 0;
      bool progressed = false;
      for (size_t i = 0; i < active.size(); ++i) {
        cudaError_t e = cudaEventQuery(active[i].event);
        if (e == cudaErrorNotReady) {
          if (kept != i) active[kept] = std::move(active[i]);
          ++kept;
          continue;
        }
        progressed = true;
        if (MORI_UNLIKELY(active[i].issued_ns != 0)) {
          // Issue to noticed: the copy itself plus this thread's detection delay.
          static telemetry::TimerSite site{log::Module::kIo, "io.p2p.issue_to_seen"};
          telemetry::Record(site, telemetry::NowNs() - active[i].issued_ns);
        }
        if (e == cudaSuccess) {
          Finish(active[i], StatusDetail::SUCCESS, {});
        } else {
          (void)cudaGetLastError();
          Finish(active[i], StatusDetail::ERR_GPU_OP,
                 StrCat("P2P copy failed on GPU ", active[i].device, ": ", cudaGetErrorName(e),
                        " (", cudaGetErrorString(e), ")"));
        }
      }
      active.resize(kept);
      if (!progressed) std::this_thread::yield();
    }
  }
};

std::string P2pBackend::Unavailable() {
  int n = cuda::DeviceCount();
  if (n > 0) return {};
  std::string why = cuda::UnavailableReason();
  return why.empty() ? std::string("no CUDA device is visible") : why;
}

P2pBackend::P2pBackend(const P2pBackendConfig& config) : config_(config) {
  MORI_CHECK_ARG(config.num_streams >= 1 && config.num_streams <= 64,
                 "P2P backend: num_streams=", config.num_streams, " (1..64)");
  MORI_CHECK_ARG(config.max_blocks >= 1 && config.max_blocks <= 1024,
                 "P2P backend: max_blocks=", config.max_blocks, " (1..1024)");
  MORI_CHECK_ARG(config.kernel_min_spans >= 1,
                 "P2P backend: kernel_min_spans=", config.kernel_min_spans, " (>= 1)");
  std::string why = Unavailable();
  if (!why.empty()) MORI_THROW(NotSupportedError, "P2P backend: ", why);
  impl_ = std::make_unique<Impl>();
  MORI_CUDA_CHECK(cudaGetDeviceCount(&impl_->device_count));
  impl_->res.resize(static_cast<size_t>(impl_->device_count));
  for (int d = 0; d < impl_->device_count; ++d) {
    cudaDeviceProp prop{};
    MORI_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    std::array<uint8_t, 16> u{};
    std::memcpy(u.data(), prop.uuid.bytes, 16);
    impl_->uuids.push_back(u);
  }
  (void)GetDriver();
  impl_->poller = std::thread([this] { impl_->Poll(); });
}

P2pBackend::~P2pBackend() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->q_mu);
    impl_->stop = true;
  }
  impl_->q_cv.notify_all();
  impl_->poller.join();  // waits for submitted copies: their memory is in use until then
  for (auto& [id, ex] : impl_->exports) {
    for (int fd : ex.fds) ::close(fd);
  }
  for (auto& r : impl_->res) {
    if (!r) continue;
    for (cudaStream_t s : r->streams) (void)cudaStreamDestroy(s);
    for (cudaEvent_t e : r->events) (void)cudaEventDestroy(e);
  }
}

std::string P2pBackend::LegacyIpcHandle(uintptr_t addr, int device) {
  int count = 0;
  if (addr == 0 || device < 0 || cudaGetDeviceCount(&count) != cudaSuccess || device >= count) {
    (void)cudaGetLastError();
    return {};
  }
  BoundDevice scope(device);
  const Driver& d = GetDriver();
  int legacy = 0;
  if (d.PointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                            static_cast<CUdeviceptr>(addr)) != CUDA_SUCCESS ||
      legacy == 0) {
    return {};
  }
  CUdeviceptr base = 0;
  size_t alloc = 0;
  P2P_CU(d.MemGetAddressRange(&base, &alloc, static_cast<CUdeviceptr>(addr)));
  cudaIpcMemHandle_t h;
  MORI_CUDA_CHECK(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

std::string P2pBackend::Export(uint64_t region_id, uintptr_t addr, uint64_t size, int device) {
  {
    std::lock_guard<std::mutex> lock(impl_->export_mu);
    auto it = impl_->exports.find(region_id);
    if (it != impl_->exports.end()) return it->second.packed;
  }
  MORI_CHECK_ARG(device >= 0 && device < impl_->device_count, "P2P export of memory ", region_id,
                 ": device ", device, " is not a visible GPU (", impl_->device_count, " visible)");
  BoundDevice scope(device);
  const Driver& d = GetDriver();
  P2pExport e;
  e.pid = static_cast<int32_t>(::getpid());
  std::memcpy(e.gpu_uuid, impl_->uuids[static_cast<size_t>(device)].data(), 16);
  e.region_addr = addr;
  e.region_size = size;
  int legacy = 0;
  P2P_CU(d.PointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                               static_cast<CUdeviceptr>(addr)));
  Impl::Exported ex;
  if (legacy != 0) {
    CUdeviceptr base = 0;
    size_t alloc = 0;
    P2P_CU(d.MemGetAddressRange(&base, &alloc, static_cast<CUdeviceptr>(addr)));
    if (addr + size > base + alloc) {
      MORI_THROW(InvalidArgumentError, "P2P export of memory ", region_id, ": [0x", std::hex, addr,
                 ", +", std::dec, size, ") extends past its allocation of ", alloc, " bytes");
    }
    cudaIpcMemHandle_t h;
    MORI_CUDA_CHECK(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
    static_assert(sizeof(h) == sizeof(e.ipc_handle), "cudaIpcMemHandle_t size");
    std::memcpy(e.ipc_handle, &h, sizeof(h));
    e.kind = P2pExport::kLegacyIpc;
    e.region_offset = addr - base;
    e.map_size = alloc;
  } else {
    // cuMem memory (torch's expandable segments, mori's own heaps): one POSIX fd per
    // physical piece covering the region; the importer maps them back to back.
    e.kind = P2pExport::kPosixFd;
    uintptr_t a = addr;
    uintptr_t start = 0;
    try {
      while (a < addr + size || e.pieces.empty()) {
        CUdeviceptr base = 0;
        size_t len = 0;
        P2P_CU(d.MemGetAddressRange(&base, &len, static_cast<CUdeviceptr>(a)));
        if (e.pieces.empty()) start = base;
        if (base != start + e.map_size) {
          MORI_THROW(InvalidArgumentError, "P2P export of memory ", region_id,
                     ": its cuMem pieces are not contiguous at offset ", a - addr);
        }
        CUmemGenericAllocationHandle h;
        P2P_CU(d.MemRetainAllocationHandle(&h, reinterpret_cast<void*>(base)));
        CUmemAllocationProp prop{};
        CUresult pr = d.MemGetAllocationPropertiesFromHandle(&prop, h);
        int fd = -1;
        CUresult er = CUDA_ERROR_NOT_SUPPORTED;
        if (pr == CUDA_SUCCESS &&
            (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
          er = d.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        }
        d.MemRelease(h);
        if (er != CUDA_SUCCESS) {
          MORI_THROW(NotSupportedError, "P2P export of memory ", region_id,
                     ": its cuMem allocation was not created shareable as a POSIX fd "
                     "(requestedHandleTypes=",
                     pr == CUDA_SUCCESS ? int(prop.requestedHandleTypes) : -1,
                     "); allocate it with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
        }
        ex.fds.push_back(fd);
        e.pieces.push_back({fd, e.map_size, len});
        e.map_size += len;
        a = base + len;
      }
    } catch (...) {
      for (int fd : ex.fds) ::close(fd);
      throw;
    }
    e.region_offset = addr - start;
  }
  ex.packed = PackP2pExport(e);
  std::lock_guard<std::mutex> lock(impl_->export_mu);
  auto [it, inserted] = impl_->exports.emplace(region_id, std::move(ex));
  if (!inserted) {
    for (int fd : ex.fds) ::close(fd);  // another thread exported it first
  }
  return it->second.packed;
}

void P2pBackend::Forget(uint64_t region_id) {
  std::lock_guard<std::mutex> lock(impl_->export_mu);
  auto it = impl_->exports.find(region_id);
  if (it == impl_->exports.end()) return;
  for (int fd : it->second.fds) ::close(fd);
  impl_->exports.erase(it);
}

std::shared_ptr<P2pMapping> P2pBackend::Import(const P2pExport& e, int local_device) {
  MORI_CHECK_ARG(local_device >= 0 && local_device < impl_->device_count, "P2P: local device ",
                 local_device, " is not a visible GPU");
  int owner = -1;
  for (int i = 0; i < impl_->device_count; ++i) {
    if (std::memcmp(impl_->uuids[static_cast<size_t>(i)].data(), e.gpu_uuid, 16) == 0) owner = i;
  }
  auto m = std::make_shared<P2pMapping>();
  m->size = e.region_size;
  m->owner_device = owner;
  if (owner >= 0 && owner != local_device) {
    int can = 0;
    MORI_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, local_device, owner));
    if (can == 0) {
      MORI_THROW(NotSupportedError, "P2P: GPU ", local_device, " cannot access GPU ", owner,
                 " (no peer path); use TCP for this pair");
    }
  }
  BoundDevice scope(local_device);
  if (e.pid == static_cast<int32_t>(::getpid())) {
    // Another engine of this process: the region is addressable as it is.
    if (owner >= 0 && owner != local_device) {
      cudaError_t pe = cudaDeviceEnablePeerAccess(owner, 0);
      if (pe == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        MORI_CUDA_CHECK(pe);
      }
    }
    m->region = reinterpret_cast<char*>(e.region_addr);
    return m;
  }
  if (owner < 0) {
    MORI_THROW(NotSupportedError,
               "P2P: the remote region's GPU is not visible to this process "
               "(CUDA_VISIBLE_DEVICES?); use TCP for this pair");
  }
  if (e.kind == P2pExport::kLegacyIpc) {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, e.ipc_handle, sizeof(h));
    void* base = nullptr;
    MORI_CUDA_CHECK(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess));
    m->region = static_cast<char*>(base) + e.region_offset;
    m->kind = P2pExport::kLegacyIpc;
    m->unmap = [base, local_device] {
      cuda::ScopedDevice s(local_device);
      (void)cudaIpcCloseMemHandle(base);
    };
    return m;
  }
  const Driver& d = GetDriver();
  CUdeviceptr va = 0;
  P2P_CU(d.MemAddressReserve(&va, e.map_size, 0, 0, 0));
  size_t mapped = 0;
  auto undo = [&d, va, &e, &mapped] {
    for (size_t i = 0; i < mapped; ++i) d.MemUnmap(va + e.pieces[i].offset, e.pieces[i].size);
    d.MemAddressFree(va, e.map_size);
  };
  try {
    for (const P2pExport::Piece& p : e.pieces) {
      std::string error;
      int fd = PidfdGetFd(e.pid, p.fd, &error);
      if (fd < 0) MORI_THROW(NotSupportedError, "P2P import of a cuMem region: ", error);
      CUmemGenericAllocationHandle h;
      CUresult r =
          d.MemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      ::close(fd);
      CheckCu(r, "cuMemImportFromShareableHandle");
      r = d.MemMap(va + p.offset, p.size, 0, h, 0);
      d.MemRelease(h);  // the mapping holds the allocation from here on
      CheckCu(r, "cuMemMap");
      ++mapped;
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = local_device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    P2P_CU(d.MemSetAccess(va, e.map_size, &access, 1));
  } catch (...) {
    undo();
    throw;
  }
  m->region = reinterpret_cast<char*>(va) + e.region_offset;
  m->kind = P2pExport::kPosixFd;
  std::vector<P2pExport::Piece> pieces = e.pieces;
  uint64_t map_size = e.map_size;
  m->unmap = [va, pieces, map_size, local_device] {
    BoundDevice s(local_device);
    const Driver& drv = GetDriver();
    for (const P2pExport::Piece& p : pieces) drv.MemUnmap(va + p.offset, p.size);
    drv.MemAddressFree(va, map_size);
  };
  return m;
}

void P2pBackend::Submit(bool write, int device, char* local_base,
                        std::shared_ptr<P2pMapping> remote, const P2pSpan* spans, size_t n,
                        P2pDone done) {
  MORI_SCOPED_TIMER(kIo, "io.p2p.submit");
  Inflight f{device, nullptr, {nullptr, 0}, std::move(remote), std::move(done)};
  try {
    DeviceRes& r = impl_->Res(device, config_.num_streams);
    cudaStream_t stream =
        r.streams[r.next.fetch_add(1, std::memory_order_relaxed) % r.streams.size()];
    cuda::ScopedDevice scope(device);
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) total += spans[i].size;
    const bool kernel = n >= static_cast<size_t>(config_.kernel_min_spans) &&
                        total / n <= config_.kernel_max_mean_span;
    char* remote_base = f.remote->region;
    if (kernel) {
      uint64_t pieces = 0;
      for (size_t i = 0; i < n; ++i) pieces += (spans[i].size + kP2pCopyPiece - 1) / kP2pCopyPiece;
      MORI_CHECK_ARG(pieces < (1ull << 31), "P2P: a batch of ", pieces, " copy pieces");
      f.descs = impl_->descs.Get(static_cast<uint32_t>(pieces));
      uint32_t k = 0;
      for (size_t i = 0; i < n; ++i) {
        const P2pSpan& s = spans[i];
        char* l = local_base + s.local_offset;
        char* rm = remote_base + s.remote_offset;
        for (uint64_t off = 0; off < s.size; off += kP2pCopyPiece) {
          uint64_t len = std::min(kP2pCopyPiece, s.size - off);
          P2pCopyDesc& dsc = f.descs.p[k++];
          dsc.src = reinterpret_cast<uint64_t>(write ? l + off : rm + off);
          dsc.dst = reinterpret_cast<uint64_t>(write ? rm + off : l + off);
          dsc.size = len;
        }
      }
      if (k > 0) {
        constexpr uint32_t kWarps = kP2pCopyThreads / 32;
        int blocks =
            static_cast<int>(std::min<uint64_t>(config_.max_blocks, (k + kWarps - 1) / kWarps));
        MORI_CUDA_CHECK(LaunchP2pCopy(f.descs.p, k, blocks, stream));
      }
    } else {
      MORI_SCOPED_TIMER(kIo, "io.p2p.ce_copy_issue");
      for (size_t i = 0; i < n; ++i) {
        const P2pSpan& s = spans[i];
        if (s.size == 0) continue;
        char* l = local_base + s.local_offset;
        char* rm = remote_base + s.remote_offset;
        MORI_CUDA_CHECK(
            cudaMemcpyAsync(write ? rm : l, write ? l : rm, s.size, cudaMemcpyDefault, stream));
      }
    }
    f.event = impl_->Event(r);
    {
      MORI_SCOPED_TIMER(kIo, "io.p2p.event_record");
      MORI_CUDA_CHECK(cudaEventRecord(f.event, stream));
    }
    if (MORI_UNLIKELY(telemetry::Enabled(log::Module::kIo))) f.issued_ns = telemetry::NowNs();
  } catch (const std::exception& ex) {
    if (f.descs.p != nullptr) impl_->descs.Put(f.descs);
    if (f.event != nullptr) {
      DeviceRes& r = *impl_->res[static_cast<size_t>(device)];
      std::lock_guard<std::mutex> lock(r.event_mu);
      r.events.push_back(f.event);
    }
    f.done(StatusDetail::ERR_GPU_OP, StrCat("P2P copy could not be issued: ", ex.what()));
    return;
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lock(impl_->q_mu);
    impl_->queue.push_back(std::move(f));
    impl_->queued.fetch_add(1, std::memory_order_release);
    wake = impl_->sleeping;
  }
  if (wake) impl_->q_cv.notify_one();
}

#endif  // MORI_IO_WITH_CUDA

}  // namespace mori::io
