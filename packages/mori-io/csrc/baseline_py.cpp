// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// Python bindings of the benchmark baselines (the limits the backends are judged by).
#include "baseline_py.hpp"

#include "baseline/gpu_copy_baseline.hpp"
#include "baseline/socket_baseline.hpp"
#include "shm/cma_copy.hpp"

namespace py = pybind11;

namespace mori::io {

void register_baseline(py::module_& m) {
  m.def(
      "raw_socket_stream",
      [](uint64_t msg_size, uint64_t count, bool ack_each, int sock_buf_bytes) {
        SocketStreamResult r;
        {
          py::gil_scoped_release nogil;
          r = RawSocketStream(msg_size, count, ack_each, sock_buf_bytes);
        }
        return py::dict(py::arg("seconds") = r.seconds, py::arg("bytes") = r.bytes,
                        py::arg("sender_cpu_s") = r.sender_cpu_s,
                        py::arg("receiver_cpu_s") = r.receiver_cpu_s);
      },
      py::arg("msg_size"), py::arg("count"), py::arg("ack_each") = false,
      py::arg("sock_buf_bytes") = 0,
      R"doc(Stream ``count`` messages of ``msg_size`` bytes over a loopback TCP connection
between two native threads with blocking send/recv: the TCP backend's physical limit.
``ack_each``: the receiver answers each message with one byte and the sender waits
for it. ``sock_buf_bytes`` > 0 sets SO_SNDBUF/SO_RCVBUF (0: kernel autotuning).
Returns {seconds, bytes, sender_cpu_s, receiver_cpu_s}; releases the GIL; a socket
that stalls for 10 s raises TransportError.)doc");

  m.def(
      "memcpy_stream",
      [](uint64_t size, uint64_t count) {
        MemcpyResult r;
        {
          py::gil_scoped_release nogil;
          r = MemcpyStream(size, count);
        }
        return py::dict(py::arg("seconds") = r.seconds, py::arg("bytes") = r.bytes);
      },
      py::arg("size"), py::arg("count"),
      R"doc(``count`` memcpy calls of ``size`` bytes between two buffers of this process
(pages touched first): the SHM backend's limit. Returns {seconds, bytes}.)doc");

  m.def("cuda_copy_seconds", &CudaCopySeconds, py::arg("src_dev"), py::arg("dst_dev"),
        py::arg("size"), py::arg("batch"), py::arg("iters"), py::arg("sync_each"),
        py::arg("per_transfer") = false, py::call_guard<py::gil_scoped_release>(),
        R"doc(Seconds for ``iters`` rounds moving ``batch`` x ``size`` bytes from GPU
``src_dev`` to GPU ``dst_dev``: the P2P backend's limit. The same GPU on both sides is
a same-device cudaMemcpyAsync (device to device), two GPUs cudaMemcpyPeerAsync with
peer access enabled. A round is one copy of the contiguous batch, or ``batch`` copies
of ``size`` bytes with ``per_transfer`` (the runtime's call rate, not the GPU's
bandwidth, at small sizes). ``sync_each``: synchronise after every round, else once at
the end. Releases the GIL; NotSupportedError in a build without CUDA.)doc");
}

}  // namespace mori::io
