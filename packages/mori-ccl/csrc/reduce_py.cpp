// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Bindings of the host reduction (pointers are integers: tensor.data_ptr()).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "reduce.hpp"

namespace py = pybind11;

namespace mori::ccl {

void register_reduce(py::module_& m) {
  m.def(
      "reduce_sum_cpu",
      [](const std::string& dtype, uintptr_t dst, const std::vector<uintptr_t>& srcs,
         size_t count) {
        std::vector<const void*> ptrs;
        ptrs.reserve(srcs.size());
        for (uintptr_t p : srcs) ptrs.push_back(reinterpret_cast<const void*>(p));
        py::gil_scoped_release release;
        ReduceSumCpu(ParseDataType(dtype), reinterpret_cast<void*>(dst), ptrs.data(),
                     static_cast<int>(ptrs.size()), count);
      },
      py::arg("dtype"), py::arg("dst"), py::arg("srcs"), py::arg("count"),
      R"doc(dst[i] = sum_s srcs[s][i] over host pointers; floating types accumulate in fp32
(fp64 for float64) and round once.)doc");
}

}  // namespace mori::ccl
