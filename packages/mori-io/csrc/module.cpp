// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>

#include "baseline_py.hpp"
#include "engine/backend_probe.hpp"
#include "engine_py.hpp"
#include "mori/python/extension.hpp"
#include "p2p/p2p_backend.hpp"
#include "shared_host_py.hpp"
#include "wire/wire_protocol.hpp"
#if MORI_IO_TESTING
#include "testing/testing_py.hpp"
#endif

namespace py = pybind11;

namespace mori::io {
void RegisterRdma(py::module_& m);  // rdma_py.cpp
}  // namespace mori::io

PYBIND11_MODULE(_C, m) {
  m.doc() = "mori.io native bindings";
  mori::python::InitExtension(m, "mori.io._C");

  py::enum_<mori::io::BackendType>(m, "BackendType",
                                   "Transfer backends: MORI's names and numbers, and SHM.")
      .value("Unknown", mori::io::BackendType::kUnknown)
      .value("P2P", mori::io::BackendType::kP2P)
      .value("RDMA", mori::io::BackendType::kRdma)
      .value("TCP", mori::io::BackendType::kTcp)
      .value("FABRIC", mori::io::BackendType::kFabric)
      .value("SHM", mori::io::BackendType::kShm);
  // MORI's name for its same-host GPU backend (AMD's XGMI link): the same member.
  m.attr("BackendType").attr("XGMI") = m.attr("BackendType").attr("P2P");
  // The control protocol's version (raw-protocol tests speak it).
  m.attr("wire_version") = mori::io::wire::kVersion;

  m.def(
      "probe_backend",
      [](mori::io::BackendType type) {
        mori::io::BackendAvailability a = mori::io::ProbeBackend(type);
        return py::make_tuple(a.available, a.reason);
      },
      py::arg("backend"),
      R"doc(Return (available, reason): whether ``backend`` can run on this machine.)doc");

  m.def(
      "cuda_ipc_handle",
      [](uintptr_t addr, int device) {
        return py::bytes(mori::io::P2pBackend::LegacyIpcHandle(addr, device));
      },
      py::arg("addr"), py::arg("device"),
      R"doc(The 64-byte cudaIpcMemHandle_t of the legacy-IPC-capable allocation holding GPU
address ``addr`` on ``device`` (MORI's MemoryDesc.ipc_handle); b"" for cuMem memory, host
memory or a build without CUDA.)doc");

  mori::io::register_engine(m);
  mori::io::register_baseline(m);
  mori::io::register_shared_host(m);
  mori::io::RegisterRdma(m);
#if MORI_IO_TESTING
  mori::io::testing::register_testing(m);
#endif
}
