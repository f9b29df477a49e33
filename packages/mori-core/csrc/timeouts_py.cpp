// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings.hpp"
#include "mori/core/timeout.hpp"

namespace py = pybind11;

namespace mori::python {

// mori.core.timeouts wraps these, so that Python code that keeps or forwards a
// timeout applies the same rules as the native code (mori/core/timeout.hpp).
void register_timeouts(py::module_& m) {
  m.attr("max_timeout_s") = kMaxTimeoutS;
  m.def(
      "timeout_seconds",
      [](double seconds, const std::string& name) { return TimeoutSeconds(seconds, name.c_str()); },
      py::arg("seconds"), py::arg("name"));
  m.def(
      "timeout_ms",
      [](double ms, const std::string& name, int64_t max_ms, bool zero_means_never) {
        return TimeoutMs(ms, name.c_str(), max_ms, zero_means_never);
      },
      py::arg("ms"), py::arg("name"), py::arg("max_ms"), py::arg("zero_means_never"));
  m.def(
      "wait_timeout_ms",
      [](double ms, const std::string& name) { return WaitTimeoutMs(ms, name.c_str()); },
      py::arg("ms"), py::arg("name"));
}

}  // namespace mori::python
