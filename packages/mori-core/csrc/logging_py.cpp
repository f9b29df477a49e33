// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/telemetry.hpp"

namespace py = pybind11;

namespace mori::python {

void register_logging(py::module_& m) {
  m.def(
      "set_log_level",
      [](const std::string& module, const std::string& level) {
        log::SetLevel(log::ParseModule(module), log::ParseLevel(level));
      },
      py::arg("module"), py::arg("level"),
      R"doc(Set the threshold of one module logger ("core", "shmem", "io", "ep", "ccl") to
"trace", "debug", "info", "warn", "error" or "off".)doc");
  m.def(
      "get_log_level",
      [](const std::string& module) {
        return log::LevelName(log::GetLevel(log::ParseModule(module)));
      },
      py::arg("module"), R"doc(Current threshold of one module logger, as a lower-case name.)doc");
  m.def(
      "log",
      [](const std::string& module, const std::string& level, const std::string& message) {
        log::Module mod = log::ParseModule(module);
        log::Level lvl = log::ParseLevel(level);
        if (log::Enabled(mod, lvl)) log::Write(mod, lvl, "python", 0, message);
      },
      py::arg("module"), py::arg("level"), py::arg("message"),
      R"doc(Write ``message`` through a module logger (if its level is enabled).)doc");

  m.def(
      "telemetry_enable",
      [](const std::string& module, bool on) { telemetry::Enable(log::ParseModule(module), on); },
      py::arg("module"), py::arg("on") = true,
      R"doc(Switch a module's scoped timers on or off.)doc");
  m.def(
      "telemetry_enabled",
      [](const std::string& module) { return telemetry::Enabled(log::ParseModule(module)); },
      py::arg("module"));
  m.def(
      "telemetry_snapshot",
      [] {
        py::list out;
        for (const auto& s : telemetry::Snapshot()) {
          py::dict d;
          d["module"] = s.module;
          d["name"] = s.name;
          d["count"] = s.count;
          d["total_ns"] = s.total_ns;
          d["min_ns"] = s.min_ns;
          d["max_ns"] = s.max_ns;
          out.append(d);
        }
        return out;
      },
      R"doc(Statistics of every timer site that has recorded: list of dicts with module,
name, count, total_ns, min_ns, max_ns.)doc");
  m.def("telemetry_reset", &telemetry::Reset, R"doc(Zero every timer site's statistics.)doc");
  m.def(
      "_timed_noop",
      [](int iterations) {
        for (int i = 0; i < iterations; ++i) {
          MORI_SCOPED_TIMER(kCore, "core._timed_noop");
        }
      },
      py::arg("iterations"),
      R"doc(Run an empty scope under a core scoped timer ``iterations`` times (tests).)doc");
}

}  // namespace mori::python
