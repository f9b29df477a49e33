// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Bindings of the low-latency dispatch/combine (low_latency_protocol.hpp). Tensors
// cross as addresses; mori.ep.low_latency checks dtypes, shapes and devices first.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "low_latency/cpu.hpp"
#include "mori/core/error.hpp"
#if MORI_EP_WITH_CUDA
#include "low_latency/cuda.hpp"
#endif

namespace py = pybind11;

namespace mori::ep {

namespace {

EpShape MakeLlShape(int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
                    int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
                    int64_t recv_capacity) {
  return EpShape{world_size,
                 rank,
                 max_tokens,
                 top_k,
                 hidden_dim,
                 hidden_dim * max_token_type_size,
                 hidden_dim * std::max(max_token_type_size, 2),
                 scale_bytes,
                 num_experts_per_rank,
                 recv_capacity};
}

template <typename T>
T* P(uintptr_t v) {
  return reinterpret_cast<T*>(v);
}

}  // namespace

void register_low_latency(py::module_& m) {
  m.def(
      "ll_buffer_layout",
      [](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
         int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
         int64_t recv_capacity) {
        const EpShape shape =
            MakeLlShape(world_size, rank, max_tokens, top_k, hidden_dim, max_token_type_size,
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
      py::arg("world_size"), py::arg("rank"), py::arg("max_tokens"), py::arg("top_k"),
      py::arg("hidden_dim"), py::arg("max_token_type_size"), py::arg("scale_bytes"),
      py::arg("num_experts_per_rank"), py::arg("recv_capacity") = 0,
      R"doc(Byte offsets of the regions of a low-latency op's symmetric block;
``recv_capacity`` = world_size * receive slots per source rank (0: world_size *
max_tokens).)doc");

  py::class_<LowLatencyCpu>(
      m, "LowLatencyCpu",
      R"doc(Low-latency dispatch/combine (fixed slots, double-buffered) on a host heap.)doc")
      .def(py::init([](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
                       int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
                       uintptr_t block, double timeout_s, int64_t recv_capacity) {
             return new LowLatencyCpu(
                 MakeLlShape(world_size, rank, max_tokens, top_k, hidden_dim, max_token_type_size,
                             scale_bytes, num_experts_per_rank, recv_capacity),
                 reinterpret_cast<void*>(block),
                 std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
           }),
           py::arg("world_size"), py::arg("rank"), py::arg("max_tokens"), py::arg("top_k"),
           py::arg("hidden_dim"), py::arg("max_token_type_size"), py::arg("scale_bytes"),
           py::arg("num_experts_per_rank"), py::arg("block"), py::arg("timeout_s"),
           py::arg("recv_capacity") = 0, py::call_guard<py::gil_scoped_release>(),
           R"doc(Collective: zeroes this pe's signal words, then a heap barrier.)doc")
      .def(
          "dispatch_send",
          [](LowLatencyCpu& self, int layout, uintptr_t tokens, int64_t token_row_bytes,
             uintptr_t weights, uintptr_t scales, uintptr_t indices, int64_t num_tokens,
             bool fp8_cast, bool round_scale, uint32_t dtype_tag) {
            MORI_CHECK_ARG(layout == 0 || layout == 1, "layout ", layout,
                           " is not 0 (token-major) or 1 (expert-major)");
            self.DispatchSend(LlDispatchArgs{static_cast<LlLayout>(layout), P<const void>(tokens),
                                             token_row_bytes, P<const float>(weights),
                                             P<const void>(scales), P<const int32_t>(indices),
                                             num_tokens, fp8_cast, round_scale, dtype_tag});
          },
          py::arg("layout"), py::arg("tokens"), py::arg("token_row_bytes"), py::arg("weights"),
          py::arg("scales"), py::arg("indices"), py::arg("num_tokens"), py::arg("fp8_cast"),
          py::arg("round_scale"), py::arg("dtype_tag") = 0,
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Write every token into its destinations' slots and post the flags.)doc")
      .def(
          "reject_dispatch",
          [](LowLatencyCpu& self, const std::string& reason) { self.RejectDispatch(reason); },
          py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Post this pe's dispatch flags as rejected, then raise InvalidArgumentError.)doc")
      .def(
          "dispatch_recv_token_major",
          [](LowLatencyCpu& self, uintptr_t out_tokens, uintptr_t out_weights, uintptr_t out_scales,
             uintptr_t out_indices, uintptr_t out_src_pos, uintptr_t total_recv) {
            LlRecvArgs o;
            o.out_tokens = P<void>(out_tokens);
            o.out_weights = P<float>(out_weights);
            o.out_scales = P<void>(out_scales);
            o.out_indices = P<int32_t>(out_indices);
            o.out_src_pos = P<int32_t>(out_src_pos);
            o.total_recv = P<int32_t>(total_recv);
            return self.DispatchRecv(o);
          },
          py::arg("out_tokens"), py::arg("out_weights"), py::arg("out_scales"),
          py::arg("out_indices"), py::arg("out_src_pos"), py::arg("total_recv"),
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Wait for every pe's flag and compact the rows (token-major); returns total_recv.)doc")
      .def(
          "dispatch_recv_expert_major",
          [](LowLatencyCpu& self, uintptr_t packed_x, uintptr_t packed_scales, bool ue8m0,
             uintptr_t packed_count, uintptr_t src_info, int64_t src_info_stride,
             uintptr_t layout_range, uintptr_t slot_k) {
            LlRecvArgs o;
            o.packed_x = P<void>(packed_x);
            o.packed_scales = P<void>(packed_scales);
            o.ue8m0 = ue8m0;
            o.packed_count = P<int32_t>(packed_count);
            o.src_info = P<int32_t>(src_info);
            o.src_info_stride = src_info_stride;
            o.layout_range = P<int64_t>(layout_range);
            o.slot_k = P<int32_t>(slot_k);
            return self.DispatchRecv(o);
          },
          py::arg("packed_x"), py::arg("packed_scales"), py::arg("ue8m0"), py::arg("packed_count"),
          py::arg("src_info"), py::arg("src_info_stride"), py::arg("layout_range"),
          py::arg("slot_k"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Wait for every pe's flag and expand the rows into expert rows.)doc")
      .def(
          "combine_send_token_major",
          [](LowLatencyCpu& self, uintptr_t input, int64_t input_row_stride, int64_t input_rows,
             int dtype, uintptr_t weights, uintptr_t src_pos, int64_t total_recv, uintptr_t out,
             uintptr_t out_weights, bool fp8_cast) {
            MORI_CHECK_ARG(dtype >= 0 && dtype <= 2, "combine dtype code ", dtype,
                           " is not 0 (bf16), 1 (fp32) or 2 (fp8 e4m3fn)");
            LlCombineArgs a{LlLayout::kTokenMajor,
                            P<const void>(input),
                            input_row_stride,
                            input_rows,
                            static_cast<CombineDtype>(dtype),
                            P<const float>(weights)};
            a.src_pos = P<const int32_t>(src_pos);
            a.total_recv = total_recv;
            a.out = P<void>(out);
            a.out_weights = P<float>(out_weights);
            a.fp8_cast = fp8_cast;
            self.CombineSend(a);
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("input_rows"), py::arg("dtype"),
          py::arg("weights"), py::arg("src_pos"), py::arg("total_recv"), py::arg("out"),
          py::arg("out_weights"), py::arg("fp8_cast"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Return every received row to its source's slot and post the flags.)doc")
      .def(
          "combine_send_expert_major",
          [](LowLatencyCpu& self, uintptr_t input, int64_t input_row_stride, uintptr_t src_info,
             int64_t src_info_stride, uintptr_t layout_range, uintptr_t slot_k, uintptr_t topk_idx,
             uintptr_t topk_weights, int64_t num_tokens, uintptr_t out, bool pre_reduce) {
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
            self.CombineSend(a);
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("src_info"),
          py::arg("src_info_stride"), py::arg("layout_range"), py::arg("slot_k"),
          py::arg("topk_idx"), py::arg("topk_weights"), py::arg("num_tokens"), py::arg("out"),
          py::arg("pre_reduce") = false, py::call_guard<py::gil_scoped_release>(),
          R"doc(Return every expert row to its source's (token, slot), or with pre_reduce one
fp32 partial per (token, rank) weighted by the dispatched weights, and post the flags.)doc")
      .def(
          "reject_combine",
          [](LowLatencyCpu& self, const std::string& reason) { self.RejectCombine(reason); },
          py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Post this pe's combine flags as rejected, then raise InvalidArgumentError.)doc")
      .def("combine_recv", &LowLatencyCpu::CombineRecv, py::call_guard<py::gil_scoped_release>(),
           R"doc(Wait for every pe's rows of the pending combine and reduce them.)doc")
      .def_property_readonly("dispatch_calls", &LowLatencyCpu::dispatch_calls)
      .def_property_readonly("combine_calls", &LowLatencyCpu::combine_calls)
      .def_property_readonly("dispatch_recv_pending", &LowLatencyCpu::dispatch_recv_pending)
      .def_property_readonly("combine_recv_pending", &LowLatencyCpu::combine_recv_pending)
      .def_property_readonly("num_tokens", &LowLatencyCpu::num_tokens)
      .def_property_readonly("pre_reduce", &LowLatencyCpu::pre_reduce,
                             "Whether combine_standard_moe pre-reduces per rank (LlPreReduce).");
#if MORI_EP_WITH_CUDA
  py::class_<LowLatencyCuda>(
      m, "LowLatencyCuda",
      R"doc(Low-latency dispatch/combine kernels (fixed slots, double-buffered) on a CUDA heap.)doc")
      .def(py::init([](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
                       int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
                       uintptr_t block, int device, double timeout_s, int64_t recv_capacity) {
             return new LowLatencyCuda(
                 MakeLlShape(world_size, rank, max_tokens, top_k, hidden_dim, max_token_type_size,
                             scale_bytes, num_experts_per_rank, recv_capacity),
                 reinterpret_cast<void*>(block), device,
                 std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
           }),
           py::arg("world_size"), py::arg("rank"), py::arg("max_tokens"), py::arg("top_k"),
           py::arg("hidden_dim"), py::arg("max_token_type_size"), py::arg("scale_bytes"),
           py::arg("num_experts_per_rank"), py::arg("block"), py::arg("device"),
           py::arg("timeout_s"), py::arg("recv_capacity") = 0,
           py::call_guard<py::gil_scoped_release>(),
           R"doc(Collective: zeroes this pe's signal words and state, then a heap barrier.)doc")
      .def(
          "dispatch_send",
          [](LowLatencyCuda& self, int layout, uintptr_t tokens, int64_t token_row_bytes,
             uintptr_t weights, uintptr_t scales, uintptr_t indices, int64_t num_tokens,
             bool fp8_cast, bool round_scale, bool fuse, int block_num, int warp_per_block,
             uintptr_t stream, uint32_t dtype_tag) {
            MORI_CHECK_ARG(layout == 0 || layout == 1, "layout ", layout,
                           " is not 0 (token-major) or 1 (expert-major)");
            self.DispatchSend(LlDispatchArgs{static_cast<LlLayout>(layout), P<const void>(tokens),
                                             token_row_bytes, P<const float>(weights),
                                             P<const void>(scales), P<const int32_t>(indices),
                                             num_tokens, fp8_cast, round_scale, dtype_tag},
                              fuse, LaunchShape{block_num, warp_per_block}, stream);
          },
          py::arg("layout"), py::arg("tokens"), py::arg("token_row_bytes"), py::arg("weights"),
          py::arg("scales"), py::arg("indices"), py::arg("num_tokens"), py::arg("fp8_cast"),
          py::arg("round_scale"), py::arg("fuse"), py::arg("block_num"), py::arg("warp_per_block"),
          py::arg("stream"), py::arg("dtype_tag") = 0, py::call_guard<py::gil_scoped_release>(),
          R"doc(Enqueue the send kernel (or, fuse, defer it into the receive's launch).)doc")
      .def(
          "reject_dispatch",
          [](LowLatencyCuda& self, const std::string& reason, uintptr_t stream) {
            self.RejectDispatch(reason, stream);
          },
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def(
          "dispatch_recv_token_major",
          [](LowLatencyCuda& self, uintptr_t out_tokens, uintptr_t out_weights,
             uintptr_t out_scales, uintptr_t out_indices, uintptr_t out_src_pos,
             uintptr_t total_recv, int block_num, int warp_per_block, uintptr_t stream) {
            LlRecvArgs o;
            o.out_tokens = P<void>(out_tokens);
            o.out_weights = P<float>(out_weights);
            o.out_scales = P<void>(out_scales);
            o.out_indices = P<int32_t>(out_indices);
            o.out_src_pos = P<int32_t>(out_src_pos);
            o.total_recv = P<int32_t>(total_recv);
            self.DispatchRecv(o, LaunchShape{block_num, warp_per_block}, stream);
            return 0;
          },
          py::arg("out_tokens"), py::arg("out_weights"), py::arg("out_scales"),
          py::arg("out_indices"), py::arg("out_src_pos"), py::arg("total_recv"),
          py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "dispatch_recv_expert_major",
          [](LowLatencyCuda& self, uintptr_t packed_x, uintptr_t packed_scales, bool ue8m0,
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
            self.DispatchRecv(o, LaunchShape{block_num, warp_per_block}, stream);
            return 0;
          },
          py::arg("packed_x"), py::arg("packed_scales"), py::arg("ue8m0"), py::arg("packed_count"),
          py::arg("src_info"), py::arg("src_info_stride"), py::arg("layout_range"),
          py::arg("slot_k"), py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "combine_send_token_major",
          [](LowLatencyCuda& self, uintptr_t input, int64_t input_row_stride, int64_t input_rows,
             int dtype, uintptr_t weights, uintptr_t src_pos, uintptr_t total_recv, uintptr_t out,
             uintptr_t out_weights, bool fp8_cast, bool fuse, int block_num, int warp_per_block,
             uintptr_t stream) {
            MORI_CHECK_ARG(dtype >= 0 && dtype <= 2, "combine dtype code ", dtype,
                           " is not 0 (bf16), 1 (fp32) or 2 (fp8 e4m3fn)");
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
            self.CombineSend(a, P<const int32_t>(total_recv), fuse,
                             LaunchShape{block_num, warp_per_block}, stream);
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("input_rows"), py::arg("dtype"),
          py::arg("weights"), py::arg("src_pos"), py::arg("total_recv"), py::arg("out"),
          py::arg("out_weights"), py::arg("fp8_cast"), py::arg("fuse"), py::arg("block_num"),
          py::arg("warp_per_block"), py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def(
          "combine_send_expert_major",
          [](LowLatencyCuda& self, uintptr_t input, int64_t input_row_stride, uintptr_t src_info,
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
            self.CombineSend(a, nullptr, fuse, LaunchShape{block_num, warp_per_block}, stream);
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("src_info"),
          py::arg("src_info_stride"), py::arg("layout_range"), py::arg("slot_k"),
          py::arg("topk_idx"), py::arg("topk_weights"), py::arg("num_tokens"), py::arg("out"),
          py::arg("fuse"), py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::arg("pre_reduce") = false, py::call_guard<py::gil_scoped_release>())
      .def(
          "reject_combine",
          [](LowLatencyCuda& self, const std::string& reason, uintptr_t stream) {
            self.RejectCombine(reason, stream);
          },
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def(
          "combine_recv",
          [](LowLatencyCuda& self, int block_num, int warp_per_block, uintptr_t stream) {
            self.CombineRecv(LaunchShape{block_num, warp_per_block}, stream);
          },
          py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_tokens", &LowLatencyCuda::num_tokens)
      .def_property_readonly("pre_reduce", &LowLatencyCuda::pre_reduce,
                             "Whether combine_standard_moe pre-reduces per rank (LlPreReduce).")
      .def_property_readonly("copy_engine", &LowLatencyCuda::copy_engine,
                             "Whether dispatches move rows with the copy engines "
                             "(MORI_EP_LL_COPY_ENGINE).");
#endif
}

}  // namespace mori::ep
