// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Binding-side helpers shared by every mori extension (mori.core._C, mori.io._C,
// mori.ep._C, mori.ccl._C). Header-only and pybind11-only: it is installed with
// mori-core's headers but is not part of libmori_core, which knows nothing of
// Python.

#include <pybind11/pybind11.h>

#include <exception>

#include "mori/core/error.hpp"
#include "mori/core/version.hpp"

namespace mori::python {

// Translates mori::Error (thrown anywhere in libmori_core or an extension) to the
// Python class that mori.core.errors maps its code to, so every extension raises
// the same MoriError subclasses. Registered per extension (module-local), so it
// does not depend on pybind11 internals being shared between extensions.
inline void RegisterErrorTranslator() {
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mori::Error& e) {
      pybind11::object cls = pybind11::module_::import("mori.core.errors")
                                 .attr("error_class_for_code")(static_cast<int>(e.code()));
      pybind11::object exc = cls(e.what());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

// Call first in every PYBIND11_MODULE: refuses to load against a libmori_core of
// another major.minor (raising ImportError with both versions), then installs the
// error translator.
inline void InitExtension(pybind11::module_& m, const char* name) {
  try {
    mori::core::CheckCompatible(MORI_CORE_VERSION_MAJOR, MORI_CORE_VERSION_MINOR, name);
  } catch (const mori::Error& e) {
    throw pybind11::import_error(e.what());
  }
  RegisterErrorTranslator();
  m.attr("__mori_core_version_compiled__") = MORI_CORE_VERSION_STRING;
}

}  // namespace mori::python
