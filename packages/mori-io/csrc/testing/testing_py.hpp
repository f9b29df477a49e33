// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// mori.io._C._testing: what only tests use, compiled only into test builds
// (MORI_IO_TESTING=ON, which `nox -s tests` sets; no wheel carries it). Nothing outside
// csrc/testing/ includes these headers except module.cpp, under #if MORI_IO_TESTING.

#include <pybind11/pybind11.h>

namespace mori::io::testing {

// Adds the _testing submodule to `m` and installs the test builds' doubles and fault
// switches (the RDMA loopback double, the CMA refusal).
void register_testing(pybind11::module_& m);

// Its parts (engine_hooks_py.cpp, rdma_hooks_py.cpp).
void register_engine_hooks(pybind11::module_& t);
void register_rdma_hooks(pybind11::module_& t);

}  // namespace mori::io::testing
