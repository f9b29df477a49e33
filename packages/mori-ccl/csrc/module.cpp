// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "mori/python/extension.hpp"
#include "reduce.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "mori.ccl native bindings (tensors cross as pointer + size + device)";
  mori::python::InitExtension(m, "mori.ccl._C");

  m.def(
      "reduce_sum_cpu",
      [](const std::string& dtype, uintptr_t dst, const std::vector<uintptr_t>& srcs,
         size_t count) {
        std::vector<const void*> ptrs;
        ptrs.reserve(srcs.size());
        for (uintptr_t p : srcs) ptrs.push_back(reinterpret_cast<const void*>(p));
        py::gil_scoped_release release;
        mori::ccl::ReduceSumCpu(mori::ccl::ParseDataType(dtype), reinterpret_cast<void*>(dst),
                                ptrs.data(), static_cast<int>(ptrs.size()), count);
      },
      py::arg("dtype"), py::arg("dst"), py::arg("srcs"), py::arg("count"),
      R"doc(dst[i] = sum_s srcs[s][i] over host pointers; floating types accumulate in fp32
(fp64 for float64) and round once.)doc");
}
