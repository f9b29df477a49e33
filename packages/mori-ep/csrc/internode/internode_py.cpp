// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Bindings of the inter-node dispatch/combine implementation (InterNodeCpu), with the
// call signature of the intra-node ones (intranode_py.cpp) so that mori.ep calls every
// mode one way. Tensors cross as addresses; mori.ep.internode checks them first.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/bind_py.hpp"
#include "internode/cpu.hpp"
#include "internode/protocol.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/shmem.hpp"
#if MORI_EP_WITH_CUDA
#include "internode/cuda.hpp"
#endif

namespace py = pybind11;

namespace mori::ep {

namespace {

using bind::P;

py::dict BytesDict(const InterNodeBytes& b) {
  py::dict d;
  d["algo_token"] = b.algo_token;
  d["physical_token"] = b.physical_token;
  d["physical_rows"] = b.physical_rows;
  d["forwarded_rows"] = b.forwarded_rows;
  d["link_token"] = b.link.token;
  d["link_meta"] = b.link.meta;
  d["link_signal"] = b.link.signal;
  d["link_writes"] = b.link.writes;
  d["link_signals"] = b.link.signals;
  d["moved"] = b.moved;
  return d;
}

// Routing snapshots: bind::ToRouting (group_row and token_self_row are not read here).
using bind::ToRouting;

InterNodeKind ToKind(int kind) {
  MORI_CHECK_ARG(kind >= 1 && kind <= 3, "inter-node kernel type ", kind,
                 " is not 1 (InterNode), 2 (InterNodeV1) or 3 (InterNodeV1LL)");
  return static_cast<InterNodeKind>(kind);
}

}  // namespace

void register_internode(py::module_& m) {
  m.def(
      "heap_all_gather_i64",
      [](const std::vector<int64_t>& mine) {
        auto boot = shmem::GetBootstrap();
        const int n = boot->WorldSize();
        std::vector<int64_t> all(mine.size() * n);
        boot->AllGather(mine.data(), mine.size() * sizeof(int64_t), all.data());
        std::vector<std::vector<int64_t>> rows(n);
        for (int r = 0; r < n; ++r) {
          rows[r].assign(all.begin() + r * mine.size(), all.begin() + (r + 1) * mine.size());
        }
        return rows;
      },
      py::arg("mine"),
      R"doc(Collective over the heap's bootstrap: every pe's int64 list (same length on
every pe), in pe order. What the config check uses when some pes are on other hosts
(not load/store reachable, so the heap cannot carry it).)doc");
  m.def(
      "internode_buffer_layout",
      [](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
         int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
         int64_t recv_capacity, int kind, int local_size, bool device) {
        MORI_CHECK_ARG(local_size >= 1 && world_size % local_size == 0, "pes per node ", local_size,
                       " must divide world_size ", world_size);
        const EpShape s =
            bind::MakeShape(world_size, rank, max_tokens, top_k, hidden_dim, max_token_type_size,
                            scale_bytes, num_experts_per_rank, recv_capacity);
        const InterNodeLayout l =
            MakeInterNodeLayout(s, NodeMap{world_size, local_size}, ToKind(kind), device);
        py::dict d;
        d["recv_tokens"] = l.recv_tokens;
        d["recv_weights"] = l.recv_weights;
        d["recv_scales"] = l.recv_scales;
        d["recv_indices"] = l.recv_indices;
        d["recv_src_pos"] = l.recv_src_pos;
        d["total_recv"] = l.total_recv;
        d["token_ranks"] = l.token_ranks;
        d["state"] = l.state;  // the CUDA kernels' call numbers (size 0 without `device`)
        d["total_bytes"] = l.total_bytes;
        return d;
      },
      MORI_EP_SHAPE_ARGS, py::arg("recv_capacity"), py::arg("kind"), py::arg("local_size"),
      py::arg("device") = false,
      R"doc(Byte offsets of the regions of an inter-node op's symmetric block that mori.ep
reads (internode/protocol.hpp), and its total size. ``kind``: MORI's kernel type value
(1 InterNode, 2 InterNodeV1, 3 InterNodeV1LL); ``local_size``: pes per node;
``device``: the CUDA kernels' block (with their staging regions).)doc");

  py::class_<InterNodeCpu>(m, "InterNodeCpu",
                           R"doc(Inter-node dispatch/combine on a host symmetric heap.)doc")
      .def(py::init([](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
                       int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
                       uintptr_t block, int device, double timeout_s, int64_t recv_capacity,
                       int kind, int local_size, const std::string& link) {
             (void)device;
             MORI_CHECK_ARG(link == "proxy" || link == "heap", "inter-node link '", link,
                            "' is not 'proxy' or 'heap'");
             const EpShape shape = bind::MakeShape(world_size, rank, max_tokens, top_k, hidden_dim,
                                                   max_token_type_size, scale_bytes,
                                                   num_experts_per_rank, recv_capacity);
             return new InterNodeCpu(shape, P<void>(block),
                                     TimeoutMsFromSeconds(timeout_s, "timeout_s"), ToKind(kind),
                                     local_size, link == "proxy");
           }),
           MORI_EP_SHAPE_ARGS, py::arg("block"), py::arg("device"), py::arg("timeout_s"),
           py::arg("recv_capacity"), py::arg("kind"), py::arg("local_size"),
           py::arg("link") = "proxy", py::call_guard<py::gil_scoped_release>(),
           R"doc(Collective: zeroes this pe's signal words, builds the inter-node link (the
first op of the process builds its proxy), then a heap barrier. ``kind``: MORI's kernel type value; ``local_size``: pes per node (pes
[n * L, (n + 1) * L) are node n); ``link``: "proxy" (mori-core's proxy thread and its
transports) or "heap" (copies through the host heap; every pe must be mapped).)doc")
      .def(
          "dispatch",
          [](InterNodeCpu& self, uintptr_t tokens, int64_t token_row_bytes, uintptr_t weights,
             uintptr_t scales, uintptr_t indices, int64_t num_tokens, int block_num,
             int warp_per_block, uintptr_t stream, uintptr_t rank_masks, uint32_t row_tag) {
            (void)block_num, (void)warp_per_block, (void)stream;
            self.Dispatch(DispatchArgs{P<const void>(tokens), token_row_bytes,
                                       P<const float>(weights), P<const void>(scales),
                                       P<const int32_t>(indices), num_tokens,
                                       P<const uint32_t>(rank_masks), row_tag});
          },
          py::arg("tokens"), py::arg("token_row_bytes"), py::arg("weights"), py::arg("scales"),
          py::arg("indices"), py::arg("num_tokens"), py::arg("block_num"),
          py::arg("warp_per_block"), py::arg("stream"), py::arg("rank_masks") = 0,
          py::arg("row_tag") = 0, py::call_guard<py::gil_scoped_release>(),
          R"doc(Collective dispatch over raw addresses (intra-node's signature; the launch
shape and stream are ignored on the host).)doc")
      .def(
          "reject_dispatch",
          [](InterNodeCpu& self, const std::string& reason, uintptr_t) {
            self.RejectDispatch(reason);
          },
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Take part in the dispatch as a rejecting pe, then raise InvalidArgumentError(reason).)doc")
      .def(
          "combine",
          [](InterNodeCpu& self, uintptr_t input, int64_t input_row_stride, int64_t input_rows,
             int dtype, uintptr_t weights, uintptr_t out, uintptr_t out_weights, bool fp8_cast,
             int block_num, int warp_per_block, uintptr_t stream,
             const std::optional<std::vector<uint64_t>>& routing, int fp8_block_scale_dim) {
            (void)block_num, (void)warp_per_block, (void)stream;
            MORI_CHECK_ARG(dtype >= 0 && dtype <= 3, "combine dtype code ", dtype,
                           " is not 0 (bf16), 1 (fp32), 2 (fp8 e4m3fn) or 3 (float4_e2m1fn_x2)");
            const auto r = ToRouting(routing);
            self.Combine(CombineArgs{P<const void>(input), input_row_stride, input_rows,
                                     static_cast<CombineDtype>(dtype), P<const float>(weights),
                                     P<void>(out), P<float>(out_weights), fp8_cast,
                                     r ? &*r : nullptr, fp8_block_scale_dim});
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("input_rows"), py::arg("dtype"),
          py::arg("weights"), py::arg("out"), py::arg("out_weights"), py::arg("fp8_cast"),
          py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::arg("routing") = py::none(), py::arg("fp8_block_scale_dim") = 0,
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Collective combine over raw addresses (intra-node's signature).)doc")
      .def(
          "reject_combine",
          [](InterNodeCpu& self, const std::string& reason, uintptr_t,
             const std::optional<std::vector<uint64_t>>& routing) {
            const auto r = ToRouting(routing);
            self.RejectCombine(reason, r ? &*r : nullptr);
          },
          py::arg("reason"), py::arg("stream"), py::arg("routing") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Take part in the combine as a rejecting pe, then raise InvalidArgumentError(reason).)doc")
      .def(
          "bytes",
          [](const InterNodeCpu& self, const std::string& phase) {
            MORI_CHECK_ARG(phase == "dispatch" || phase == "combine", "phase ", phase,
                           " is not 'dispatch' or 'combine'");
            return BytesDict(phase == "dispatch" ? self.dispatch_bytes() : self.combine_bytes());
          },
          py::arg("phase"),
          R"doc(This pe's bytes of its last dispatch or combine: algo_token (token rows x
destination nodes, this node included; InterNode: x destination pes), physical_token
(the crossings to other nodes), physical_rows, forwarded_rows (as a gateway), link_*
(what it put on its inter-node link: token payload, metadata, signal bytes, command
counts) and moved (what the link's transport reports it moved).)doc")
      .def(
          "replay_link",
          [](InterNodeCpu& self, const std::string& phase) {
            MORI_CHECK_ARG(phase == "dispatch" || phase == "combine", "phase ", phase,
                           " is not 'dispatch' or 'combine'");
            return self.ReplayLink(phase == "combine");
          },
          py::arg("phase"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Collective: the inter-node leg of this pe's last dispatch or combine alone,
replayed (the same link writes and signals, payload from a scratch buffer, signals
changing no word) from a heap barrier until everything landed everywhere; returns its
wall-clock seconds. Leaves scratch bytes in the op's buffers: call it between a combine
and the next dispatch.)doc")
      .def_property_readonly("link_name", &InterNodeCpu::link_name)
      .def_property_readonly("local_size",
                             [](const InterNodeCpu& s) { return s.nodes().local_size; })
      .def_property_readonly("num_tokens", &InterNodeCpu::num_tokens)
      .def_property_readonly("epoch", &InterNodeCpu::epoch)
      .def_property_readonly("combined_epoch", &InterNodeCpu::combined_epoch)
      .def_property_readonly("combine_pending", &InterNodeCpu::combine_pending);

#if MORI_EP_WITH_CUDA
  py::class_<InterNodeCuda>(m, "InterNodeCuda",
                            R"doc(Inter-node dispatch/combine kernels on a CUDA symmetric heap
(InterNode; internode/cuda.hpp).)doc")
      .def(py::init([](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
                       int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
                       uintptr_t block, int device, double timeout_s, int64_t recv_capacity,
                       int kind, int local_size) {
             const EpShape shape = bind::MakeShape(world_size, rank, max_tokens, top_k, hidden_dim,
                                                   max_token_type_size, scale_bytes,
                                                   num_experts_per_rank, recv_capacity);
             return new InterNodeCuda(shape, P<void>(block), device,
                                      TimeoutMsFromSeconds(timeout_s, "timeout_s"), ToKind(kind),
                                      local_size);
           }),
           MORI_EP_SHAPE_ARGS, py::arg("block"), py::arg("device"), py::arg("timeout_s"),
           py::arg("recv_capacity"), py::arg("kind"), py::arg("local_size"),
           py::call_guard<py::gil_scoped_release>(),
           R"doc(Collective: zeroes this pe's signal words and private regions, builds the
process's proxy for kernel producers (the first op), then a heap barrier. ``block``: a
symmetric block of internode_buffer_layout(..., device=True)'s total_bytes.)doc")
      .def(
          "dispatch",
          [](InterNodeCuda& self, uintptr_t tokens, int64_t token_row_bytes, uintptr_t weights,
             uintptr_t scales, uintptr_t indices, int64_t num_tokens, int block_num,
             int warp_per_block, uintptr_t stream, uintptr_t rank_masks, uint32_t row_tag) {
            self.Dispatch(
                DispatchArgs{P<const void>(tokens), token_row_bytes, P<const float>(weights),
                             P<const void>(scales), P<const int32_t>(indices), num_tokens,
                             P<const uint32_t>(rank_masks), row_tag},
                LaunchShape{block_num, warp_per_block}, stream);
          },
          py::arg("tokens"), py::arg("token_row_bytes"), py::arg("weights"), py::arg("scales"),
          py::arg("indices"), py::arg("num_tokens"), py::arg("block_num"),
          py::arg("warp_per_block"), py::arg("stream"), py::arg("rank_masks") = 0,
          py::arg("row_tag") = 0, py::call_guard<py::gil_scoped_release>(),
          R"doc(Enqueues the dispatch kernel on ``stream`` (one block of warp_per_block warps).)doc")
      .def(
          "reject_dispatch",
          [](InterNodeCuda& self, const std::string& reason, uintptr_t stream) {
            self.RejectDispatch(reason, stream);
          },
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
          R"doc(Post a rejection for the next call (the peers' kernels trap naming this rank),
then raise InvalidArgumentError(reason).)doc")
      .def(
          "combine",
          [](InterNodeCuda& self, uintptr_t input, int64_t input_row_stride, int64_t input_rows,
             int dtype, uintptr_t weights, uintptr_t out, uintptr_t out_weights, bool fp8_cast,
             int block_num, int warp_per_block, uintptr_t stream,
             const std::optional<std::vector<uint64_t>>& routing, int fp8_block_scale_dim) {
            MORI_CHECK_ARG(dtype >= 0 && dtype <= 2, "combine dtype code ", dtype,
                           " is not 0 (bf16), 1 (fp32) or 2 (fp8 e4m3fn)");
            const auto r = ToRouting(routing);
            self.Combine(CombineArgs{P<const void>(input), input_row_stride, input_rows,
                                     static_cast<CombineDtype>(dtype), P<const float>(weights),
                                     P<void>(out), P<float>(out_weights), fp8_cast,
                                     r ? &*r : nullptr, fp8_block_scale_dim},
                         LaunchShape{block_num, warp_per_block}, stream);
          },
          py::arg("input"), py::arg("input_row_stride"), py::arg("input_rows"), py::arg("dtype"),
          py::arg("weights"), py::arg("out"), py::arg("out_weights"), py::arg("fp8_cast"),
          py::arg("block_num"), py::arg("warp_per_block"), py::arg("stream"),
          py::arg("routing") = py::none(), py::arg("fp8_block_scale_dim") = 0,
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Enqueues the combine kernel on ``stream``.)doc")
      .def(
          "reject_combine",
          [](InterNodeCuda& self, const std::string& reason, uintptr_t stream,
             const std::optional<std::vector<uint64_t>>& routing) {
            const auto r = ToRouting(routing);
            self.RejectCombine(reason, stream, r ? &*r : nullptr);
          },
          py::arg("reason"), py::arg("stream"), py::arg("routing") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          R"doc(Post a rejected combine vote (the peers' kernels trap naming this rank), then
raise InvalidArgumentError(reason).)doc")
      .def(
          "bytes",
          [](InterNodeCuda& self, const std::string& phase) {
            MORI_CHECK_ARG(phase == "dispatch" || phase == "combine", "phase ", phase,
                           " is not 'dispatch' or 'combine'");
            InterNodeBytes b;
            {
              py::gil_scoped_release nogil;
              b = self.Bytes(phase == "dispatch");
            }
            return BytesDict(b);
          },
          py::arg("phase"),
          R"doc(As InterNodeCpu.bytes, counted by the kernels (synchronises the last call's
stream); ``moved``: the proxy's bytes since that call was enqueued.)doc")
      .def_property_readonly("link_name", &InterNodeCuda::link_name)
      .def_property_readonly("local_size",
                             [](const InterNodeCuda& s) { return s.nodes().local_size; })
      .def_property_readonly("num_tokens", &InterNodeCuda::num_tokens)
      .def_property_readonly("epoch", &InterNodeCuda::epoch)
      .def_property_readonly("combined_epoch", &InterNodeCuda::combined_epoch)
      .def_property_readonly("combine_pending", &InterNodeCuda::combine_pending);
#endif
}

}  // namespace mori::ep
