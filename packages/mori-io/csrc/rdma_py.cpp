// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// Python bindings of the RDMA backend that mori.io uses: the probe and the native
// config (mori.io.rdma builds it). The only RDMA file of the API that knows pybind11;
// the hardware-independent internals tests drive are bound in
// testing/rdma_hooks_py.cpp, in test builds only.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "mori/transport/verbs/qp_attributes.hpp"
#include "rdma/rdma_backend.hpp"

namespace py = pybind11;

namespace mori::io {

void RegisterRdma(py::module_& m) {
  using namespace rdma;  // NOLINT: one binding file for the whole area

  m.def(
      "rdma_probe",
      [] {
        RdmaProbe p = ProbeRdma();
        return py::make_tuple(p.available, p.reason, p.devices);
      },
      R"doc(Return (available, reason, devices): whether the RDMA backend can run here
(built with the ibverbs headers, libibverbs or MORI_IO_IBVERBS_LIB loads with every
symbol, at least one device), why (not), and the device names libibverbs lists.)doc");

  // How this extension was built for RDMA (CMakeLists.txt: compiled in, or compiled out
  // and why); ci/check_dist.py looks for the compiled-in sentence in a wheel.
  m.attr("rdma_build") = MORI_IO_RDMA_BUILD;

  py::module_ r = m.def_submodule("rdma", "The RDMA backend's native config");
  py::class_<QpConfig>(r, "QpConfig", "Per-QP settings (IB spec units).")
      .def(py::init<>())
      .def_readwrite("port_num", &QpConfig::port_num)
      .def_readwrite("pkey_index", &QpConfig::pkey_index)
      .def_readwrite("timeout", &QpConfig::timeout)
      .def_readwrite("retry_cnt", &QpConfig::retry_cnt)
      .def_readwrite("rnr_retry", &QpConfig::rnr_retry)
      .def_readwrite("min_rnr_timer", &QpConfig::min_rnr_timer)
      .def_readwrite("max_rd_atomic", &QpConfig::max_rd_atomic)
      .def_readwrite("max_dest_rd_atomic", &QpConfig::max_dest_rd_atomic)
      .def_readwrite("max_path_mtu", &QpConfig::max_path_mtu)
      .def_readwrite("service_level", &QpConfig::service_level)
      .def_readwrite("traffic_class", &QpConfig::traffic_class)
      .def_readwrite("hop_limit", &QpConfig::hop_limit)
      .def_readwrite("force_grh", &QpConfig::force_grh);

  py::enum_<PollCqMode>(r, "PollCqMode")
      .value("POLLING", PollCqMode::kPolling)
      .value("EVENT", PollCqMode::kEvent);

  py::class_<RdmaBackendConfig>(r, "BackendConfig", "The native RdmaBackendConfig.")
      .def(py::init<>())
      .def_readwrite("qp_per_transfer", &RdmaBackendConfig::qp_per_transfer)
      .def_readwrite("post_batch_size", &RdmaBackendConfig::post_batch_size)
      .def_readwrite("num_worker_threads", &RdmaBackendConfig::num_worker_threads)
      .def_readwrite("poll_cq_mode", &RdmaBackendConfig::poll_cq_mode)
      .def_readwrite("enable_notification", &RdmaBackendConfig::enable_notification)
      .def_readwrite("device_name", &RdmaBackendConfig::device_name)
      .def_readwrite("port", &RdmaBackendConfig::port)
      .def_readwrite("gid_index", &RdmaBackendConfig::gid_index)
      .def_readwrite("gpu_index", &RdmaBackendConfig::gpu_index)
      .def_readwrite("qp", &RdmaBackendConfig::qp)
      .def_readwrite("max_send_wr", &RdmaBackendConfig::max_send_wr)
      .def_readwrite("max_recv_wr", &RdmaBackendConfig::max_recv_wr)
      .def_readwrite("max_sge", &RdmaBackendConfig::max_sge)
      .def_readwrite("max_message_bytes", &RdmaBackendConfig::max_message_bytes)
      .def_readwrite("signal_interval", &RdmaBackendConfig::signal_interval)
      .def_readwrite("cq_depth", &RdmaBackendConfig::cq_depth)
      .def("validate", &ValidateRdmaBackendConfig);

  r.def("mtu_enum_from_bytes", &MtuEnumFromBytes, py::arg("bytes"));
}

}  // namespace mori::io
