// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "mori/core/cuda.hpp"
#include "mori/core/error.hpp"
#include "mori/core/version.hpp"

namespace py = pybind11;

namespace mori::python {

void register_errors(py::module_& m) {
  py::enum_<ErrorCode>(m, "ErrorCode", "Numeric code carried by every mori error.")
      .value("Internal", ErrorCode::kInternal)
      .value("InvalidArgument", ErrorCode::kInvalidArgument)
      .value("OutOfMemory", ErrorCode::kOutOfMemory)
      .value("Timeout", ErrorCode::kTimeout)
      .value("Transport", ErrorCode::kTransport)
      .value("NotSupported", ErrorCode::kNotSupported)
      .value("Cuda", ErrorCode::kCuda)
      .value("InvalidState", ErrorCode::kInvalidState)
      .value("NotFound", ErrorCode::kNotFound);

  m.def(
      "throw_error", [](ErrorCode code, const std::string& message) { ThrowError(code, message); },
      py::arg("code"), py::arg("message"),
      R"doc(Raise, from inside libmori_core, the C++ error for ``code`` with ``message``.

Used to check that native errors reach Python as the matching MoriError subclass.)doc");

  m.def(
      "build_info",
      [] {
        core::BuildInfo b = core::GetBuildInfo();
        py::dict d;
        d["version"] = b.version;
        d["with_cuda"] = b.with_cuda;
        d["cuda_archs"] = b.cuda_archs;
        d["cuda_runtime_version"] = b.cuda_runtime_version;
        d["cuda_device_count"] = cuda::DeviceCount();
        d["cuda_unavailable_reason"] = cuda::UnavailableReason();
        return d;
      },
      R"doc(Describe the loaded libmori_core: version, CUDA support, visible devices.)doc");
}

}  // namespace mori::python
