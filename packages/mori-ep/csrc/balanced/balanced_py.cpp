// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Bindings of the balanced mode: the planner's host functions and BalancedCpu. Tensors
// cross as addresses; mori.ep.balanced checks dtypes, shapes and devices first. Table
// sets cross as tuples of addresses in the order of PlanTables / RankPlan.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <string>
#include <type_traits>
#include <vector>

#include "balanced/cpu.hpp"
#include "balanced/planner.hpp"
#include "common/bind_py.hpp"
#include "mori/core/timeout.hpp"
#if MORI_EP_WITH_CUDA
#include "balanced/cuda.hpp"
#include "common/launch_api.hpp"
#endif

namespace py = pybind11;

namespace mori::ep {

namespace {

using balanced::PlanShape;
using bind::P;

PlanShape Shape(int ranks, int experts, int64_t tokens, int top_k, int token_padding) {
  return PlanShape{ranks, experts, tokens, top_k, token_padding};
}

balanced::PlanTables Tables(const std::array<uintptr_t, 6>& a) {
  return balanced::PlanTables{P<int32_t>(a[0]), P<int32_t>(a[1]), P<int32_t>(a[2]),
                              P<int32_t>(a[3]), P<int32_t>(a[4]), P<int32_t>(a[5])};
}

balanced::RankPlan Rank(const std::array<uintptr_t, 6>& a) {
  return balanced::RankPlan{P<int32_t>(a[0]), P<int32_t>(a[1]), P<int32_t>(a[2]),
                            P<int32_t>(a[3]), P<int32_t>(a[4]), P<int32_t>(a[5])};
}

#define SHAPE_ARGS                                                           \
  py::arg("ranks"), py::arg("experts"), py::arg("tokens"), py::arg("top_k"), \
      py::arg("token_padding")

// Binds one implementation with the signature both share; a host implementation runs
// each call on the calling thread and ignores the stream and the device.
template <class Impl>
void BindImpl(py::class_<Impl> cls) {
  constexpr bool kCuda = !std::is_same_v<Impl, balanced::BalancedCpu>;
  cls.def(py::init([](int R, int E, int64_t S, int K, int pad, int64_t hidden, int rank,
                      uintptr_t block, int device, double timeout_s) {
            const auto timeout = TimeoutMsFromSeconds(timeout_s, "timeout_s");
            if constexpr (kCuda) {
              return new Impl(Shape(R, E, S, K, pad), hidden, rank, P<void>(block), device,
                              timeout);
            } else {
              return new Impl(Shape(R, E, S, K, pad), hidden, rank, P<void>(block), timeout);
            }
          }),
          SHAPE_ARGS, py::arg("hidden"), py::arg("rank"), py::arg("block"), py::arg("device"),
          py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def(
          "plan",
          [](Impl& self, uintptr_t tpe, uintptr_t topk, const std::string& reason,
             std::array<uintptr_t, 6> tables, uintptr_t dst, uintptr_t stream) {
            if constexpr (kCuda) {
              self.Plan(P<const int32_t>(tpe), P<const int32_t>(topk), reason, Tables(tables),
                        P<int32_t>(dst), stream);
            } else {
              self.Plan(P<const int32_t>(tpe), P<const int32_t>(topk), reason, Tables(tables),
                        P<int32_t>(dst));
            }
          },
          py::arg("tpe"), py::arg("topk"), py::arg("reason"), py::arg("tables"), py::arg("dst"),
          py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def(
          "dispatch",
          [](Impl& self, std::array<uintptr_t, 6> plan, uintptr_t hidden, int64_t row_stride,
             uintptr_t weights, bool fresh, const std::string& reason, uintptr_t stream) {
            if constexpr (kCuda) {
              self.Dispatch(Rank(plan), P<const uint16_t>(hidden), row_stride,
                            P<const float>(weights), fresh, reason, stream);
            } else {
              self.Dispatch(Rank(plan), P<const uint16_t>(hidden), row_stride,
                            P<const float>(weights), fresh, reason);
            }
          },
          py::arg("plan"), py::arg("hidden"), py::arg("row_stride"), py::arg("weights"),
          py::arg("fresh"), py::arg("reason"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "combine",
          [](Impl& self, std::array<uintptr_t, 6> plan, uintptr_t hidden_nvsh,
             uintptr_t weights_nvs, uintptr_t out, uintptr_t out_weights, const std::string& reason,
             uintptr_t stream) {
            if constexpr (kCuda) {
              self.Combine(Rank(plan), P<const uint16_t>(hidden_nvsh), P<const float>(weights_nvs),
                           P<uint16_t>(out), P<float>(out_weights), reason, stream);
            } else {
              self.Combine(Rank(plan), P<const uint16_t>(hidden_nvsh), P<const float>(weights_nvs),
                           P<uint16_t>(out), P<float>(out_weights), reason);
            }
          },
          py::arg("plan"), py::arg("hidden_nvsh"), py::arg("weights_nvs"), py::arg("out"),
          py::arg("out_weights"), py::arg("reason"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "prefetch",
          [](Impl& self, uintptr_t experts_to_copy, const std::vector<uintptr_t>& locals,
             const std::vector<uintptr_t>& pools, const std::vector<int64_t>& bytes,
             const std::string& reason, bool copy_engine, uintptr_t stream) {
            std::vector<const char*> l;
            std::vector<char*> p;
            for (auto a : locals) l.push_back(P<const char>(a));
            for (auto a : pools) p.push_back(P<char>(a));
            if constexpr (kCuda) {
              self.Prefetch(P<const int32_t>(experts_to_copy), l, p, bytes, reason, copy_engine,
                            stream);
            } else {
              self.Prefetch(P<const int32_t>(experts_to_copy), l, p, bytes, reason);
            }
          },
          py::arg("experts_to_copy"), py::arg("locals"), py::arg("pools"), py::arg("bytes"),
          py::arg("reason"), py::arg("copy_engine"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "reduce_grad",
          [](Impl& self, uintptr_t experts_to_copy, const std::vector<uintptr_t>& locals,
             const std::vector<uintptr_t>& pools, const std::vector<int64_t>& elems,
             const std::string& reason, uintptr_t stream) {
            std::vector<float*> l, p;
            for (auto a : locals) l.push_back(P<float>(a));
            for (auto a : pools) p.push_back(P<float>(a));
            if constexpr (kCuda) {
              self.ReduceGrad(P<const int32_t>(experts_to_copy), l, p, elems, reason, stream);
            } else {
              self.ReduceGrad(P<const int32_t>(experts_to_copy), l, p, elems, reason);
            }
          },
          py::arg("experts_to_copy"), py::arg("locals"), py::arg("pools"), py::arg("elems"),
          py::arg("reason"), py::arg("stream"), py::call_guard<py::gil_scoped_release>())
      .def(
          "refuse",
          [](Impl& self, const std::string& op, const std::string& reason, uintptr_t stream) {
            if constexpr (kCuda) {
              self.Refuse(op.c_str(), reason, stream);
            } else {
              self.Refuse(op.c_str(), reason);
            }
          },
          py::arg("op"), py::arg("reason"), py::arg("stream"),
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("calls", &Impl::calls);
}

}  // namespace

void register_balanced(py::module_& m) {
  m.def(
      "balanced_nvs",
      [](int R, int E, int64_t S, int K, int pad) {
        const PlanShape s = Shape(R, E, S, K, pad);
        balanced::CheckPlanShape(s);
        return s.nvs();
      },
      SHAPE_ARGS, "NvS of a balanced plan (refuses a shape the tables cannot encode).");
  m.def(
      "balanced_block_layout",
      [](int R, int E, int64_t S, int K, int pad, int64_t hidden) {
        const balanced::BlockLayout l = balanced::MakeBlockLayout(Shape(R, E, S, K, pad), hidden);
        py::dict d;
        d["hidden"] = l.hidden;
        d["weights"] = l.weights;
        d["dup_src"] = l.dup_src;
        d["counts"] = l.counts;
        d["reasons"] = l.reasons;
        d["entry"] = l.entry;
        d["phase"] = l.phase;
        d["total_bytes"] = l.total_bytes;
        return d;
      },
      SHAPE_ARGS, py::arg("hidden"),
      "Byte offsets of the balanced mode's symmetric block (and its total_bytes).");
  m.def(
      "balanced_plan_tables_cpu",
      [](int R, int E, int64_t S, int K, int pad, uintptr_t tpe, std::array<uintptr_t, 6> out) {
        balanced::PlanTablesCpu(Shape(R, E, S, K, pad), P<const int32_t>(tpe), Tables(out));
      },
      SHAPE_ARGS, py::arg("tpe"), py::arg("tables"), py::call_guard<py::gil_scoped_release>(),
      "Planner steps 1-3 from tpe [R, E] into every rank's tables.");
  m.def(
      "balanced_plan_destinations_cpu",
      [](int R, int E, int64_t S, int K, int pad, uintptr_t tpe, std::array<uintptr_t, 6> tables,
         int rank, uintptr_t topk, uintptr_t dst) {
        balanced::PlanDestinationsCpu(Shape(R, E, S, K, pad), P<const int32_t>(tpe), Tables(tables),
                                      rank, P<const int32_t>(topk), P<int32_t>(dst));
      },
      SHAPE_ARGS, py::arg("tpe"), py::arg("tables"), py::arg("rank"), py::arg("topk"),
      py::arg("dst"), py::call_guard<py::gil_scoped_release>(),
      "Planner step 4: rank's dst [S*K] from its topk [S, K].");
  m.def(
      "balanced_duplicate_tables_cpu",
      [](int R, int E, int64_t S, int K, int pad, uintptr_t dst_all, int dest, uintptr_t dup_src,
         uintptr_t groups, uintptr_t loffs, uintptr_t counts) {
        const PlanShape s = Shape(R, E, S, K, pad);
        balanced::DuplicateSourcesCpu(s, P<const int32_t>(dst_all), dest, P<int32_t>(dup_src));
        balanced::DuplicateGroupsCpu(s.nvs(), P<const int32_t>(dup_src), P<int32_t>(groups),
                                     P<int32_t>(loffs), P<int32_t>(counts));
      },
      SHAPE_ARGS, py::arg("dst_all"), py::arg("dest"), py::arg("dup_src"), py::arg("groups"),
      py::arg("loffs"), py::arg("counts"), py::call_guard<py::gil_scoped_release>(),
      "Rank dest's duplicate groups from every rank's dst [R, S*K].");

#if MORI_EP_WITH_CUDA
  m.def(
      "balanced_plan_cuda",
      [](int R, int E, int64_t S, int K, int pad, uintptr_t tpe, uintptr_t topk, int rank,
         std::array<uintptr_t, 6> tables, uintptr_t dst, uintptr_t error, uintptr_t scratch,
         uintptr_t stream) {
        balanced::LaunchPlanner(
            balanced::PlannerParams{Shape(R, E, S, K, pad), rank, P<const int32_t>(tpe),
                                    P<const int32_t>(topk), Tables(tables), P<int32_t>(dst),
                                    P<int32_t>(error), P<int32_t>(scratch)},
            stream);
      },
      SHAPE_ARGS, py::arg("tpe"), py::arg("topk"), py::arg("rank"), py::arg("tables"),
      py::arg("dst"), py::arg("error"), py::arg("scratch"), py::arg("stream"),
      py::call_guard<py::gil_scoped_release>(),
      "The CUDA planner on `stream` (device pointers; error [4] int32, zero when good; "
      "scratch [balanced_planner_scratch_words] int32).");
  m.def(
      "balanced_planner_scratch_words",
      [](int R, int E, int64_t S, int K, int pad) {
        const PlanShape s = Shape(R, E, S, K, pad);
        balanced::CheckPlanShape(s);
        return balanced::PlannerScratchWords(s);
      },
      SHAPE_ARGS, "int32 words of the CUDA planner's scratch for this shape.");
#endif

  BindImpl(py::class_<balanced::BalancedCpu>(
      m, "BalancedCpu",
      "The balanced mode's data paths on a host heap (the stream is ignored: a call "
      "has finished when it returns)."));
#if MORI_EP_WITH_CUDA
  BindImpl(py::class_<balanced::BalancedCuda>(
      m, "BalancedCuda", "The balanced mode's data paths as CUDA kernels on `stream`."));
#endif
}

}  // namespace mori::ep
