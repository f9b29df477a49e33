// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "testing/testing_py.hpp"

#include "testing/cma_refusal.hpp"
#include "testing/loopback_backend.hpp"

namespace py = pybind11;

namespace mori::io::testing {

void register_testing(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", R"doc(Test hooks of a test build
(MORI_IO_TESTING=ON): the engine's and the RDMA backend's pure parts bound for tests,
the RDMA loopback double (MORI_IO_RDMA_LOOPBACK=1) and the CMA fault switch
(MORI_IO_TEST_CMA_REFUSE). No wheel carries them.)doc");
  register_engine_hooks(t);
  register_rdma_hooks(t);
  rdma::InstallLoopbackBackend();
  InstallCmaRefusal();
}

}  // namespace mori::io::testing
