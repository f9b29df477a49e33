// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>

#include "layout.hpp"
#include "mori/python/extension.hpp"

namespace py = pybind11;

namespace mori::ep {
void register_dispatch_combine(py::module_& m);
void register_low_latency(py::module_& m);
}  // namespace mori::ep

namespace {

mori::ep::LayoutArgs MakeArgs(uintptr_t indices, int64_t num_tokens, int top_k, int num_experts,
                              int world_size, uintptr_t tokens_per_rank,
                              uintptr_t tokens_per_expert, uintptr_t token_in_rank) {
  return mori::ep::LayoutArgs{reinterpret_cast<const int32_t*>(indices),
                              num_tokens,
                              top_k,
                              num_experts,
                              world_size,
                              reinterpret_cast<int32_t*>(tokens_per_rank),
                              reinterpret_cast<int32_t*>(tokens_per_expert),
                              reinterpret_cast<bool*>(token_in_rank)};
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "mori.ep native bindings (tensors cross as pointer + size + device)";
  mori::python::InitExtension(m, "mori.ep._C");

#if MORI_EP_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif

  mori::ep::register_dispatch_combine(m);
  mori::ep::register_low_latency(m);

  m.def(
      "dispatch_layout_cpu",
      [](uintptr_t indices, int64_t num_tokens, int top_k, int num_experts, int world_size,
         uintptr_t tokens_per_rank, uintptr_t tokens_per_expert, uintptr_t token_in_rank) {
        mori::ep::DispatchLayoutCpu(MakeArgs(indices, num_tokens, top_k, num_experts, world_size,
                                             tokens_per_rank, tokens_per_expert, token_in_rank));
      },
      py::arg("indices"), py::arg("num_tokens"), py::arg("top_k"), py::arg("num_experts"),
      py::arg("world_size"), py::arg("tokens_per_rank"), py::arg("tokens_per_expert"),
      py::arg("token_in_rank"), py::call_guard<py::gil_scoped_release>(),
      R"doc(Host routing layout over raw pointers (see mori.ep.get_dispatch_layout).)doc");

#if MORI_EP_WITH_CUDA
  m.def(
      "dispatch_layout_cuda",
      [](uintptr_t indices, int64_t num_tokens, int top_k, int num_experts, int world_size,
         uintptr_t tokens_per_rank, uintptr_t tokens_per_expert, uintptr_t token_in_rank,
         uintptr_t error_record, uintptr_t stream) {
        mori::ep::DispatchLayoutCuda(MakeArgs(indices, num_tokens, top_k, num_experts, world_size,
                                              tokens_per_rank, tokens_per_expert, token_in_rank),
                                     reinterpret_cast<int32_t*>(error_record), stream);
      },
      py::arg("indices"), py::arg("num_tokens"), py::arg("top_k"), py::arg("num_experts"),
      py::arg("world_size"), py::arg("tokens_per_rank"), py::arg("tokens_per_expert"),
      py::arg("token_in_rank"), py::arg("error_record"), py::arg("stream"),
      py::call_guard<py::gil_scoped_release>(),
      R"doc(Device routing layout on ``stream``; see mori.ep.get_dispatch_layout.)doc");
#endif
}
