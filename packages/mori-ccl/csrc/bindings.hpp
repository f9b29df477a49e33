// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// One register_<area> per binding file; module.cpp only calls them.

#include <pybind11/pybind11.h>

namespace mori::ccl {

void register_reduce(pybind11::module_& m);
void register_collectives(pybind11::module_& m);

}  // namespace mori::ccl
