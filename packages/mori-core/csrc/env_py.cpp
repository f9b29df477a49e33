// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "mori/core/env.hpp"

namespace py = pybind11;

namespace mori::python {

// mori.core.env wraps these: Python reads mori's variables with the same syntax and
// the same errors as the native code.
void register_env(py::module_& m) {
  m.def(
      "env_get", [](const std::string& name) { return env::Get(name.c_str()); }, py::arg("name"),
      R"doc(The variable's value, or None when it is unset or empty.)doc");
  m.def(
      "env_parse_bool",
      [](const std::string& name, const std::string& value) {
        return env::ParseBool(name.c_str(), value);
      },
      py::arg("name"), py::arg("value"));
  m.def(
      "env_bool",
      [](const std::string& name, bool fallback) { return env::Bool(name.c_str(), fallback); },
      py::arg("name"), py::arg("default"));
  m.def(
      "env_int",
      [](const std::string& name, int64_t fallback, int64_t lo, int64_t hi) {
        return env::Int(name.c_str(), fallback, lo, hi);
      },
      py::arg("name"), py::arg("default"), py::arg("lo"), py::arg("hi"));
  m.def(
      "env_size",
      [](const std::string& name, uint64_t fallback, uint64_t lo, uint64_t hi) {
        return env::Size(name.c_str(), fallback, lo, hi);
      },
      py::arg("name"), py::arg("default"), py::arg("lo"), py::arg("hi"));
}

}  // namespace mori::python
