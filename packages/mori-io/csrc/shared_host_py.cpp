// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// Python binding of shared host memory: SharedHostBuffer, the one type that
// allocate_shared_host_memory returns whatever else is installed.
#include "shared_host_py.hpp"

#include <cstring>
#include <memory>
#include <string>

#include "mori/core/error.hpp"
#include "mori/core/str.hpp"
#include "samehost/shared_host.hpp"

namespace py = pybind11;

namespace mori::io {
namespace {

// One memfd allocation; freed when the last buffer viewing it (and so the last
// memoryview, numpy array or tensor made from one) goes.
struct SharedHostAllocation {
  SharedHostBlock block;
  explicit SharedHostAllocation(uint64_t size) : block(AllocateSharedHost(size)) {}
  SharedHostAllocation(const SharedHostAllocation&) = delete;
  SharedHostAllocation& operator=(const SharedHostAllocation&) = delete;
  ~SharedHostAllocation() { FreeSharedHost(block.addr); }
};

// A contiguous byte range of an allocation: the whole of it, or a slice of another
// buffer (sharing the allocation, so registering a slice registers memory inside
// the shared block, which peers then map).
struct SharedHostBuffer {
  std::shared_ptr<SharedHostAllocation> alloc;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint8_t* data() const { return reinterpret_cast<uint8_t*>(alloc->block.addr + offset); }
  uintptr_t address() const { return alloc->block.addr + offset; }
};

uint64_t Index(const SharedHostBuffer& b, py::ssize_t i) {
  const auto n = static_cast<py::ssize_t>(b.size);
  if (i < -n || i >= n) {
    throw py::index_error(StrCat("SharedHostBuffer index ", i, " out of range for ", n, " bytes"));
  }
  return static_cast<uint64_t>(i < 0 ? i + n : i);
}

// [start, start + length) of a step-1 slice; other steps would not be one range.
std::pair<uint64_t, uint64_t> Range(const SharedHostBuffer& b, const py::slice& s) {
  size_t start = 0, stop = 0, step = 0, length = 0;
  if (!s.compute(b.size, &start, &stop, &step, &length)) throw py::error_already_set();
  MORI_CHECK_ARG(step == 1, "SharedHostBuffer slice step ", static_cast<py::ssize_t>(step),
                 ": only contiguous (step 1) slices view shared memory");
  return {start, length};
}

}  // namespace

void register_shared_host(py::module_& m) {
  m.def("numa_node_of", &NumaNodeOf, py::arg("addr"),
        "NUMA node of the host page at addr (-1 if unknown); MemoryDesc.numa_node.");
  py::class_<SharedHostBuffer>(m, "SharedHostBuffer", py::buffer_protocol(), R"doc(
Host memory in a memfd that same-host mori-io peers can map (allocate_shared_host_memory).
A 1-D, writable, C-contiguous run of uint8 bytes: the buffer protocol and
``__array_interface__`` give zero-copy views (memoryview, numpy.asarray / frombuffer,
torch.frombuffer), each of which keeps the memory mapped. ``len``, indexing, step-1
slicing (a SharedHostBuffer viewing the same memory) and slice assignment from any
contiguous buffer of the slice's byte length work as for a memoryview.)doc")
      .def(py::init([](uint64_t size) {
             SharedHostBuffer b;
             b.alloc = std::make_shared<SharedHostAllocation>(size);
             b.size = size;
             return b;
           }),
           py::arg("size"), "Allocate ``size`` bytes (zeroed).")
      .def_property_readonly("address", &SharedHostBuffer::address,
                             "Address of the first byte (for register_memory).")
      .def_property_readonly(
          "size", [](const SharedHostBuffer& b) { return b.size; }, "Bytes (= nbytes).")
      .def_property_readonly(
          "nbytes", [](const SharedHostBuffer& b) { return b.size; }, "Bytes.")
      .def_property_readonly(
          "offset", [](const SharedHostBuffer& b) { return b.offset; },
          "Bytes from the start of the allocation (0 unless a slice).")
      .def("__len__", [](const SharedHostBuffer& b) { return b.size; })
      .def_buffer([](SharedHostBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size)}, {py::ssize_t{1}});
      })
      .def_property_readonly(
          "__array_interface__",
          [](const SharedHostBuffer& b) {
            py::dict d;
            d["shape"] = py::make_tuple(b.size);
            d["typestr"] = "|u1";
            d["data"] = py::make_tuple(b.address(), false);
            d["strides"] = py::none();
            d["version"] = 3;
            return d;
          },
          "numpy's array interface: 1-D uint8, writable (np.asarray keeps this alive).")
      .def("__getitem__",
           [](const SharedHostBuffer& b, const py::slice& s) {
             auto [start, length] = Range(b, s);
             return SharedHostBuffer{b.alloc, b.offset + start, length};
           })
      .def("__getitem__",
           [](const SharedHostBuffer& b, py::ssize_t i) { return int(b.data()[Index(b, i)]); })
      .def("__setitem__",
           [](SharedHostBuffer& b, py::ssize_t i, int value) {
             MORI_CHECK_ARG(value >= 0 && value <= 255, "SharedHostBuffer[", i, "] = ", value,
                            ": a byte is in [0, 255]");
             b.data()[Index(b, i)] = static_cast<uint8_t>(value);
           })
      .def("__setitem__",
           [](SharedHostBuffer& b, const py::slice& s, const py::buffer& src) {
             auto [start, length] = Range(b, s);
             Py_buffer view;
             if (PyObject_GetBuffer(src.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
               throw py::error_already_set();
             }
             const auto n = static_cast<uint64_t>(view.len);
             if (n != length) {
               PyBuffer_Release(&view);
               MORI_THROW(InvalidArgumentError, "SharedHostBuffer slice of ", length,
                          " bytes assigned ", n, " bytes (lengths must match)");
             }
             std::memmove(b.data() + start, view.buf, n);  // the source may overlap
             PyBuffer_Release(&view);
           })
      .def(
          "fill",
          [](SharedHostBuffer& b, int value) {
            MORI_CHECK_ARG(value >= 0 && value <= 255, "SharedHostBuffer.fill(", value,
                           "): a byte is in [0, 255]");
            std::memset(b.data(), value, b.size);
          },
          py::arg("value"), "Set every byte to ``value`` (0..255).")
      .def("__repr__", [](const SharedHostBuffer& b) {
        return StrCat("SharedHostBuffer(nbytes=", b.size, ", offset=", b.offset, " of a block of ",
                      b.alloc->block.size, ")");
      });
}

}  // namespace mori::io
