// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "bindings.hpp"
#include "bootstrap_py.hpp"
#include "dlpack.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/shmem.hpp"

namespace py = pybind11;

namespace mori::python {
namespace {

namespace shm = mori::shmem;

// Owns the shape of an exported tensor and, for tensors made by empty(), the
// symmetric allocation: freed when the consumer drops the tensor, unless the heap
// it came from has been finalized meanwhile (then there is nothing to free).
struct Exported {
  dlpack::ManagedTensor managed{};
  std::vector<int64_t> shape;
  void* owned = nullptr;
  uint64_t generation = 0;
};

// The tensors from empty() that still own their block, by address, so that
// free() of such a tensor (or of its address) hands the block over once: the
// tensor no longer frees it when collected, which would otherwise free whatever
// a later malloc put there.
struct OwnerRegistry {
  std::mutex mu;
  std::unordered_map<void*, Exported*> by_address;
};

OwnerRegistry& Owners() {
  static auto* registry = new OwnerRegistry;  // never destroyed, like the heap state
  return *registry;
}

// Clears `e`'s ownership and returns what it owned (nullptr if nothing).
void* Disown(Exported* e) {
  OwnerRegistry& r = Owners();
  std::lock_guard<std::mutex> lock(r.mu);
  void* owned = e->owned;
  e->owned = nullptr;
  auto it = owned != nullptr ? r.by_address.find(owned) : r.by_address.end();
  if (it != r.by_address.end() && it->second == e) r.by_address.erase(it);
  return owned;
}

// free() of `ptr`: a tensor of this heap that owns the block stops owning it.
void DisownAddress(void* ptr) {
  OwnerRegistry& r = Owners();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_address.find(ptr);
  if (it == r.by_address.end()) return;
  it->second->owned = nullptr;
  r.by_address.erase(it);
}

void DeleteExported(dlpack::ManagedTensor* self) {
  auto* e = static_cast<Exported*>(self->manager_ctx);
  const uint64_t generation = e->generation;
  void* owned = Disown(e);
  if (owned != nullptr && shm::Initialized() && shm::Generation() == generation) {
    try {
      // Free takes the heap lock, which a malloc in another thread may hold while
      // it waits for the GIL inside a Python bootstrap: never wait with the GIL.
      if (Py_IsInitialized() && PyGILState_Check()) {
        py::gil_scoped_release release;
        shm::Free(owned);
      } else {
        shm::Free(owned);
      }
    } catch (const std::exception& ex) {
      MORI_LOG_ERROR(kShmem, "freeing a tensor's symmetric buffer failed: ", ex.what());
    }
  }
  delete e;
}

void CapsuleDestructor(PyObject* capsule) {
  // Only an unconsumed capsule still owns its tensor.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
}

py::capsule ToDlpack(uintptr_t ptr, const std::vector<int64_t>& shape, int code, int bits,
                     bool owner) {
  auto e = std::make_unique<Exported>();
  e->shape = shape;
  shm::HeapInfo info;
  {
    py::gil_scoped_release release;
    info = shm::GetHeapInfo();
  }
  e->managed.dl_tensor.data = reinterpret_cast<void*>(ptr);
  e->managed.dl_tensor.device = info.kind == shm::MemoryKind::kCuda
                                    ? dlpack::Device{dlpack::kCUDA, info.device}
                                    : dlpack::Device{dlpack::kCPU, 0};
  e->managed.dl_tensor.ndim = static_cast<int32_t>(e->shape.size());
  e->managed.dl_tensor.dtype =
      dlpack::DataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  e->managed.dl_tensor.shape = e->shape.data();
  e->managed.dl_tensor.strides = nullptr;  // compact row-major
  e->managed.dl_tensor.byte_offset = 0;
  e->managed.manager_ctx = e.get();
  e->managed.deleter = DeleteExported;
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", CapsuleDestructor);
  if (cap == nullptr) throw py::error_already_set();
  if (owner) {
    OwnerRegistry& r = Owners();
    std::lock_guard<std::mutex> lock(r.mu);
    e->owned = reinterpret_cast<void*>(ptr);
    e->generation = shm::Generation();
    // An entry left from an earlier heap (finalize(force) with live tensors) at
    // this address is stale: its deleter will not free across generations.
    auto& slot = r.by_address[e->owned];
    if (slot != nullptr) slot->owned = nullptr;
    slot = e.get();
  }
  e.release();
  return py::reinterpret_steal<py::capsule>(cap);
}

shm::Cmp ParseCmp(const std::string& name) {
  if (name == "eq") return shm::Cmp::kEq;
  if (name == "ne") return shm::Cmp::kNe;
  if (name == "gt") return shm::Cmp::kGt;
  if (name == "ge") return shm::Cmp::kGe;
  if (name == "lt") return shm::Cmp::kLt;
  if (name == "le") return shm::Cmp::kLe;
  MORI_THROW(InvalidArgumentError, "unknown comparison '", name,
             "' (expected eq, ne, gt, ge, lt, le)");
}

shm::SignalOp ParseOp(const std::string& name) {
  if (name == "set") return shm::SignalOp::kSet;
  if (name == "add") return shm::SignalOp::kAdd;
  MORI_THROW(InvalidArgumentError, "unknown signal op '", name, "' (expected set or add)");
}

void* P(uintptr_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

void register_shmem(py::module_& m) {
  m.def(
      "shmem_init",
      [](py::handle bootstrap, size_t heap_size, int device, const std::string& handle,
         double timeout_s) {
        shm::InitOptions o;
        o.heap_size = heap_size;
        o.device = device;
        o.handle_type = handle.empty() ? shm::HandleType::kAuto : shm::ParseHandleType(handle);
        o.timeout = TimeoutMsFromSeconds(timeout_s, "timeout_s");
        auto native = BootstrapFromPython(bootstrap);
        py::gil_scoped_release release;
        shm::Init(std::move(native), o);
      },
      py::arg("bootstrap"), py::arg("heap_size"), py::arg("device"), py::arg("handle"),
      py::arg("timeout_s"),
      R"doc(Collective: create the symmetric heap (see mori.core.shmem.init).)doc");
  m.def("shmem_parse_size", &shm::ParseSize, py::arg("text"),
        R"doc(Bytes in "512M", "2G", "64K" or a plain number.)doc");
  m.def("shmem_finalize", &shm::Finalize, py::arg("force") = false,
        py::call_guard<py::gil_scoped_release>());
  m.def("shmem_initialized", &shm::Initialized);
  m.def("shmem_my_pe", &shm::MyPe);
  m.def("shmem_n_pes", &shm::NPes);
  m.def("shmem_info", [] {
    shm::HeapInfo h;
    {
      py::gil_scoped_release release;
      h = shm::GetHeapInfo();
    }
    py::dict d;
    d["kind"] = h.kind == shm::MemoryKind::kCuda ? "cuda" : "host";
    d["device"] = h.device;
    d["handle_type"] = shm::HandleTypeName(h.handle_type);
    d["handle_notes"] = h.handle_notes;
    d["heap_size"] = h.heap_size;
    d["used_bytes"] = h.used_bytes;
    d["free_bytes"] = h.free_bytes;
    d["largest_free_block"] = h.largest_free_block;
    d["live_allocations"] = h.live_allocations;
    d["local_pes"] = h.local_pes;
    return d;
  });
  m.def(
      "shmem_malloc",
      [](size_t nbytes, size_t align) {
        return reinterpret_cast<uintptr_t>(shm::Malloc(nbytes, align));
      },
      py::arg("nbytes"), py::arg("align"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "shmem_free",
      [](uintptr_t ptr) {
        DisownAddress(P(ptr));
        shm::Free(P(ptr));
      },
      py::arg("ptr"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "shmem_ptr",
      [](uintptr_t sym, int pe) { return reinterpret_cast<uintptr_t>(shm::Ptr(P(sym), pe)); },
      py::arg("sym"), py::arg("pe"));
  m.def(
      "shmem_is_symmetric",
      [](uintptr_t p, size_t nbytes) { return shm::IsSymmetric(P(p), nbytes); }, py::arg("ptr"),
      py::arg("nbytes") = 1);
  m.def(
      "shmem_put",
      [](uintptr_t dst_sym, uintptr_t src, size_t nbytes, int pe) {
        shm::Put(P(dst_sym), P(src), nbytes, pe);
      },
      py::arg("dst_sym"), py::arg("src"), py::arg("nbytes"), py::arg("pe"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "shmem_get",
      [](uintptr_t dst, uintptr_t src_sym, size_t nbytes, int pe) {
        shm::Get(P(dst), P(src_sym), nbytes, pe);
      },
      py::arg("dst"), py::arg("src_sym"), py::arg("nbytes"), py::arg("pe"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "shmem_signal",
      [](uintptr_t sig, uint64_t value, int pe, const std::string& op) {
        shm::SignalOp o = ParseOp(op);
        py::gil_scoped_release release;
        shm::Signal(static_cast<uint64_t*>(P(sig)), value, pe, o);
      },
      py::arg("sig_sym"), py::arg("value"), py::arg("pe"), py::arg("op"));
  m.def(
      "shmem_wait_until",
      [](uintptr_t sig, const std::string& cmp, uint64_t value, double timeout_s) {
        shm::Cmp c = ParseCmp(cmp);
        const auto timeout = TimeoutMsFromSeconds(timeout_s, "timeout_s");
        py::gil_scoped_release release;
        return shm::WaitUntil(static_cast<uint64_t*>(P(sig)), c, value, timeout);
      },
      py::arg("sig_sym"), py::arg("cmp"), py::arg("value"), py::arg("timeout_s"));
  m.def("shmem_barrier_all", &shm::BarrierAll, py::call_guard<py::gil_scoped_release>());
  m.def("shmem_barrier_on_stream", &shm::BarrierOnStream, py::arg("stream"),
        py::call_guard<py::gil_scoped_release>());
  m.def("shmem_dlpack", &ToDlpack, py::arg("ptr"), py::arg("shape"), py::arg("code"),
        py::arg("bits"), py::arg("owner"),
        R"doc(A "dltensor" capsule viewing ``ptr`` (compact row-major) on the heap's device.
With ``owner`` the capsule's tensor frees the symmetric allocation when dropped.)doc");
}

}  // namespace mori::python
