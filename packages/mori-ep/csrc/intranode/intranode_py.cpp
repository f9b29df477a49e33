// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Bindings of the intra-node dispatch/combine implementations, IntraNodeCpu and
// IntraNodeCuda, with one signature (common/bind_py.hpp). Tensors cross as
// addresses; mori.ep.intranode checks dtypes, shapes and devices first.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/bind_py.hpp"
#include "intranode/cpu.hpp"
#include "intranode/protocol.hpp"
#include "mori/core/error.hpp"
#if MORI_EP_WITH_CUDA
#include "intranode/cuda.hpp"
#endif

namespace py = pybind11;

namespace mori::ep {

namespace {

using bind::Launch;
using bind::P;

using bind::RoutingWords;
using bind::ToRouting;

const RoutingSnapshot* Ptr(const std::optional<RoutingSnapshot>& r) { return r ? &*r : nullptr; }

// How each implementation takes a call: the host one runs it on the calling thread
// and ignores the launch shape and the stream; the CUDA one enqueues it.
void Dispatch(IntraNodeCpu& impl, const DispatchArgs& a, const Launch&) { impl.Dispatch(a); }
[[noreturn]] void RejectDispatch(IntraNodeCpu& impl, const std::string& reason, uintptr_t) {
  impl.RejectDispatch(reason);
}
void Combine(IntraNodeCpu& impl, const CombineArgs& a, const Launch&) { impl.Combine(a); }
[[noreturn]] void RejectCombine(IntraNodeCpu& impl, const std::string& reason, uintptr_t,
                                const RoutingSnapshot* routing) {
  impl.RejectCombine(reason, routing);
}
#if MORI_EP_WITH_CUDA
void Dispatch(IntraNodeCuda& impl, const DispatchArgs& a, const Launch& l) {
  impl.Dispatch(a, LaunchShape{l.block_num, l.warp_per_block}, l.stream);
}
[[noreturn]] void RejectDispatch(IntraNodeCuda& impl, const std::string& reason, uintptr_t stream) {
  impl.RejectDispatch(reason, stream);
}
void Combine(IntraNodeCuda& impl, const CombineArgs& a, const Launch& l) {
  impl.Combine(a, LaunchShape{l.block_num, l.warp_per_block}, l.stream);
}
[[noreturn]] void RejectCombine(IntraNodeCuda& impl, const std::string& reason, uintptr_t stream,
                                const RoutingSnapshot* routing) {
  impl.RejectCombine(reason, stream, routing);
}
#endif

template <class Impl>
py::class_<Impl> BindIntraNode(py::module_& m, const char* name, const char* doc) {
  py::class_<Impl> cls(m, name, doc);
  bind::DefInit(cls, R"doc(Collective: zeroes this pe's signal words (and device state), then a heap
barrier. ``block``: this pe's address of a symmetric block of ep_buffer_layout's
total_bytes; ``device``: its CUDA ordinal (ignored on a host heap).)doc");
  cls.def(
         "dispatch",
         [](Impl& self, uintptr_t tokens, int64_t token_row_bytes, uintptr_t weights,
            uintptr_t scales, uintptr_t indices, int64_t num_tokens, int block_num,
            int warp_per_block, uintptr_t stream, uintptr_t rank_masks, uint32_t row_tag) {
           Dispatch(self,
                    DispatchArgs{P<const void>(tokens), token_row_bytes, P<const float>(weights),
                                 P<const void>(scales), P<const int32_t>(indices), num_tokens,
                                 P<const uint32_t>(rank_masks), row_tag},
                    Launch{block_num, warp_per_block, stream});
         },
         py::arg("tokens"), py::arg("token_row_bytes"), py::arg("weights"), py::arg("scales"),
         py::arg("indices"), py::arg("num_tokens"), py::arg("block_num"), py::arg("warp_per_block"),
         py::arg("stream"), py::arg("rank_masks") = 0, py::arg("row_tag") = 0,
         py::call_guard<py::gil_scoped_release>(),
         R"doc(Collective dispatch over raw addresses (on CUDA enqueued on ``stream``, no
host sync). rank_masks: a replay's int32 [num_tokens] destination sets (bit d: rank
d), 0 to route by indices. row_tag: the token dtype's code (1 bf16, 2 fp8 e4m3fn,
3 fp16, 4 fp32), compared across ranks in the count exchange.)doc")
      .def(
          "reject_dispatch",
          [](Impl& self, const std::string& reason, uintptr_t stream) {
            RejectDispatch(self, reason, stream);
          },
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Take part in the dispatch as a rejecting pe (posted for the next epoch),
then raise InvalidArgumentError(reason).)doc")
      .def(
          "combine",
          [](Impl& self, uintptr_t input, int64_t input_row_stride, int64_t input_rows, int dtype,
             uintptr_t weights, uintptr_t out, uintptr_t out_weights, bool fp8_cast, int block_num,
             int warp_per_block, uintptr_t stream, const RoutingWords& routing,
             int fp8_block_scale_dim) {
            MORI_CHECK_ARG(dtype >= 0 && dtype <= 3, "combine dtype code ", dtype,
                           " is not 0 (bf16), 1 (fp32), 2 (fp8 e4m3fn) or 3 (float4_e2m1fn_x2)");
            const auto r = ToRouting(routing);
            Combine(
                self,
                CombineArgs{P<const void>(input), input_row_stride, input_rows,
                            static_cast<CombineDtype>(dtype), P<const float>(weights), P<void>(out),
                            P<float>(out_weights), fp8_cast, Ptr(r), fp8_block_scale_dim},
                Launch{block_num, warp_per_block, stream});
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("input_rows"), py::arg("dtype"),
          py::arg("weights"), py::arg("out"), py::arg("out_weights"), py::arg("fp8_cast"),
          py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::arg("routing") = py::none(), py::arg("fp8_block_scale_dim") = 0,
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Collective combine over raw addresses (row stride in bytes; dtype 0 bf16,
1 fp32, 2 fp8 e4m3fn; fp8_cast: bf16 rows rounded to fp8, on CUDA crossing as fp8), by
the last dispatch's routing or ``routing``'s snapshot; fp8_block_scale_dim > 0: bf16
rows cross as MORI's fp8_blockwise blocks.)doc")
      .def(
          "reject_combine",
          [](Impl& self, const std::string& reason, uintptr_t stream, const RoutingWords& routing) {
            const auto r = ToRouting(routing);
            RejectCombine(self, reason, stream, Ptr(r));
          },
          py::arg("reason"), py::arg("stream"), py::arg("routing") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Take part in the combine as a rejecting pe, then raise InvalidArgumentError(reason).)doc")
      .def_property_readonly("num_tokens", &Impl::num_tokens)
      .def_property_readonly("epoch", &Impl::epoch)
      .def_property_readonly("combined_epoch", &Impl::combined_epoch)
      .def_property_readonly("combine_pending", &Impl::combine_pending);
  return cls;
}

}  // namespace

void register_dispatch_combine(py::module_& m) {
  m.def(
      "ep_buffer_layout",
      [](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
         int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
         int64_t recv_capacity) {
        const EpBufferLayout l = MakeLayout(
            bind::MakeShape(world_size, rank, max_tokens, top_k, hidden_dim, max_token_type_size,
                            scale_bytes, num_experts_per_rank, recv_capacity));
        py::dict d;
        d["count_words"] = l.count_words;
        d["dispatch_done"] = l.dispatch_done;
        d["combine_done"] = l.combine_done;
        d["state"] = l.state;
        d["recv_tokens"] = l.recv_tokens;
        d["recv_weights"] = l.recv_weights;
        d["recv_scales"] = l.recv_scales;
        d["recv_indices"] = l.recv_indices;
        d["recv_src_pos"] = l.recv_src_pos;
        d["recv_group_row"] = l.recv_group_row;
        d["comb_tokens"] = l.comb_tokens;
        d["comb_weights"] = l.comb_weights;
        d["total_recv"] = l.total_recv;
        d["token_ranks"] = l.token_ranks;
        d["token_self_row"] = l.token_self_row;
        d["total_bytes"] = l.total_bytes;
        return d;
      },
      MORI_EP_SHAPE_ARGS, py::arg("recv_capacity") = 0,
      R"doc(Byte offsets of the regions of an op's symmetric block (protocol.hpp);
``recv_capacity`` rows of receive buffers (0: world_size * max_tokens).)doc");
  m.attr("ep_max_tokens_per_rank") = kMaxTokensPerRank;
  m.attr("ep_combine_group_tokens") = kCombineGroupTokens;

  BindIntraNode<IntraNodeCpu>(m, "IntraNodeCpu",
                              R"doc(Intra-node dispatch/combine on a host symmetric heap.)doc");
#if MORI_EP_WITH_CUDA
  BindIntraNode<IntraNodeCuda>(
      m, "IntraNodeCuda", R"doc(Intra-node dispatch/combine kernels on a CUDA symmetric heap.)doc")
      .def(
          "max_resident_blocks",
          [](IntraNodeCuda& self, bool dispatch, int warps, bool fp8_wire, bool fp8_blockwise) {
            return self.MaxResidentBlocks(dispatch, warps,
                                          fp8_blockwise ? intranode::kWireBlockwise
                                          : fp8_wire    ? intranode::kWireFp8
                                                        : intranode::kWireNative);
          },
          py::arg("dispatch"), py::arg("warps"), py::arg("fp8_wire") = false,
          py::arg("fp8_blockwise") = false,
          R"doc(Largest grid of ``warps`` warps per block kept resident (the launch clamp), for
the dispatch kernels or the combine kernels moving fp8 rows (``fp8_wire``) or
fp8_blockwise rows (``fp8_blockwise``).)doc")
      .def("timeline", &IntraNodeCuda::Timeline, py::call_guard<py::gil_scoped_release>(),
           R"doc(Per-phase timestamps of the last dispatch and combine kernels as text, when the
op was built with ``MORI_EP_TIMELINE=1`` in the environment (else ""); synchronises the
device. A measurement aid.)doc");
#endif
}

}  // namespace mori::ep
