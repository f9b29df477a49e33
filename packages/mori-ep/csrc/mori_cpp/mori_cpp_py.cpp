// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The dispatch/combine names of ROCm/mori's raw module (mori.cpp) that mori-ep
// implements: its bound config (EpDispatchCombineConfig, here RawDispatchCombineConfig)
// and launch_local_expert_count. mori.cpp resolves them to this module; mori.ep's
// Python API (the dataclass config, the op) does not use them.
#include <pybind11/pybind11.h>

#include <string>

#include "layout/layout.hpp"
#include "mori/core/error.hpp"
#include "mori_cpp/raw_config.hpp"

namespace py = pybind11;

namespace mori::ep {

namespace {

using Config = RawDispatchCombineConfig;

py::object PyEnum(const char* name, int value) {
  return py::module_::import("mori.ep.config").attr(name)(value);
}

int KernelTypeValue(int v) {
  MORI_CHECK_ARG(v >= 0 && v < kNumKernelTypes, "kernel_type ", v,
                 " is not an EpDispatchCombineKernelType value (0..", kNumKernelTypes - 1, ")");
  return v;
}

int QuantTypeValue(int v) {
  MORI_CHECK_ARG(v >= 0 && v < kNumQuantTypes, "quant_type ", v,
                 " is not an EpDispatchCombineQuantType value (0..", kNumQuantTypes - 1, ")");
  return v;
}

const char* KernelTypeName(int v) {
  static const char* const kNames[kNumKernelTypes] = {"IntraNode",     "InterNode", "InterNodeV1",
                                                      "InterNodeV1LL", "AsyncLL",   "IntraNodeLL"};
  return v >= 0 && v < kNumKernelTypes ? kNames[v] : "?";
}

const char* QuantTypeName(int v) {
  static const char* const kNames[kNumQuantTypes] = {"None_", "Fp8DirectCast", "Fp8BlockwiseQuant",
                                                     "Fp4BlockwiseQuant"};
  return v >= 0 && v < kNumQuantTypes ? kNames[v] : "?";
}

std::string Repr(const Config& c) {
  return StrCat("EpDispatchCombineConfig(rank=", c.rank, ", world_size=", c.world_size,
                ", hidden_dim=", c.hidden_dim, ", scale_dim=", c.scale_dim,
                ", scale_type_size=", c.scale_type_size,
                ", max_token_type_size=", c.max_token_type_size,
                ", max_num_inp_token_per_rank=", c.max_num_inp_token_per_rank,
                ", num_experts_per_rank=", c.num_experts_per_rank,
                ", num_experts_per_token=", c.num_experts_per_token,
                ", max_total_recv_tokens=", c.max_total_recv_tokens,
                ", warp_num_per_block=", c.warp_num_per_block, ", block_num=", c.block_num,
                ", use_external_inp_buf=", c.use_external_inp_buf ? "True" : "False",
                ", kernel_type=EpDispatchCombineKernelType.", KernelTypeName(c.kernel_type),
                ", gpu_per_node=", c.gpu_per_node, ", rdma_block_num=", c.rdma_block_num,
                ", num_qp_per_pe=", c.num_qp_per_pe, ", quant_type=EpDispatchCombineQuantType.",
                QuantTypeName(c.quant_type), ")");
}

}  // namespace

void register_mori_cpp(py::module_& m) {
  py::class_<Config> cls(m, "EpDispatchCombineConfig", R"doc(
ROCm/mori's raw dispatch/combine config (``mori.cpp.EpDispatchCombineConfig``): the
struct MORI binds, with its keyword constructor, its defaults (those of MORI's binding:
0 for the sizes and launch settings, ``use_external_inp_buf=True``, ``kernel_type``
IntraNode, ``gpu_per_node=8``, ``num_qp_per_pe=1``, ``quant_type`` None_) and readable,
writable fields. No field is checked here (MORI's is plain data); a call that uses one
checks it.

What takes it: :func:`mori.ops.local_expert_count.launch_local_expert_count`. mori's
ops take the dataclass :class:`mori.ep.EpDispatchCombineConfig` (which adds
``data_type``); ``EpDispatchCombineConfig.to_cpp_config()`` builds this struct from
one. ``kernel_type`` and ``quant_type`` read back as mori's
EpDispatchCombineKernelType / EpDispatchCombineQuantType (MORI's names and values) and
take those or their int values.
)doc");
  cls.def(py::init([](int rank, int world_size, int hidden_dim, int scale_dim, int scale_type_size,
                      int max_token_type_size, int max_num_inp_token_per_rank,
                      int num_experts_per_rank, int num_experts_per_token,
                      int max_total_recv_tokens, int warp_num_per_block, int block_num,
                      bool use_external_inp_buf, int kernel_type, int gpu_per_node,
                      int rdma_block_num, int num_qp_per_pe, int quant_type) {
            return Config{rank,
                          world_size,
                          hidden_dim,
                          scale_dim,
                          scale_type_size,
                          max_token_type_size,
                          max_num_inp_token_per_rank,
                          num_experts_per_rank,
                          num_experts_per_token,
                          max_total_recv_tokens,
                          warp_num_per_block,
                          block_num,
                          use_external_inp_buf,
                          KernelTypeValue(kernel_type),
                          gpu_per_node,
                          rdma_block_num,
                          num_qp_per_pe,
                          QuantTypeValue(quant_type)};
          }),
          py::arg("rank") = 0, py::arg("world_size") = 0, py::arg("hidden_dim") = 0,
          py::arg("scale_dim") = 0, py::arg("scale_type_size") = 0,
          py::arg("max_token_type_size") = 0, py::arg("max_num_inp_token_per_rank") = 0,
          py::arg("num_experts_per_rank") = 0, py::arg("num_experts_per_token") = 0,
          py::arg("max_total_recv_tokens") = 0, py::arg("warp_num_per_block") = 0,
          py::arg("block_num") = 0, py::arg("use_external_inp_buf") = true,
          py::arg("kernel_type") = 0, py::arg("gpu_per_node") = 8, py::arg("rdma_block_num") = 0,
          py::arg("num_qp_per_pe") = 1, py::arg("quant_type") = 0)
      .def_readwrite("rank", &Config::rank)
      .def_readwrite("world_size", &Config::world_size)
      .def_readwrite("hidden_dim", &Config::hidden_dim)
      .def_readwrite("scale_dim", &Config::scale_dim)
      .def_readwrite("scale_type_size", &Config::scale_type_size)
      .def_readwrite("max_token_type_size", &Config::max_token_type_size)
      .def_readwrite("max_num_inp_token_per_rank", &Config::max_num_inp_token_per_rank)
      .def_readwrite("num_experts_per_rank", &Config::num_experts_per_rank)
      .def_readwrite("num_experts_per_token", &Config::num_experts_per_token)
      .def_readwrite("max_total_recv_tokens", &Config::max_total_recv_tokens)
      .def_readwrite("warp_num_per_block", &Config::warp_num_per_block)
      .def_readwrite("block_num", &Config::block_num)
      .def_readwrite("use_external_inp_buf", &Config::use_external_inp_buf)
      .def_property(
          "kernel_type",
          [](const Config& c) { return PyEnum("EpDispatchCombineKernelType", c.kernel_type); },
          [](Config& c, int v) { c.kernel_type = KernelTypeValue(v); })
      .def_readwrite("gpu_per_node", &Config::gpu_per_node)
      .def_readwrite("rdma_block_num", &Config::rdma_block_num)
      .def_readwrite("num_qp_per_pe", &Config::num_qp_per_pe)
      .def_property(
          "quant_type",
          [](const Config& c) { return PyEnum("EpDispatchCombineQuantType", c.quant_type); },
          [](Config& c, int v) { c.quant_type = QuantTypeValue(v); })
      .def("max_num_tokens_to_send_per_rank", &Config::MaxNumTokensToSendPerRank,
           "max_num_inp_token_per_rank (M).")
      .def("max_num_tokens_to_send", &Config::MaxNumTokensToSend, "world_size * M.")
      .def("max_num_tokens_to_recv_per_rank", &Config::MaxNumTokensToRecvPerRank,
           "M, or with max_total_recv_tokens > 0 min(ceil(cap / world_size), M) (MORI's rule).")
      .def("max_num_tokens_to_recv", &Config::MaxNumTokensToRecv,
           "world_size * max_num_tokens_to_recv_per_rank().")
      .def("__repr__", &Repr);

  m.def(
      "launch_local_expert_count",
      [](const Config& c, uintptr_t indices, uintptr_t total_recv, uintptr_t counts, int block_num,
         int warp_per_block, uintptr_t stream) {
        const int warps = warp_per_block <= 0 ? c.warp_num_per_block : warp_per_block;
        const int blocks = block_num <= 0 ? c.block_num : block_num;
        LaunchLocalExpertCount(
            LocalExpertCountArgs{reinterpret_cast<const int32_t*>(indices),
                                 reinterpret_cast<const int32_t*>(total_recv), c.rank,
                                 c.num_experts_per_rank, c.num_experts_per_token,
                                 reinterpret_cast<int32_t*>(counts)},
            blocks, warps, stream);
      },
      py::arg("config"), py::arg("indices_ptr"), py::arg("total_recv_token_num_ptr"),
      py::arg("local_expert_count_ptr"), py::arg("block_num") = -1, py::arg("warp_per_block") = -1,
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>(),
      R"doc(MORI's raw local expert count; see mori.ep.local_expert_count.launch_local_expert_count.)doc");
}

}  // namespace mori::ep
