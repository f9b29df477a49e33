// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <pybind11/pybind11.h>

#include "layout/layout.hpp"
#include "mori/python/extension.hpp"

namespace py = pybind11;

namespace mori::ep {
void register_dispatch_combine(py::module_& m);
void register_low_latency(py::module_& m);
void register_internode(py::module_& m);
void register_mori_cpp(py::module_& m);
void register_balanced(py::module_& m);
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

mori::ep::LocalExpertCountArgs CountArgs(uintptr_t indices, uintptr_t total_recv, int rank,
                                         int num_experts_per_rank, int top_k, uintptr_t counts) {
  return mori::ep::LocalExpertCountArgs{reinterpret_cast<const int32_t*>(indices),
                                        reinterpret_cast<const int32_t*>(total_recv),
                                        rank,
                                        num_experts_per_rank,
                                        top_k,
                                        reinterpret_cast<int32_t*>(counts)};
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
  mori::ep::register_internode(m);
  mori::ep::register_mori_cpp(m);
  mori::ep::register_balanced(m);

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

  m.def(
      "local_expert_count_cpu",
      [](uintptr_t indices, uintptr_t total_recv, int rank, int num_experts_per_rank, int top_k,
         uintptr_t counts) {
        mori::ep::LocalExpertCountCpu(
            CountArgs(indices, total_recv, rank, num_experts_per_rank, top_k, counts));
      },
      py::arg("indices"), py::arg("total_recv"), py::arg("rank"), py::arg("num_experts_per_rank"),
      py::arg("top_k"), py::arg("counts"), py::call_guard<py::gil_scoped_release>(),
      R"doc(Host count of (row, slot) pairs per local expert in rows [0, *total_recv).)doc");

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

  m.def(
      "local_expert_count_cuda",
      [](uintptr_t indices, uintptr_t total_recv, int rank, int num_experts_per_rank, int top_k,
         uintptr_t counts, int blocks, int threads, uintptr_t stream) {
        mori::ep::LocalExpertCountCuda(
            CountArgs(indices, total_recv, rank, num_experts_per_rank, top_k, counts), blocks,
            threads, stream);
      },
      py::arg("indices"), py::arg("total_recv"), py::arg("rank"), py::arg("num_experts_per_rank"),
      py::arg("top_k"), py::arg("counts"), py::arg("blocks"), py::arg("threads"), py::arg("stream"),
      py::call_guard<py::gil_scoped_release>(),
      R"doc(Device count of local_expert_count_cpu's on ``stream`` (no host synchronisation).)doc");
#endif
}
