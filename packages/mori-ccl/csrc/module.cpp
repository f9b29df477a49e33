// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "mori/python/extension.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "mori.ccl native bindings (tensors cross as pointer + size + device)";
  mori::python::InitExtension(m, "mori.ccl._C");
#if MORI_CCL_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  mori::ccl::register_reduce(m);
  mori::ccl::register_collectives(m);
}
