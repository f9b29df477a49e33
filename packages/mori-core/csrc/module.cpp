// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "mori/python/extension.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "mori.core native bindings (libmori_core)";
  mori::python::InitExtension(m, "mori.core._C");
  mori::python::register_errors(m);
  mori::python::register_env(m);
  mori::python::register_timeouts(m);
  mori::python::register_logging(m);
  mori::python::register_bootstrap(m);
  mori::python::register_topology(m);
  mori::python::register_shmem(m);
  mori::python::register_shmem_diag(m);
  mori::python::register_proxy(m);
}
