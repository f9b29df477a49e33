// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Bindings of the CPU collectives. Tensors cross as addresses; mori.ccl.communicator
// checks devices, dtypes, shapes and sizes first.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "collectives.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "protocol.hpp"
#include "protocol_cuda.hpp"
#if MORI_CCL_WITH_CUDA
#include "collectives_cuda.hpp"
#endif

namespace py = pybind11;

namespace mori::ccl {

namespace {

AllReduceAlgorithm ParseAlgorithm(const std::string& name) {
  if (name == "one_shot") return AllReduceAlgorithm::kOneShot;
  if (name == "two_shot") return AllReduceAlgorithm::kTwoShot;
  MORI_THROW(InvalidArgumentError, "algorithm '", name, "' is not one_shot or two_shot");
}

CollectiveKind ParseKind(const std::string& name) {
  for (CollectiveKind k :
       {CollectiveKind::kBarrier, CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
        CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll, CollectiveKind::kBroadcast}) {
    if (name == CollectiveKindName(k)) return k;
  }
  MORI_THROW(InvalidArgumentError, "unknown collective '", name, "'");
}

CudaAlgorithm ParseCudaAlgorithm(const std::string& name) {
  if (name == "one_shot") return CudaAlgorithm::kOneShot;
  if (name == "two_shot") return CudaAlgorithm::kTwoShot;
  if (name == "sm") return CudaAlgorithm::kSm;
  if (name == "copy_engine") return CudaAlgorithm::kCopyEngine;
  if (name == "one_shot_ll") return CudaAlgorithm::kOneShotLL;
  MORI_THROW(InvalidArgumentError, "algorithm '", name,
             "' is not one_shot, two_shot, one_shot_ll, sm or copy_engine");
}

template <typename T>
T* Ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

}  // namespace

void register_collectives(py::module_& m) {
  m.def(
      "ccl_block_bytes",
      [](int world_size, size_t max_bytes) {
        MORI_CHECK_ARG(world_size >= 1, "world_size ", world_size, " must be >= 1");
        return MakeBlockLayout(world_size, max_bytes).total_bytes;
      },
      py::arg("world_size"), py::arg("max_bytes"),
      R"doc(Bytes of a communicator's symmetric block (protocol.hpp) for ``max_bytes``.)doc");
  m.def(
      "ccl_cuda_block_bytes",
      [](int world_size, size_t max_bytes) {
        MORI_CHECK_ARG(world_size >= 1, "world_size ", world_size, " must be >= 1");
        return MakeCudaLayout(world_size, max_bytes).total_bytes;
      },
      py::arg("world_size"), py::arg("max_bytes"),
      R"doc(Bytes of a CUDA communicator's symmetric block (protocol_cuda.hpp).)doc");
  m.attr("cuda_max_blocks") = kMaxBlocks;
  m.attr("cuda_max_world_size") = kMaxCudaWorld;

  py::class_<CommunicatorCpu>(m, "CommunicatorCpu",
                              R"doc(The collectives on a host symmetric heap.)doc")
      .def(py::init([](uintptr_t block, size_t max_bytes, double timeout_s,
                       const std::vector<int>& pes, bool zero_copy) {
             return new CommunicatorCpu(Ptr<void>(block), max_bytes,
                                        TimeoutMsFromSeconds(timeout_s, "timeout_s"), pes,
                                        zero_copy);
           }),
           py::arg("block"), py::arg("max_bytes"), py::arg("timeout_s"),
           py::arg("pes") = std::vector<int>{}, py::arg("zero_copy") = true,
           py::call_guard<py::gil_scoped_release>(),
           R"doc(Collective: zeroes this pe's signal words, then a heap barrier. ``pes``: the
ranks as ascending heap pes of this node (empty: every pe). ``zero_copy``: inputs in the
heap are read by the peers in place; false: staged.)doc")
      .def(
          "all_reduce",
          [](CommunicatorCpu& self, uintptr_t src, uintptr_t dst, size_t count,
             const std::string& dtype, const std::string& op, const std::string& algorithm) {
            const DataType t = ParseDataType(dtype);
            const ReduceOp o = ParseReduceOp(op);
            const AllReduceAlgorithm a = ParseAlgorithm(algorithm);
            py::gil_scoped_release release;
            self.AllReduce(Ptr<const void>(src), Ptr<void>(dst), count, t, o, a);
          },
          py::arg("src"), py::arg("dst"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("algorithm"), R"doc(dst = op over ranks of src (count elements).)doc")
      .def(
          "all_gather",
          [](CommunicatorCpu& self, uintptr_t src, uintptr_t dst, size_t bytes,
             const std::string& dtype) {
            const DataType t = ParseDataType(dtype);
            py::gil_scoped_release release;
            self.AllGather(Ptr<const void>(src), Ptr<void>(dst), bytes, t);
          },
          py::arg("src"), py::arg("dst"), py::arg("bytes"), py::arg("dtype"),
          R"doc(dst[r * bytes:] = rank r's src.)doc")
      .def(
          "reduce_scatter",
          [](CommunicatorCpu& self, uintptr_t src, uintptr_t dst, size_t count,
             const std::string& dtype, const std::string& op) {
            const DataType t = ParseDataType(dtype);
            const ReduceOp o = ParseReduceOp(op);
            py::gil_scoped_release release;
            self.ReduceScatter(Ptr<const void>(src), Ptr<void>(dst), count, t, o);
          },
          py::arg("src"), py::arg("dst"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          R"doc(dst (count elements) = op over ranks of their src shard ``rank``.)doc")
      .def(
          "all_to_all",
          [](CommunicatorCpu& self, uintptr_t src, uintptr_t dst, size_t row_bytes,
             const std::vector<int64_t>& in_rows, const std::vector<int64_t>& out_rows,
             const std::string& dtype) {
            const DataType t = ParseDataType(dtype);
            MORI_CHECK_ARG(in_rows.size() == out_rows.size(), "in_rows has ", in_rows.size(),
                           " entries, out_rows ", out_rows.size());
            py::gil_scoped_release release;
            self.AllToAll(Ptr<const void>(src), Ptr<void>(dst), row_bytes, in_rows.data(),
                          out_rows.data(), t);
          },
          py::arg("src"), py::arg("dst"), py::arg("row_bytes"), py::arg("in_rows"),
          py::arg("out_rows"), py::arg("dtype"),
          R"doc(Rank s sends in_rows[d] rows to rank d; dst holds out_rows[s] rows from each s.)doc")
      .def(
          "broadcast",
          [](CommunicatorCpu& self, uintptr_t buf, size_t bytes, const std::string& dtype,
             int root) {
            const DataType t = ParseDataType(dtype);
            py::gil_scoped_release release;
            self.Broadcast(Ptr<void>(buf), bytes, t, root);
          },
          py::arg("buf"), py::arg("bytes"), py::arg("dtype"), py::arg("root"),
          R"doc(buf on every rank = buf of rank ``root``.)doc")
      .def("barrier", &CommunicatorCpu::Barrier, py::call_guard<py::gil_scoped_release>(),
           R"doc(Returns once every rank has entered it.)doc")
      .def(
          "reject",
          [](CommunicatorCpu& self, const std::string& kind, const std::string& reason) {
            const CollectiveKind k = ParseKind(kind);
            py::gil_scoped_release release;
            self.Reject(k, reason);
          },
          py::arg("kind"), py::arg("reason"),
          R"doc(Take part in a call as a rejecting rank, then raise InvalidArgumentError(reason).)doc")
      .def_property_readonly("epoch", &CommunicatorCpu::epoch)
      .def_property_readonly("max_bytes", &CommunicatorCpu::max_bytes);
#if MORI_CCL_WITH_CUDA
  py::class_<CommunicatorCuda>(m, "CommunicatorCuda",
                               R"doc(The collectives on a CUDA symmetric heap, on a stream.)doc")
      .def(py::init([](uintptr_t block, size_t max_bytes, int device, double timeout_s,
                       int max_blocks, const std::vector<int>& pes, bool zero_copy) {
             return new CommunicatorCuda(Ptr<void>(block), max_bytes, device,
                                         TimeoutMsFromSeconds(timeout_s, "timeout_s"), max_blocks,
                                         pes, zero_copy);
           }),
           py::arg("block"), py::arg("max_bytes"), py::arg("device"), py::arg("timeout_s"),
           py::arg("max_blocks"), py::arg("pes") = std::vector<int>{}, py::arg("zero_copy") = true,
           py::call_guard<py::gil_scoped_release>(),
           R"doc(Collective: zeroes the signal words, synchronises the device, heap barrier.
``pes``: the ranks as ascending heap pes of this node (empty: every pe). ``zero_copy``:
inputs in the heap are read by the peers in place (SM algorithms); false: staged.)doc")
      .def(
          "all_reduce",
          [](CommunicatorCuda& self, uintptr_t src, uintptr_t dst, size_t count,
             const std::string& dtype, const std::string& op, const std::string& algorithm,
             int max_blocks, uintptr_t stream) {
            const DataType t = ParseDataType(dtype);
            const ReduceOp o = ParseReduceOp(op);
            const CudaAlgorithm a = ParseCudaAlgorithm(algorithm);
            py::gil_scoped_release release;
            self.AllReduce(Ptr<const void>(src), Ptr<void>(dst), count, t, o, a, max_blocks,
                           stream);
          },
          py::arg("src"), py::arg("dst"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("algorithm"), py::arg("max_blocks"), py::arg("stream"),
          R"doc(Enqueue dst = op over ranks of src (count elements) on ``stream``.)doc")
      .def(
          "all_gather",
          [](CommunicatorCuda& self, uintptr_t src, uintptr_t dst, size_t bytes,
             const std::string& dtype, const std::string& algorithm, int max_blocks,
             uintptr_t stream) {
            const DataType t = ParseDataType(dtype);
            const CudaAlgorithm a = ParseCudaAlgorithm(algorithm);
            py::gil_scoped_release release;
            self.AllGather(Ptr<const void>(src), Ptr<void>(dst), bytes, t, a, max_blocks, stream);
          },
          py::arg("src"), py::arg("dst"), py::arg("bytes"), py::arg("dtype"), py::arg("algorithm"),
          py::arg("max_blocks"), py::arg("stream"),
          R"doc(Enqueue dst[r * bytes:] = rank r's src ("sm" or "copy_engine").)doc")
      .def(
          "reduce_scatter",
          [](CommunicatorCuda& self, uintptr_t src, uintptr_t dst, size_t count,
             const std::string& dtype, const std::string& op, int max_blocks, uintptr_t stream) {
            const DataType t = ParseDataType(dtype);
            const ReduceOp o = ParseReduceOp(op);
            py::gil_scoped_release release;
            self.ReduceScatter(Ptr<const void>(src), Ptr<void>(dst), count, t, o, max_blocks,
                               stream);
          },
          py::arg("src"), py::arg("dst"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("max_blocks"), py::arg("stream"),
          R"doc(Enqueue dst (count elements) = op over ranks of their src shard ``rank``.)doc")
      .def(
          "all_to_all",
          [](CommunicatorCuda& self, uintptr_t src, uintptr_t dst, size_t row_bytes,
             int64_t src_rows, int64_t dst_rows, uintptr_t in_splits, uintptr_t out_splits,
             const std::string& dtype, const std::string& algorithm, int max_blocks,
             uintptr_t stream) {
            const DataType t = ParseDataType(dtype);
            const CudaAlgorithm a = ParseCudaAlgorithm(algorithm);
            py::gil_scoped_release release;
            self.AllToAll(Ptr<const void>(src), Ptr<void>(dst), row_bytes, src_rows, dst_rows,
                          Ptr<const int64_t>(in_splits), Ptr<const int64_t>(out_splits), t, a,
                          max_blocks, stream);
          },
          py::arg("src"), py::arg("dst"), py::arg("row_bytes"), py::arg("src_rows"),
          py::arg("dst_rows"), py::arg("in_splits"), py::arg("out_splits"), py::arg("dtype"),
          py::arg("algorithm"), py::arg("max_blocks"), py::arg("stream"),
          R"doc(Enqueue the all-to-all(v); splits are device int64 addresses or 0 (equal).)doc")
      .def(
          "broadcast",
          [](CommunicatorCuda& self, uintptr_t buf, size_t bytes, const std::string& dtype,
             int root, int max_blocks, uintptr_t stream) {
            const DataType t = ParseDataType(dtype);
            py::gil_scoped_release release;
            self.Broadcast(Ptr<void>(buf), bytes, t, root, max_blocks, stream);
          },
          py::arg("buf"), py::arg("bytes"), py::arg("dtype"), py::arg("root"),
          py::arg("max_blocks"), py::arg("stream"),
          R"doc(Enqueue buf on every rank = buf of rank ``root``.)doc")
      .def("barrier", &CommunicatorCuda::Barrier, py::arg("stream"),
           py::call_guard<py::gil_scoped_release>(),
           R"doc(Enqueue a barrier: later work on the stream runs once every rank entered it.)doc")
      .def("reject", &CommunicatorCuda::Reject, py::arg("reason"), py::arg("stream"),
           py::call_guard<py::gil_scoped_release>(),
           R"doc(Post a rejection of the next call (peers trap naming this rank), then raise
InvalidArgumentError(reason).)doc")
      .def("blocks_for", &CommunicatorCuda::BlocksFor, py::arg("bytes"), py::arg("max_blocks"),
           R"doc(The grid a call of ``bytes`` gets with ``max_blocks`` (<= 0: the default).)doc")
      .def_property_readonly("calls", &CommunicatorCuda::calls)
      .def_property_readonly("zero_copy", &CommunicatorCuda::zero_copy)
      .def_property_readonly("zero_copy_calls", &CommunicatorCuda::zero_copy_calls)
      .def_property_readonly("max_bytes", &CommunicatorCuda::max_bytes)
      .def_property_readonly("max_blocks", &CommunicatorCuda::max_blocks)
      .def_property_readonly("ll_max_bytes", &CommunicatorCuda::ll_max_bytes);
#endif
}

}  // namespace mori::ccl
