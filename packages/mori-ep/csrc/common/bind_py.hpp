// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// What the binding files of every mode share (included by *_py.cpp only). A mode
// binds its host and its CUDA implementation with one Python-visible signature, so
// that mori.ep calls either the same way: every constructor takes the op's shape as
// the scalars below, the block's address, the CUDA ordinal (ignored on the host), the
// timeout and the receive capacity; every call ends with the launch shape and the
// stream (ignored on the host, whose calls have finished when they return).
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "common/args.hpp"
#include "common/shape.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"

namespace mori::ep::bind {

namespace py = pybind11;

// An address from Python (tensor.data_ptr()) as a typed pointer.
template <typename T>
T* P(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

inline EpShape MakeShape(int world_size, int rank, int64_t max_tokens, int top_k,
                         int64_t hidden_dim, int max_token_type_size, int64_t scale_bytes,
                         int num_experts_per_rank, int64_t recv_capacity) {
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

// The launch every call ends with: block_num blocks of warp_per_block warps on
// `stream` (mori.ep has resolved the config's defaults).
struct Launch {
  int block_num;
  int warp_per_block;
  uintptr_t stream;
};

// The shape arguments of a buffer layout function and of every constructor.
#define MORI_EP_SHAPE_ARGS                                                           \
  py::arg("world_size"), py::arg("rank"), py::arg("max_tokens"), py::arg("top_k"),   \
      py::arg("hidden_dim"), py::arg("max_token_type_size"), py::arg("scale_bytes"), \
      py::arg("num_experts_per_rank")

// Binds the constructor of a native implementation (collective: it runs a heap
// barrier, so the GIL is released). A host implementation takes no device.
template <class Impl>
void DefInit(py::class_<Impl>& cls, const char* doc) {
  cls.def(py::init([](int world_size, int rank, int64_t max_tokens, int top_k, int64_t hidden_dim,
                      int max_token_type_size, int64_t scale_bytes, int num_experts_per_rank,
                      uintptr_t block, int device, double timeout_s, int64_t recv_capacity) {
            const EpShape shape =
                MakeShape(world_size, rank, max_tokens, top_k, hidden_dim, max_token_type_size,
                          scale_bytes, num_experts_per_rank, recv_capacity);
            const auto timeout = TimeoutMsFromSeconds(timeout_s, "timeout_s");
            if constexpr (std::is_constructible_v<Impl, const EpShape&, void*, int,
                                                  std::chrono::milliseconds>) {
              return new Impl(shape, P<void>(block), device, timeout);
            } else {
              return new Impl(shape, P<void>(block), timeout);
            }
          }),
          MORI_EP_SHAPE_ARGS, py::arg("block"), py::arg("device"), py::arg("timeout_s"),
          py::arg("recv_capacity") = 0, py::call_guard<py::gil_scoped_release>(), doc);
}

// A routing handle's snapshot as mori.ep passes it (mori.ep.routing): the addresses of
// src_pos, group_row, token_ranks, token_self_row, total_recv and epoch, then the host
// epoch and num_tokens (RoutingSnapshot's fields in order; a mode reads the ones its
// protocol has).
using RoutingWords = std::optional<std::vector<uint64_t>>;

inline std::optional<RoutingSnapshot> ToRouting(const RoutingWords& w) {
  if (!w) return std::nullopt;
  MORI_CHECK_ARG(w->size() == 8, "a routing snapshot has 8 words, got ", w->size());
  const auto& v = *w;
  return RoutingSnapshot{P<const int32_t>(v[0]),
                         P<const int32_t>(v[1]),
                         P<const uint8_t>(v[2]),
                         P<const int32_t>(v[3]),
                         P<const int32_t>(v[4]),
                         P<const uint64_t>(v[5]),
                         v[6],
                         static_cast<int64_t>(v[7])};
}

}  // namespace mori::ep::bind
