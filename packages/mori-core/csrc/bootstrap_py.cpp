// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "bootstrap_py.hpp"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"

namespace py = pybind11;

namespace mori::python {
namespace {

using bootstrap::Bootstrap;
using bootstrap::TcpBootstrap;
using bootstrap::TcpBootstrapOptions;

class PyObjectBootstrap final : public Bootstrap {
 public:
  explicit PyObjectBootstrap(py::handle obj) : obj_(py::reinterpret_borrow<py::object>(obj)) {
    for (const char* name :
         {"rank", "world_size", "all_gather_fixed", "broadcast_fixed", "barrier"}) {
      if (!py::hasattr(obj_, name)) {
        MORI_THROW(InvalidArgumentError, "bootstrap object of type ",
                   std::string(py::str(py::type::of(obj_).attr("__name__"))), " has no attribute '",
                   name, "'");
      }
    }
    rank_ = obj_.attr("rank").cast<int>();
    world_size_ = obj_.attr("world_size").cast<int>();
  }

  ~PyObjectBootstrap() override {
    if (!Py_IsInitialized()) {
      obj_.release();  // the interpreter is gone: nothing left to decref
      return;
    }
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }

  int Rank() const override { return rank_; }
  int WorldSize() const override { return world_size_; }

  void AllGather(const void* send, size_t nbytes, void* recv) override {
    py::gil_scoped_acquire gil;
    py::bytes out =
        obj_.attr("all_gather_fixed")(py::bytes(static_cast<const char*>(send), nbytes));
    CopyOut(out, recv, nbytes * static_cast<size_t>(world_size_), "all_gather_fixed");
  }

  void Broadcast(void* buf, size_t nbytes, int root) override {
    py::gil_scoped_acquire gil;
    py::bytes out =
        obj_.attr("broadcast_fixed")(py::bytes(static_cast<const char*>(buf), nbytes), root);
    CopyOut(out, buf, nbytes, "broadcast_fixed");
  }

  void Barrier() override {
    py::gil_scoped_acquire gil;
    obj_.attr("barrier")();
  }

 private:
  static void CopyOut(const py::bytes& out, void* dst, size_t expected, const char* what) {
    std::string_view view = out;
    if (view.size() != expected) {
      MORI_THROW(InternalError, "bootstrap ", what, " returned ", view.size(), " bytes, expected ",
                 expected);
    }
    std::memcpy(dst, view.data(), expected);
  }

  py::object obj_;
  int rank_ = 0;
  int world_size_ = 1;
};

std::vector<uint8_t> ToVector(const py::bytes& b) {
  std::string_view v = b;
  return std::vector<uint8_t>(v.begin(), v.end());
}

py::bytes ToBytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

py::list GatherToList(Bootstrap& b, const py::bytes& data) {
  std::vector<uint8_t> mine = ToVector(data);
  std::vector<std::vector<uint8_t>> all;
  {
    py::gil_scoped_release release;
    all = bootstrap::AllGatherBytes(b, mine);
  }
  py::list out;
  for (const auto& blob : all) out.append(ToBytes(blob));
  return out;
}

py::bytes BroadcastToBytes(Bootstrap& b, const std::optional<py::bytes>& data, int root) {
  std::vector<uint8_t> blob = data ? ToVector(*data) : std::vector<uint8_t>{};
  std::vector<uint8_t> out;
  {
    py::gil_scoped_release release;
    out = bootstrap::BroadcastBytes(b, blob, root);
  }
  return ToBytes(out);
}

}  // namespace

std::shared_ptr<Bootstrap> BootstrapFromPython(py::handle obj) {
  if (py::isinstance<TcpBootstrap>(obj)) return obj.cast<std::shared_ptr<TcpBootstrap>>();
  return std::make_shared<PyObjectBootstrap>(obj);
}

void register_bootstrap(py::module_& m) {
  py::class_<TcpBootstrap, std::shared_ptr<TcpBootstrap>>(m, "TcpBootstrap", R"doc(
Native bootstrap over TCP: all-gather, broadcast and barrier of byte blobs through
rank 0. Rank 0 listens on (host, port); port 0 picks a free port (see ``port``).
Every wait is bounded by ``timeout_s``; a dead peer raises TransportError, a slow
one MoriTimeoutError.)doc")
      // The GIL is released inside the factories, not with call_guard: pybind11
      // registers the new instance after the factory returns and needs the GIL then.
      .def(py::init(
               [](int rank, int world_size, const std::string& host, int port, double timeout_s) {
                 TcpBootstrapOptions o;
                 o.rank = rank;
                 o.world_size = world_size;
                 o.host = host;
                 o.port = port;
                 o.timeout = TimeoutMsFromSeconds(timeout_s, "timeout_s");
                 py::gil_scoped_release release;
                 return std::make_shared<TcpBootstrap>(o);
               }),
           py::arg("rank"), py::arg("world_size"), py::arg("host") = "127.0.0.1",
           py::arg("port") = 0, py::arg("timeout_s") = 120.0)
      .def_static(
          "from_env",
          [] {
            TcpBootstrapOptions o = TcpBootstrap::OptionsFromEnv();
            py::gil_scoped_release release;
            return std::make_shared<TcpBootstrap>(o);
          },
          R"doc(Build from torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (the port used is
MORI_BOOTSTRAP_PORT, or MASTER_PORT + 1).)doc")
      .def_property_readonly("rank", &TcpBootstrap::Rank)
      .def_property_readonly("world_size", &TcpBootstrap::WorldSize)
      .def_property_readonly("port", &TcpBootstrap::Port,
                             "Port rank 0 listens on (the bound port when 0 was asked for).")
      .def(
          "all_gather",
          [](TcpBootstrap& b, const py::bytes& data) { return GatherToList(b, data); },
          py::arg("data"),
          "Gather one bytes object from every rank; returns a list indexed by rank.")
      .def(
          "broadcast",
          [](TcpBootstrap& b, const std::optional<py::bytes>& data, int root) {
            return BroadcastToBytes(b, data, root);
          },
          py::arg("data"), py::arg("root") = 0,
          "Return root's bytes on every rank (non-root ranks may pass None).")
      .def(
          "all_gather_fixed",
          [](TcpBootstrap& b, const py::bytes& data) {
            std::string_view v = data;
            std::string out(v.size() * static_cast<size_t>(b.WorldSize()), '\0');
            {
              py::gil_scoped_release release;
              b.AllGather(v.data(), v.size(), out.data());
            }
            return py::bytes(out);
          },
          py::arg("data"), "All-gather of equal-size blobs; returns their concatenation by rank.")
      .def(
          "broadcast_fixed",
          [](TcpBootstrap& b, const py::bytes& data, int root) {
            std::string buf(data);
            {
              py::gil_scoped_release release;
              b.Broadcast(buf.data(), buf.size(), root);
            }
            return py::bytes(buf);
          },
          py::arg("data"), py::arg("root") = 0, "Broadcast of a blob whose size every rank knows.")
      .def("barrier", &TcpBootstrap::Barrier, py::call_guard<py::gil_scoped_release>(),
           "Return once every rank has entered the barrier.");

  m.def(
      "bootstrap_all_gather",
      [](py::handle obj, const py::bytes& data) {
        auto b = BootstrapFromPython(obj);
        return GatherToList(*b, data);
      },
      py::arg("bootstrap"), py::arg("data"),
      R"doc(All-gather variable-size blobs through libmori_core's native interface
(mori::bootstrap::AllGatherBytes) over any bootstrap object, e.g. a TorchBootstrap.)doc");
  m.def(
      "bootstrap_broadcast",
      [](py::handle obj, const std::optional<py::bytes>& data, int root) {
        auto b = BootstrapFromPython(obj);
        return BroadcastToBytes(*b, data, root);
      },
      py::arg("bootstrap"), py::arg("data"), py::arg("root") = 0,
      R"doc(Broadcast a blob through the native interface (mori::bootstrap::BroadcastBytes).)doc");
  m.def(
      "bootstrap_barrier",
      [](py::handle obj) {
        auto b = BootstrapFromPython(obj);
        py::gil_scoped_release release;
        b->Barrier();
      },
      py::arg("bootstrap"), R"doc(Barrier through the native interface.)doc");
}

}  // namespace mori::python
