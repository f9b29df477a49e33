// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Bindings of the low-latency dispatch/combine (low_latency/protocol.hpp),
// LowLatencyCpu and LowLatencyCuda, with one signature (common/bind_py.hpp). Tensors
// cross as addresses; mori.ep.low_latency checks dtypes, shapes and devices first.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>

#include "common/bind_py.hpp"
#include "low_latency/cpu.hpp"
#include "mori/core/error.hpp"
#if MORI_EP_WITH_CUDA
#include "low_latency/cuda.hpp"
#endif

namespace py = pybind11;

namespace mori::ep {

namespace {

using bind::Launch;
using bind::P;

// How each implementation takes a call: the host one runs it on the calling thread
// (a send writes the rows and posts the flags; the receive is always its own call)
// and ignores `fuse`, the launch shape and the stream; the CUDA one
// enqueues it (with `fuse`, the send runs inside the receive's kernel).
void DispatchSend(LowLatencyCpu& impl, const LlDispatchArgs& a, bool, const Launch&) {
  impl.DispatchSend(a);
}
void DispatchRecv(LowLatencyCpu& impl, const LlRecvArgs& o, const Launch&) { impl.DispatchRecv(o); }
// total_recv: the token-major dispatch's row count (host memory here), else nullptr.
void CombineSend(LowLatencyCpu& impl, LlCombineArgs a, const int32_t* total_recv, bool,
                 const Launch&) {
  if (total_recv != nullptr) a.total_recv = *total_recv;
  impl.CombineSend(a);
}
void CombineRecv(LowLatencyCpu& impl, const Launch&) { impl.CombineRecv(); }
[[noreturn]] void RejectDispatch(LowLatencyCpu& impl, const std::string& reason, uintptr_t) {
  impl.RejectDispatch(reason);
}
[[noreturn]] void RejectCombine(LowLatencyCpu& impl, const std::string& reason, uintptr_t) {
  impl.RejectCombine(reason);
}
#if MORI_EP_WITH_CUDA
void DispatchSend(LowLatencyCuda& impl, const LlDispatchArgs& a, bool fuse, const Launch& l) {
  impl.DispatchSend(a, fuse, LaunchShape{l.block_num, l.warp_per_block}, l.stream);
}
void DispatchRecv(LowLatencyCuda& impl, const LlRecvArgs& o, const Launch& l) {
  impl.DispatchRecv(o, LaunchShape{l.block_num, l.warp_per_block}, l.stream);
}
void CombineSend(LowLatencyCuda& impl, const LlCombineArgs& a, const int32_t* total_recv, bool fuse,
                 const Launch& l) {
  impl.CombineSend(a, total_recv, fuse, LaunchShape{l.block_num, l.warp_per_block}, l.stream);
}
void CombineRecv(LowLatencyCuda& impl, const Launch& l) {
  impl.CombineRecv(LaunchShape{l.block_num, l.warp_per_block}, l.stream);
}
[[noreturn]] void RejectDispatch(LowLatencyCuda& impl, const std::string& reason,
                                 uintptr_t stream) {
  impl.RejectDispatch(reason, stream);
}
[[noreturn]] void RejectCombine(LowLatencyCuda& impl, const std::string& reason, uintptr_t stream) {
  impl.RejectCombine(reason, stream);
}
#endif

template <class Impl>
py::class_<Impl> BindLowLatency(py::module_& m, const char* name, const char* doc) {
  py::class_<Impl> cls(m, name, doc);
  bind::DefInit(cls, R"doc(Collective: zeroes this pe's signal words (and device state), then a heap
barrier. ``block``: this pe's address of a symmetric block of ll_buffer_layout's
total_bytes; ``device``: its CUDA ordinal (ignored on a host heap).)doc");
  cls.def(
         "dispatch_send",
         [](Impl& self, int layout, uintptr_t tokens, int64_t token_row_bytes, uintptr_t weights,
            uintptr_t scales, uintptr_t indices, int64_t num_tokens, bool fp8_cast,
            bool round_scale, bool fuse, int block_num, int warp_per_block, uintptr_t stream,
            uint32_t dtype_tag) {
           MORI_CHECK_ARG(layout == 0 || layout == 1, "layout ", layout,
                          " is not 0 (token-major) or 1 (expert-major)");
           DispatchSend(self,
                        LlDispatchArgs{static_cast<LlLayout>(layout), P<const void>(tokens),
                                       token_row_bytes, P<const float>(weights),
                                       P<const void>(scales), P<const int32_t>(indices), num_tokens,
                                       fp8_cast, round_scale, dtype_tag},
                        fuse, Launch{block_num, warp_per_block, stream});
         },
         py::arg("layout"), py::arg("tokens"), py::arg("token_row_bytes"), py::arg("weights"),
         py::arg("scales"), py::arg("indices"), py::arg("num_tokens"), py::arg("fp8_cast"),
         py::arg("round_scale"), py::arg("fuse"), py::arg("block_num"), py::arg("warp_per_block"),
         py::arg("stream"), py::arg("dtype_tag") = 0, py::call_guard<py::gil_scoped_release>(),
         R"doc(Write every token into its destinations' slots and post the flags (on CUDA
the send kernel, or with ``fuse`` its deferral into the receive's launch).)doc")
      .def(
          "reject_dispatch",
          [](Impl& self, const std::string& reason, uintptr_t stream) {
            RejectDispatch(self, reason, stream);
          },
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Post this pe's dispatch flags as rejected, then raise InvalidArgumentError.)doc")
      .def(
          "dispatch_recv_token_major",
          [](Impl& self, uintptr_t out_tokens, uintptr_t out_weights, uintptr_t out_scales,
             uintptr_t out_indices, uintptr_t out_src_pos, uintptr_t total_recv, int block_num,
             int warp_per_block, uintptr_t stream) {
            LlRecvArgs o;
            o.out_tokens = P<void>(out_tokens);
            o.out_weights = P<float>(out_weights);
            o.out_scales = P<void>(out_scales);
            o.out_indices = P<int32_t>(out_indices);
            o.out_src_pos = P<int32_t>(out_src_pos);
            o.total_recv = P<int32_t>(total_recv);
            DispatchRecv(self, o, Launch{block_num, warp_per_block, stream});
          },
          py::arg("out_tokens"), py::arg("out_weights"), py::arg("out_scales"),
          py::arg("out_indices"), py::arg("out_src_pos"), py::arg("total_recv"),
          py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Wait for every pe's flag and compact the rows (token-major); the row count
goes to ``total_recv`` (int32 [1]).)doc")
      .def(
          "dispatch_recv_expert_major",
          [](Impl& self, uintptr_t packed_x, uintptr_t packed_scales, bool ue8m0,
             uintptr_t packed_count, uintptr_t src_info, int64_t src_info_stride,
             uintptr_t layout_range, uintptr_t slot_k, int block_num, int warp_per_block,
             uintptr_t stream) {
            LlRecvArgs o;
            o.packed_x = P<void>(packed_x);
            o.packed_scales = P<void>(packed_scales);
            o.ue8m0 = ue8m0;
            o.packed_count = P<int32_t>(packed_count);
            o.src_info = P<int32_t>(src_info);
            o.src_info_stride = src_info_stride;
            o.layout_range = P<int64_t>(layout_range);
            o.slot_k = P<int32_t>(slot_k);
            DispatchRecv(self, o, Launch{block_num, warp_per_block, stream});
          },
          py::arg("packed_x"), py::arg("packed_scales"), py::arg("ue8m0"), py::arg("packed_count"),
          py::arg("src_info"), py::arg("src_info_stride"), py::arg("layout_range"),
          py::arg("slot_k"), py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Wait for every pe's flag and expand the rows into expert rows.)doc")
      .def(
          "combine_send_token_major",
          [](Impl& self, uintptr_t input, int64_t input_row_stride, int64_t input_rows, int dtype,
             uintptr_t weights, uintptr_t src_pos, uintptr_t total_recv, uintptr_t out,
             uintptr_t out_weights, bool fp8_cast, bool fuse, int block_num, int warp_per_block,
             uintptr_t stream, int fp8_block_scale_dim) {
            MORI_CHECK_ARG(dtype >= 0 && dtype <= 3, "combine dtype code ", dtype,
                           " is not 0 (bf16), 1 (fp32), 2 (fp8 e4m3fn) or 3 (float4_e2m1fn_x2)");
            LlCombineArgs a{LlLayout::kTokenMajor,
                            P<const void>(input),
                            input_row_stride,
                            input_rows,
                            static_cast<CombineDtype>(dtype),
                            P<const float>(weights)};
            a.src_pos = P<const int32_t>(src_pos);
            a.out = P<void>(out);
            a.out_weights = P<float>(out_weights);
            a.fp8_cast = fp8_cast;
            a.fp8_block_scale_dim = fp8_block_scale_dim;
            CombineSend(self, a, P<const int32_t>(total_recv), fuse,
                        Launch{block_num, warp_per_block, stream});
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("input_rows"), py::arg("dtype"),
          py::arg("weights"), py::arg("src_pos"), py::arg("total_recv"), py::arg("out"),
          py::arg("out_weights"), py::arg("fp8_cast"), py::arg("fuse"), py::arg("block_num"),
          py::arg("warp_per_block"), py::arg("stream"), py::arg("fp8_block_scale_dim") = 0,
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Return every received row to its source's slot and post the flags;
``total_recv``: the address of the dispatch's row count (int32 [1]);
fp8_block_scale_dim > 0: bf16 rows cross as MORI's fp8_blockwise blocks.)doc")
      .def(
          "combine_send_expert_major",
          [](Impl& self, uintptr_t input, int64_t input_row_stride, uintptr_t src_info,
             int64_t src_info_stride, uintptr_t layout_range, uintptr_t slot_k, uintptr_t topk_idx,
             uintptr_t topk_weights, int64_t num_tokens, uintptr_t out, bool fuse, int block_num,
             int warp_per_block, uintptr_t stream, bool pre_reduce) {
            LlCombineArgs a{LlLayout::kExpertMajor,  P<const void>(input),
                            input_row_stride,        0,
                            CombineDtype::kBFloat16, nullptr};
            a.src_info = P<const int32_t>(src_info);
            a.src_info_stride = src_info_stride;
            a.layout_range = P<const int64_t>(layout_range);
            a.slot_k = P<const int32_t>(slot_k);
            a.topk_idx = P<const int32_t>(topk_idx);
            a.topk_weights = P<const float>(topk_weights);
            a.num_tokens = num_tokens;
            a.out = P<void>(out);
            a.pre_reduce = pre_reduce;
            CombineSend(self, a, nullptr, fuse, Launch{block_num, warp_per_block, stream});
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("src_info"),
          py::arg("src_info_stride"), py::arg("layout_range"), py::arg("slot_k"),
          py::arg("topk_idx"), py::arg("topk_weights"), py::arg("num_tokens"), py::arg("out"),
          py::arg("fuse"), py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::arg("pre_reduce") = false, py::call_guard<py::gil_scoped_release>(),
          R"doc(Return every expert row to its source's (token, slot), or with pre_reduce one
fp32 partial per (token, rank) weighted by the dispatched weights, and post the flags.)doc")
      .def(
          "reject_combine",
          [](Impl& self, const std::string& reason, uintptr_t stream) {
            RejectCombine(self, reason, stream);
          },
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Post this pe's combine flags as rejected, then raise InvalidArgumentError.)doc")
      .def(
          "combine_recv",
          [](Impl& self, int block_num, int warp_per_block, uintptr_t stream) {
            CombineRecv(self, Launch{block_num, warp_per_block, stream});
          },
          py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Wait for every pe's rows of the pending combine and reduce them.)doc")
      .def_property_readonly("num_tokens", &Impl::num_tokens)
      .def_property_readonly("pre_reduce", &Impl::pre_reduce,
                             "Whether combine_standard_moe pre-reduces per rank (LlPreReduce).");
  return cls;
}

}  // namespace

void register_low_latency(py::module_& m) {
  m.def(
      "ll_buffer_layout",
      [](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
         int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
         int64_t recv_capacity) {
        const EpShape shape =
            bind::MakeShape(world_size, rank, max_tokens, top_k, hidden_dim, max_token_type_size,
                            scale_bytes, num_experts_per_rank, recv_capacity);
        LlCheckRecvCapacity(shape);
        const LlBufferLayout l = MakeLlLayout(shape);
        py::dict d;
        d["disp_flag"] = l.disp_flag;
        d["comb_flag"] = l.comb_flag;
        d["disp_over"] = l.disp_over;
        d["state"] = l.state;
        d["disp_tokens"] = l.disp_tokens;
        d["comb_tokens"] = l.comb_tokens;
        d["token_ranks"] = l.token_ranks;
        d["total_bytes"] = l.total_bytes;
        return d;
      },
      MORI_EP_SHAPE_ARGS, py::arg("recv_capacity") = 0,
      R"doc(Byte offsets of the regions of a low-latency op's symmetric block;
``recv_capacity`` = world_size * receive slots per source rank (0: world_size *
max_tokens).)doc");

  BindLowLatency<LowLatencyCpu>(
      m, "LowLatencyCpu",
      R"doc(Low-latency dispatch/combine (fixed slots, double-buffered) on a host heap.)doc")
      .def_property_readonly("dispatch_calls", &LowLatencyCpu::dispatch_calls)
      .def_property_readonly("combine_calls", &LowLatencyCpu::combine_calls)
      .def_property_readonly("dispatch_recv_pending", &LowLatencyCpu::dispatch_recv_pending)
      .def_property_readonly("combine_recv_pending", &LowLatencyCpu::combine_recv_pending);
#if MORI_EP_WITH_CUDA
  BindLowLatency<LowLatencyCuda>(
      m, "LowLatencyCuda",
      R"doc(Low-latency dispatch/combine kernels (fixed slots, double-buffered) on a CUDA heap.)doc")
      .def_property_readonly("copy_engine", &LowLatencyCuda::copy_engine,
                             "Whether dispatches move rows with the copy engines "
                             "(MORI_EP_LL_COPY_ENGINE).")
      .def("timeline", &LowLatencyCuda::Timeline, py::call_guard<py::gil_scoped_release>(),
           R"doc(Per-phase timestamps of the last launch of each phase (dispatch send and
receive, combine send and receive) as text, when the op was built with
``MORI_EP_TIMELINE=1`` in the environment (else ""); synchronises the device. A
measurement aid.)doc");
#endif
}

}  // namespace mori::ep
