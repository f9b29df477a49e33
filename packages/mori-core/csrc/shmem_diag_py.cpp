// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Diagnostic/benchmark kernels of the CUDA symmetric heap (mori/shmem/diag.hpp),
// used by the GPU tests and mori.core.bench_shmem. Addresses and streams are
// integers (tensor.data_ptr(), torch.cuda.Stream.cuda_stream). Launches are
// asynchronous on `stream`; synchronize it before reading results. Bound even
// without CUDA (they raise NotSupportedError), so the module's surface is stable.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/diag.hpp"
#include "mori/shmem/shmem.hpp"

namespace py = pybind11;

namespace mori::python {
namespace {

namespace diag = shmem::diag;

diag::CopyLaunch MakeLaunch(const std::string& scope, int blocks, int threads, uintptr_t stream) {
  diag::CopyLaunch launch = diag::ParseScope(scope);
  launch.blocks = blocks;
  launch.threads_per_block = threads;
  launch.stream = stream;
  return launch;
}

}  // namespace

void register_shmem_diag(py::module_& m) {
  m.def(
      "_shmem_put_kernel",
      [](uintptr_t dst_sym, uintptr_t src, size_t nbytes, int pe, const std::string& scope,
         int blocks, int threads, uintptr_t stream) {
        diag::PutKernel(shmem::GetDeviceContext(), reinterpret_cast<void*>(dst_sym),
                        reinterpret_cast<const void*>(src), nbytes, pe,
                        MakeLaunch(scope, blocks, threads, stream));
      },
      py::arg("dst_sym"), py::arg("src"), py::arg("nbytes"), py::arg("pe"),
      py::arg("scope") = "block", py::arg("blocks") = 1, py::arg("threads") = 512,
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>(),
      R"doc(Kernel put of nbytes from local device address src to pe's copy of the
symmetric address dst_sym. scope: "thread", "warp" or "block" (each thread/warp/
block moves a contiguous chunk with the device API's Put<Scope>), optionally with
"_nbi" (Put<Scope>_nbi + Quiet). The bytes are split evenly across `blocks`
blocks of `threads` threads. Asynchronous on `stream` (cudaStream_t as int).)doc");

  m.def(
      "_shmem_get_kernel",
      [](uintptr_t dst, uintptr_t src_sym, size_t nbytes, int pe, const std::string& scope,
         int blocks, int threads, uintptr_t stream) {
        diag::GetKernel(shmem::GetDeviceContext(), reinterpret_cast<void*>(dst),
                        reinterpret_cast<const void*>(src_sym), nbytes, pe,
                        MakeLaunch(scope, blocks, threads, stream));
      },
      py::arg("dst"), py::arg("src_sym"), py::arg("nbytes"), py::arg("pe"),
      py::arg("scope") = "block", py::arg("blocks") = 1, py::arg("threads") = 512,
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>(),
      R"doc(Kernel get of nbytes from pe's copy of the symmetric address src_sym into
local device address dst; scope, blocks, threads, stream as for _shmem_put_kernel.)doc");

  m.def(
      "_shmem_signal_stress",
      [](uintptr_t buf_sym, uintptr_t flags_sym, uintptr_t mismatches, size_t slot_bytes, int slots,
         int64_t rounds, int peer, bool sender, int threads, double timeout_s, uintptr_t stream) {
        diag::SignalStressArgs a;
        a.buf_sym = reinterpret_cast<void*>(buf_sym);
        a.flags_sym = reinterpret_cast<uint64_t*>(flags_sym);
        a.mismatches = reinterpret_cast<uint64_t*>(mismatches);
        a.slot_bytes = slot_bytes;
        a.slots = slots;
        a.rounds = rounds;
        a.peer = peer;
        a.sender = sender;
        a.threads_per_block = threads;
        a.timeout_ns = OptionalTimeoutNs(timeout_s, "timeout_s");
        a.stream = stream;
        diag::SignalStressKernel(shmem::GetDeviceContext(), a);
      },
      py::arg("buf_sym"), py::arg("flags_sym"), py::arg("mismatches"), py::arg("slot_bytes"),
      py::arg("slots"), py::arg("rounds"), py::arg("peer"), py::arg("sender"),
      py::arg("threads") = 256, py::arg("timeout_s") = 0.0, py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(),
      R"doc(Data-then-flag ordering stress with `peer` (one block per side; call on
both pes, one with sender=True). buf_sym: symmetric, >= slots * slot_bytes bytes;
flags_sym: symmetric, 2 uint64 words, zero on both pes; mismatches: local device
uint64 that the receiver increments per wrong 8-byte word. Each of `rounds`
rounds: the sender PutBlock's a pattern of the round into a ring slot on the
peer and SignalSet's flags[0]; the receiver waits, verifies and acks in flags[1].
timeout_s > 0 makes each wait trap (with a printed message) after that long.)doc");

  m.def(
      "_shmem_barrier_loop",
      [](int iters, uintptr_t stream, double timeout_s) {
        diag::BarrierLoopKernel(shmem::GetDeviceContext(), iters,
                                OptionalTimeoutNs(timeout_s, "timeout_s"), stream);
      },
      py::arg("iters"), py::arg("stream") = 0, py::arg("timeout_s") = 0.0,
      py::call_guard<py::gil_scoped_release>(),
      R"doc(One kernel running `iters` device barriers over all pes (BarrierAllBlock)
on `stream`; collective (every pe launches the same count).)doc");

  m.def("_gpu_globaltimer_ns", &diag::GlobalTimerNs, py::arg("device"),
        py::call_guard<py::gil_scoped_release>(),
        R"doc(The GPU's global timer in ns, read by a kernel on `device` (one clock
for every process on that GPU); synchronizes.)doc");

  m.def(
      "_trap_probe",
      [](int device, uint64_t at_ns, double max_wait_s, int tag, int blocks, int threads,
         uintptr_t stream) {
        diag::TrapProbeKernel(device, at_ns, OptionalTimeoutNs(max_wait_s, "max_wait_s"), tag,
                              blocks, threads, stream);
      },
      py::arg("device"), py::arg("at_ns"), py::arg("max_wait_s") = 10.0, py::arg("tag") = 0,
      py::arg("blocks") = 1, py::arg("threads") = 128, py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(),
      R"doc(Launches a kernel on `device` (`stream`) that waits until the GPU's global
timer reaches at_ns (at most max_wait_s), prints "mori trap probe <tag>: trapping at
..." and traps as mori's kernels do: the launch fails, and the process's CUDA context
with it. Processes given one at_ns trap at the same moment. Returns at once.)doc");
}

}  // namespace mori::python
