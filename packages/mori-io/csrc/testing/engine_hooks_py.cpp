// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// Test hooks of the engine's pure parts (test builds only, mori.io._C._testing): the
// hello credential and SipHash-2-4, the notice ring under many producers, the backend
// rule as a pure function, the P2P export's wire form and the submission ledger alone.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ledger/submission_ledger.hpp"
#include "mori/core/error.hpp"
#include "p2p/p2p_backend.hpp"
#include "registry/backend_select.hpp"
#include "samehost/notice_ring.hpp"
#include "testing/testing_py.hpp"
#include "wire/secret.hpp"

namespace py = pybind11;

namespace mori::io::testing {
namespace {

py::tuple ChoiceTuple(const BackendChoice& c) {
  return py::make_tuple(BackendTypeName(c.backend), c.reason);
}

}  // namespace

void register_engine_hooks(py::module_& m) {
  // The wire-level credential of hellos, for peers that speak the protocol by hand
  // (tests) and for checking SipHash-2-4 against its published vectors.
  m.def(
      "initiator_credential",
      [](py::bytes initiator_secret, py::bytes target_secret, py::bytes key) {
        return py::bytes(InitiatorCredential(initiator_secret, target_secret, key));
      },
      py::arg("initiator_secret"), py::arg("target_secret"), py::arg("key"),
      "The 16 bytes a hello carries after the key: a MAC of the target's secret and the "
      "key under the initiator's engine secret.");
  m.def(
      "siphash24",
      [](py::bytes key, py::bytes data) {
        std::string k = key, d = data;
        MORI_CHECK_ARG(k.size() == 16, "siphash24: key of ", k.size(), " bytes (expected 16)");
        return SipHash24(reinterpret_cast<const unsigned char*>(k.data()),
                         reinterpret_cast<const unsigned char*>(d.data()), d.size());
      },
      py::arg("key"), py::arg("data"), "SipHash-2-4 of data under a 16-byte key.");
  m.def(
      "notice_ring_stress",
      [](uint32_t capacity, int producers, uint64_t per_producer) {
        // `producers` threads push records (uid = producer << 40 | i) into one ring while
        // this thread drains it; a full ring is retried. Then every record must have
        // arrived exactly once, each producer's in its own order.
        MORI_CHECK_ARG(producers >= 1 && producers <= 64, "producers ", producers);
        const uint64_t bytes = NoticeRing::BytesFor(capacity);
        std::vector<uint64_t> mem(bytes / 8 + 1, 0);
        void* base = mem.data();
        NoticeRing::Init(base, bytes, capacity);
        uint64_t full = 0;
        std::vector<NoticeRecord> got;
        {
          py::gil_scoped_release nogil;
          std::atomic<uint64_t> refusals{0};
          std::vector<std::thread> threads;
          for (int p = 0; p < producers; ++p) {
            threads.emplace_back([&, p] {
              for (uint64_t i = 0; i < per_producer; ++i) {
                NoticeRecord r{(uint64_t(p) << 40) | i, uint64_t(p), i * 7};
                while (!NoticeRing::Push(base, r)) {
                  refusals.fetch_add(1, std::memory_order_relaxed);
                  std::this_thread::yield();
                }
              }
            });
          }
          uint64_t head = 0;
          const uint64_t total = per_producer * static_cast<uint64_t>(producers);
          while (got.size() < total) {
            if (NoticeRing::Drain(base, capacity, &head, 1024, &got) == 0)
              std::this_thread::yield();
          }
          for (auto& t : threads) t.join();
          NoticeRing::Drain(base, capacity, &head, 1024, &got);  // nothing more may come
          full = refusals.load();
        }
        std::vector<uint64_t> next(static_cast<size_t>(producers), 0);
        uint64_t out_of_order = 0, malformed = 0;
        for (const NoticeRecord& r : got) {
          const uint64_t p = r.uid >> 40, i = r.uid & ((uint64_t{1} << 40) - 1);
          if (p >= static_cast<uint64_t>(producers) || r.mem_id != p || r.bytes != i * 7) {
            ++malformed;
            continue;
          }
          if (i != next[p]) ++out_of_order;
          next[p] = i + 1;
        }
        return py::dict(py::arg("received") = got.size(), py::arg("malformed") = malformed,
                        py::arg("out_of_order") = out_of_order, py::arg("full_refusals") = full);
      },
      py::arg("capacity"), py::arg("producers"), py::arg("per_producer"),
      R"doc(Test support: many threads push into one notice ring while one drains it.)doc");
  m.def(
      "notice_ring_fill",
      [](uint32_t capacity, uint64_t pushes) {
        // Single-threaded: how many of `pushes` records a ring of `capacity` takes before
        // a drain, how many it gives back, and how many it takes after.
        const uint64_t bytes = NoticeRing::BytesFor(capacity);
        std::vector<uint64_t> mem(bytes / 8 + 1, 0);
        NoticeRing::Init(mem.data(), bytes, capacity);
        uint64_t accepted = 0;
        for (uint64_t i = 0; i < pushes; ++i) accepted += NoticeRing::Push(mem.data(), {i, 1, 2});
        std::vector<NoticeRecord> got;
        uint64_t head = 0;
        NoticeRing::Drain(mem.data(), capacity, &head, pushes + 1, &got);
        uint64_t again = 0;
        for (uint64_t i = 0; i < pushes; ++i) again += NoticeRing::Push(mem.data(), {i, 1, 2});
        return py::make_tuple(accepted, got.size(), again);
      },
      py::arg("capacity"), py::arg("pushes"));

  m.def(
      "choose_backend",
      [](const std::string& local_host_id, const std::string& remote_host_id,
         MemoryLocationType local_loc, MemoryLocationType remote_loc, bool local_shm,
         bool remote_shm, bool cma_ok, const std::string& cma_reason,
         const std::string& override_text, bool local_p2p, bool remote_p2p, bool local_rdma,
         bool remote_rdma, const std::string& shm_path, const std::string& shm_path_why) {
        BackendChoiceInput in;
        in.local_host_id = local_host_id;
        in.remote_host_id = remote_host_id;
        in.local_loc = local_loc;
        in.remote_loc = remote_loc;
        in.local_shm = local_shm;
        in.remote_shm = remote_shm;
        in.cma_ok = cma_ok;
        in.cma_reason = cma_reason;
        in.override_choice = ParseBackendOverride(override_text);
        in.local_p2p = local_p2p;
        in.remote_p2p = remote_p2p;
        in.local_rdma = local_rdma;
        in.remote_rdma = remote_rdma;
        if (shm_path == "cma") {
          in.shm_path = ShmPath::kCma;
        } else if (shm_path == "mapped") {
          in.shm_path = ShmPath::kMapped;
        } else {
          MORI_CHECK_ARG(shm_path.empty(), "shm_path '", shm_path,
                         "' is not one of '', 'cma', 'mapped'");
        }
        in.shm_path_why = shm_path_why;
        return ChoiceTuple(ChooseBackend(in));
      },
      py::arg("local_host_id"), py::arg("remote_host_id"), py::arg("local_loc"),
      py::arg("remote_loc"), py::arg("local_shm"), py::arg("remote_shm"), py::arg("cma_ok") = true,
      py::arg("cma_reason") = std::string(), py::arg("override") = std::string(),
      py::arg("local_p2p") = false, py::arg("remote_p2p") = false, py::arg("local_rdma") = false,
      py::arg("remote_rdma") = false, py::arg("shm_path") = std::string(),
      py::arg("shm_path_why") = std::string(),
      R"doc(The engine's per-pair backend choice as a pure function: (name, reason).
``shm_path``: "" (no region named), "cma" or "mapped" (the SHM copy a region pair takes).)doc");

  // The P2P export's wire form, for tests (hardware independent).
  m.def(
      "pack_p2p_export",
      [](int kind, int pid, const py::bytes& uuid, uint64_t region_addr, uint64_t region_size,
         uint64_t region_offset, uint64_t map_size, const py::bytes& handle,
         const std::vector<std::tuple<int, uint64_t, uint64_t>>& pieces) {
        P2pExport e;
        e.kind = static_cast<P2pExport::Kind>(kind);
        e.pid = pid;
        std::string u = uuid, h = handle;
        MORI_CHECK_ARG(u.size() == 16 && h.size() == 64, "uuid must be 16 bytes, handle 64");
        std::memcpy(e.gpu_uuid, u.data(), 16);
        std::memcpy(e.ipc_handle, h.data(), 64);
        e.region_addr = region_addr;
        e.region_size = region_size;
        e.region_offset = region_offset;
        e.map_size = map_size;
        for (const auto& [fd, off, size] : pieces) e.pieces.push_back({fd, off, size});
        return py::bytes(PackP2pExport(e));
      },
      py::arg("kind"), py::arg("pid"), py::arg("uuid"), py::arg("region_addr"),
      py::arg("region_size"), py::arg("region_offset"), py::arg("map_size"), py::arg("handle"),
      py::arg("pieces"));
  m.def(
      "unpack_p2p_export",
      [](const py::bytes& data) {
        std::string d = data;
        P2pExport e = UnpackP2pExport(d.data(), d.size());
        py::list pieces;
        for (const auto& p : e.pieces) pieces.append(py::make_tuple(p.fd, p.offset, p.size));
        py::dict r;
        r["kind"] = int(e.kind);
        r["pid"] = e.pid;
        r["uuid"] = py::bytes(reinterpret_cast<const char*>(e.gpu_uuid), 16);
        r["region_addr"] = e.region_addr;
        r["region_size"] = e.region_size;
        r["region_offset"] = e.region_offset;
        r["map_size"] = e.map_size;
        r["handle"] = py::bytes(reinterpret_cast<const char*>(e.ipc_handle), 64);
        r["pieces"] = pieces;
        return r;
      },
      py::arg("data"));

  // The ledger alone, for tests of its boundary behaviour.
  py::class_<SubmissionLedger>(m, "SubmissionLedger")
      .def(py::init<size_t>(), py::arg("admission_limit"))
      .def_property_readonly("admission_limit", &SubmissionLedger::admission_limit)
      .def_property_readonly("live", &SubmissionLedger::live)
      .def("admit",
           [](SubmissionLedger& l) -> py::object {
             uint64_t id = l.Admit();
             if (id == SubmissionLedger::kNoRecord) return py::none();
             return py::int_(id);
           })
      .def("release", &SubmissionLedger::Release, py::arg("record_id"))
      .def(
          "stress",
          [](SubmissionLedger& l, int threads, int iters) {
            // Each thread admits and releases one record at a time: at most `threads`
            // live, so every refusal is wrong. Returns the refusals.
            std::atomic<uint64_t> refused{0};
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; ++t) {
              pool.emplace_back([&] {
                for (int i = 0; i < iters; ++i) {
                  uint64_t id = l.Admit();
                  if (id == SubmissionLedger::kNoRecord) {
                    refused.fetch_add(1, std::memory_order_relaxed);
                    continue;
                  }
                  l.Release(id);
                }
              });
            }
            for (auto& th : pool) th.join();
            return refused.load();
          },
          py::arg("threads"), py::arg("iters"), py::call_guard<py::gil_scoped_release>())
      .def(
          "is_live", [](SubmissionLedger& l, uint64_t id) { return l.Lookup(id) != nullptr; },
          py::arg("record_id"));
}

}  // namespace mori::io::testing
