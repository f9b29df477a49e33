// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <pybind11/pybind11.h>

namespace mori::python {

// One binding file per area; module.cpp only calls these.
void register_errors(pybind11::module_& m);
void register_env(pybind11::module_& m);
void register_timeouts(pybind11::module_& m);
void register_logging(pybind11::module_& m);
void register_bootstrap(pybind11::module_& m);
void register_topology(pybind11::module_& m);
void register_shmem(pybind11::module_& m);
void register_shmem_diag(pybind11::module_& m);
void register_proxy(pybind11::module_& m);

}  // namespace mori::python
