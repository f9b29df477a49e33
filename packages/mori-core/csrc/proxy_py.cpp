// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The proxy (mori/proxy/proxy.hpp) for CPU producers: create one over the host heap,
// push commands, quiet, barrier, and the microbenchmark loops. Offsets are byte
// offsets in the symmetric heap (shmem pointer minus the heap base). Every call that
// waits releases the GIL. mori.core.proxy is the documented Python API.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bindings.hpp"
#include "bootstrap_py.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/proxy/bench.hpp"
#include "mori/proxy/proxy.hpp"
#include "mori/shmem/shmem.hpp"

namespace py = pybind11;

namespace mori::python {
namespace {

namespace px = mori::proxy;

px::Command CommandOf(const std::string& op, int pe, uint64_t dst_offset, uint64_t src_offset,
                      uint64_t nbytes, uint64_t signal_offset, uint64_t value) {
  px::Op code;
  if (op == "write") {
    code = px::Op::kWrite;
  } else if (op == "atomic_add") {
    code = px::Op::kAtomicAdd;
  } else if (op == "write_add") {
    code = px::Op::kWriteAdd;
  } else {
    MORI_THROW(InvalidArgumentError, "proxy command op '", op,
               "': expected write, atomic_add or write_add");
  }
  return px::MakeCommand(code, pe, dst_offset, src_offset, nbytes, signal_offset, value);
}

}  // namespace

void register_proxy(py::module_& m) {
  m.def(
      "proxy_heap_offset",
      [](uintptr_t ptr, uint64_t nbytes) {
        auto* p = reinterpret_cast<const char*>(ptr);
        MORI_CHECK_ARG(shmem::IsSymmetric(p, nbytes), "address ", reinterpret_cast<const void*>(p),
                       " (+", nbytes, " bytes) is not in this pe's symmetric heap");
        return static_cast<uint64_t>(p - shmem::GetDeviceContext().my_base);
      },
      py::arg("ptr"), py::arg("nbytes") = 1,
      R"doc(Byte offset of a symmetric address in the heap (the same on every pe).)doc");
  m.def(
      "proxy_mapped_ping_pong",
      [](int device, uint64_t count, double timeout_s) {
        const uint64_t timeout_ns =
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      TimeoutFromSeconds(timeout_s, "timeout_s"))
                                      .count());
        py::gil_scoped_release release;
        return px::MeasureMappedPingPong(device, count, timeout_ns);
      },
      py::arg("device"), py::arg("count"), py::arg("timeout_s") = 60.0,
      R"doc(The nanoseconds of each of `count` round trips of a host-mapped flag between a
kernel thread on `device` and this thread (the PCIe round trip a kernel's push ->
retire stands beside). CUDA builds only.)doc");

  py::class_<px::Proxy>(m, "Proxy", R"doc(A proxy thread over this process's host heap
(see mori.core.proxy.Proxy).)doc")
      .def(py::init([](py::handle bootstrap, int num_queues, uint64_t queue_capacity,
                       const std::string& transport, const std::string& advertise_host,
                       double timeout_s, const std::string& producer) {
             px::ProxyOptions o;
             o.num_queues = num_queues;
             if (producer == "host") {
               o.producer = px::Producer::kHost;
             } else if (producer == "cuda") {
               o.producer = px::Producer::kCuda;
             } else {
               MORI_THROW(InvalidArgumentError, "proxy producer '", producer,
                          "': expected host or cuda");
             }
             o.queue_capacity = queue_capacity;
             if (transport == "auto" || transport.empty()) {
               o.transport = px::TransportChoice::kAuto;
             } else if (transport == "tcp") {
               o.transport = px::TransportChoice::kTcp;
             } else if (transport == "verbs") {
               o.transport = px::TransportChoice::kVerbs;
             } else {
               MORI_THROW(InvalidArgumentError, "proxy transport '", transport,
                          "': expected auto, tcp or verbs");
             }
             o.advertise_host = advertise_host;
             o.timeout = TimeoutMsFromSeconds(timeout_s, "timeout_s");
             auto native = BootstrapFromPython(bootstrap);
             py::gil_scoped_release release;
             return std::make_unique<px::Proxy>(std::move(native), o);
           }),
           py::arg("bootstrap"), py::arg("num_queues") = 1, py::arg("queue_capacity") = 0,
           py::arg("transport") = "auto", py::arg("advertise_host") = "",
           py::arg("timeout_s") = 120.0, py::arg("producer") = "host")
      .def_property_readonly("num_queues", &px::Proxy::num_queues)
      .def_property_readonly("my_pe", &px::Proxy::my_pe)
      .def_property_readonly("n_pes", &px::Proxy::n_pes)
      .def(
          "push",
          [](px::Proxy& p, const std::string& op, int pe, uint64_t dst_offset, uint64_t src_offset,
             uint64_t nbytes, uint64_t signal_offset, uint64_t value, int queue) {
            const px::Command c =
                CommandOf(op, pe, dst_offset, src_offset, nbytes, signal_offset, value);
            const px::QueueView q = p.HostQueue(queue);
            py::gil_scoped_release release;
            return px::Push(q, c);
          },
          py::arg("op"), py::arg("pe"), py::arg("dst_offset") = 0, py::arg("src_offset") = 0,
          py::arg("nbytes") = 0, py::arg("signal_offset") = 0, py::arg("value") = 0,
          py::arg("queue") = 0)
      .def(
          "quiet",
          [](px::Proxy& p, int queue) {
            const px::QueueView q = p.HostQueue(queue);
            py::gil_scoped_release release;
            px::Quiet(q);
          },
          py::arg("queue") = 0)
      .def(
          "barrier",
          [](px::Proxy& p, int queue) {
            const px::QueueView q = p.HostQueue(queue);
            py::gil_scoped_release release;
            px::Barrier(q);
          },
          py::arg("queue") = 0)
      .def(
          "wait_retired",
          [](px::Proxy& p, uint64_t upto, int queue) {
            py::gil_scoped_release release;
            p.WaitRetired(queue, upto);
          },
          py::arg("upto"), py::arg("queue") = 0)
      .def("check_health", &px::Proxy::CheckHealth)
      .def(
          "path_to", [](const px::Proxy& p, int pe) { return px::PathName(p.PathTo(pe)); },
          py::arg("pe"))
      .def("node_of", &px::Proxy::NodeOf, py::arg("pe"))
      .def("stats",
           [](const px::Proxy& p) {
             const px::ProxyStats s = p.Stats();
             py::dict d;
             d["commands"] = s.commands;
             d["bytes_to_pe"] = s.bytes_to_pe;
             py::dict by_path;
             for (int i = 0; i < static_cast<int>(s.bytes_by_path.size()); ++i) {
               by_path[px::PathName(static_cast<px::Path>(i))] = s.bytes_by_path[i];
             }
             d["bytes_by_path"] = by_path;
             d["lane_waits"] = s.lane_waits;
             return d;
           })
      .def("close", &px::Proxy::Close, py::call_guard<py::gil_scoped_release>())
      .def(
          "_measure_throughput",
          [](px::Proxy& p, const std::string& op, int pe, uint64_t dst_offset, uint64_t src_offset,
             uint64_t nbytes, uint64_t signal_offset, uint64_t count, int queue) {
            const px::Command c =
                CommandOf(op, pe, dst_offset, src_offset, nbytes, signal_offset, 1);
            const px::QueueView q = p.HostQueue(queue);
            px::ThroughputResult r;
            {
              py::gil_scoped_release release;
              r = px::MeasureThroughput(q, c, count);
            }
            return py::make_tuple(r.commands, r.seconds);
          },
          py::arg("op"), py::arg("pe"), py::arg("dst_offset"), py::arg("src_offset"),
          py::arg("nbytes"), py::arg("signal_offset"), py::arg("count"), py::arg("queue") = 0)
      .def(
          "_measure_latency",
          [](px::Proxy& p, const std::string& op, int pe, uint64_t dst_offset, uint64_t src_offset,
             uint64_t nbytes, uint64_t signal_offset, uint64_t count, int queue) {
            const px::Command c =
                CommandOf(op, pe, dst_offset, src_offset, nbytes, signal_offset, 1);
            const px::QueueView q = p.HostQueue(queue);
            std::vector<uint64_t> ns;
            {
              py::gil_scoped_release release;
              ns = px::MeasureLatency(q, c, count);
            }
            return ns;
          },
          py::arg("op"), py::arg("pe"), py::arg("dst_offset"), py::arg("src_offset"),
          py::arg("nbytes"), py::arg("signal_offset"), py::arg("count"), py::arg("queue") = 0)
      .def(
          "_device_push",
          [](px::Proxy& p, const std::string& op, int pe, uint64_t dst_offset, uint64_t src_offset,
             uint64_t nbytes, uint64_t signal_offset, uint64_t value, uint64_t per_block,
             int blocks, bool quiet, uintptr_t stream, int queue) {
            const px::Command c =
                CommandOf(op, pe, dst_offset, src_offset, nbytes, signal_offset, value);
            const px::QueueView q = p.DeviceQueue(queue);
            px::LaunchDevicePush(q, c, per_block, blocks, quiet, stream);
          },
          py::arg("op"), py::arg("pe"), py::arg("dst_offset"), py::arg("src_offset"),
          py::arg("nbytes"), py::arg("signal_offset"), py::arg("value"), py::arg("per_block"),
          py::arg("blocks"), py::arg("quiet"), py::arg("stream"), py::arg("queue") = 0,
          R"doc(Kernel producer: `blocks` blocks, thread 0 of each pushing `per_block`
copies of the command (then device Quiet if `quiet`); asynchronous on `stream`.)doc")
      .def(
          "_device_push_latency",
          [](px::Proxy& p, const std::string& op, int pe, uint64_t dst_offset, uint64_t src_offset,
             uint64_t nbytes, uint64_t signal_offset, uint64_t count, uintptr_t out_ns,
             uintptr_t stream, int queue) {
            const px::Command c =
                CommandOf(op, pe, dst_offset, src_offset, nbytes, signal_offset, 1);
            const px::QueueView q = p.DeviceQueue(queue);
            px::LaunchDevicePushLatency(q, c, count, reinterpret_cast<uint64_t*>(out_ns), stream);
          },
          py::arg("op"), py::arg("pe"), py::arg("dst_offset"), py::arg("src_offset"),
          py::arg("nbytes"), py::arg("signal_offset"), py::arg("count"), py::arg("out_ns"),
          py::arg("stream"), py::arg("queue") = 0,
          R"doc(Kernel producer: one thread pushes `count` commands one at a time, each
waited for until retired; out_ns (device uint64 array) gets each round trip's ns.)doc");
}

}  // namespace mori::python
