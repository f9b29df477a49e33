// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// Python bindings of the transfer engine: the only file of the engine that knows pybind11.
#include <pybind11/native_enum.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstring>
#include <vector>

#include "engine/io_engine.hpp"
#include "engine_py.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "p2p/p2p_backend.hpp"
#include "p2p/p2p_transport.hpp"
#include "rdma/rdma_backend.hpp"
#include "samehost/same_host.hpp"
#include "shm/shm_transport.hpp"

namespace py = pybind11;

namespace mori::io {
namespace {

using StatePtr = std::shared_ptr<TransferState>;

// Batch offsets and sizes: a sequence of ints, or a 1-D buffer of integers (a numpy
// array, array.array) copied without a Python object per element.
std::vector<uint64_t> AsU64(const py::object& o, const char* what) {
  if (!PyObject_CheckBuffer(o.ptr())) return o.cast<std::vector<uint64_t>>();
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(o).request();
  std::string fmt = info.format;
  char code = fmt.empty() ? '?' : fmt.back();
  bool is_signed = std::strchr("bhilq", code) != nullptr;
  bool is_unsigned = std::strchr("BHILQ", code) != nullptr;
  MORI_CHECK_ARG(info.ndim == 1 && (is_signed || is_unsigned), "batch: ", what,
                 " must be a 1-D sequence of integers (buffer format '", fmt, "', ", info.ndim,
                 " dimension(s))");
  std::vector<uint64_t> out(static_cast<size_t>(info.shape[0]));
  const char* base = static_cast<const char*>(info.ptr);
  for (size_t i = 0; i < out.size(); ++i) {
    const char* p = base + static_cast<ptrdiff_t>(i) * info.strides[0];
    int64_t v = 0;
    uint64_t u = 0;
    switch (info.itemsize) {
      case 1:
        is_signed ? v = *reinterpret_cast<const int8_t*>(p)
                  : u = *reinterpret_cast<const uint8_t*>(p);
        break;
      case 2:
        is_signed ? v = *reinterpret_cast<const int16_t*>(p)
                  : u = *reinterpret_cast<const uint16_t*>(p);
        break;
      case 4:
        is_signed ? v = *reinterpret_cast<const int32_t*>(p)
                  : u = *reinterpret_cast<const uint32_t*>(p);
        break;
      case 8:
        is_signed ? v = *reinterpret_cast<const int64_t*>(p)
                  : u = *reinterpret_cast<const uint64_t*>(p);
        break;
      default:
        MORI_THROW(InvalidArgumentError, "batch: ", what, ": ", info.itemsize, "-byte integers");
    }
    MORI_CHECK_ARG(!is_signed || v >= 0, "batch: ", what, "[", i, "] = ", v, " is negative");
    out[i] = is_signed ? static_cast<uint64_t>(v) : u;
  }
  return out;
}

std::vector<TransferSpan> Spans(const py::object& lo_obj, const py::object& ro_obj,
                                const py::object& sizes_obj) {
  std::vector<uint64_t> lo = AsU64(lo_obj, "local_offsets");
  std::vector<uint64_t> ro = AsU64(ro_obj, "remote_offsets");
  std::vector<uint64_t> sizes = AsU64(sizes_obj, "sizes");
  MORI_CHECK_ARG(lo.size() == ro.size() && lo.size() == sizes.size(), "batch: local_offsets (",
                 lo.size(), "), remote_offsets (", ro.size(), ") and sizes (", sizes.size(),
                 ") must have the same length");
  std::vector<TransferSpan> spans(lo.size());
  for (size_t i = 0; i < lo.size(); ++i) spans[i] = {lo[i], ro[i], sizes[i]};
  return spans;
}

py::tuple ChoiceTuple(const BackendChoice& c) {
  return py::make_tuple(BackendTypeName(c.backend), c.reason);
}

// The Python enum member of `v` (StatusCode, StatusDetail), one object per value made
// once (the GIL held): a native IntEnum's cast is a call into Python that costs more
// than the call it answers. Leaked on purpose, so that no object is released after the
// interpreter ended.
template <typename E>
py::object EnumObject(E v) {
  static auto* cache = new std::array<py::object, 32>();
  const auto i = static_cast<uint32_t>(v);
  if (i >= cache->size()) return py::cast(v);
  py::object& o = (*cache)[i];
  if (!o) o = py::cast(v);
  return o;
}

}  // namespace

void register_engine(py::module_& m) {
  // Python IntEnums (the stubs' types): comparing a code is then an int comparison, not
  // a call into the extension as for a pybind11 enum, a cost a small same-host transfer
  // pays on every wait.
  py::native_enum<StatusCode>(m, "StatusCode", "enum.IntEnum",
                              "Transfer status codes: MORI's names and numbers.")
      .value("SUCCESS", StatusCode::SUCCESS)
      .value("INIT", StatusCode::INIT)
      .value("IN_PROGRESS", StatusCode::IN_PROGRESS)
      .value("ERR_INVALID_ARGS", StatusCode::ERR_INVALID_ARGS)
      .value("ERR_NOT_FOUND", StatusCode::ERR_NOT_FOUND)
      .value("ERR_RDMA_OP", StatusCode::ERR_RDMA_OP)
      .value("ERR_BAD_STATE", StatusCode::ERR_BAD_STATE)
      .value("ERR_GPU_OP", StatusCode::ERR_GPU_OP)
      .finalize();

  py::native_enum<StatusDetail>(m, "StatusDetail", "enum.IntEnum", R"doc(
mori's finer reason behind a StatusCode (TransferStatus.Detail()). ERR_OUT_OF_BOUNDS
reports as ERR_INVALID_ARGS; ERR_TRANSPORT, ERR_PEER_LOST and ERR_TIMEOUT as
ERR_RDMA_OP; the others as the StatusCode of the same name and number.)doc")
      .value("SUCCESS", StatusDetail::SUCCESS)
      .value("INIT", StatusDetail::INIT)
      .value("IN_PROGRESS", StatusDetail::IN_PROGRESS)
      .value("ERR_INVALID_ARGS", StatusDetail::ERR_INVALID_ARGS)
      .value("ERR_NOT_FOUND", StatusDetail::ERR_NOT_FOUND)
      .value("ERR_TRANSPORT", StatusDetail::ERR_TRANSPORT)
      .value("ERR_BAD_STATE", StatusDetail::ERR_BAD_STATE)
      .value("ERR_GPU_OP", StatusDetail::ERR_GPU_OP)
      .value("ERR_OUT_OF_BOUNDS", StatusDetail::ERR_OUT_OF_BOUNDS)
      .value("ERR_PEER_LOST", StatusDetail::ERR_PEER_LOST)
      .value("ERR_TIMEOUT", StatusDetail::ERR_TIMEOUT)
      .finalize();
  // MORI's pybind11 enum members are all true, SUCCESS (0) included; an IntEnum's 0 is
  // false, which breaks code that tests a code's truth. Comparisons stay int ones.
  for (const char* name : {"StatusCode", "StatusDetail"}) {
    py::object cls = m.attr(name);
    cls.attr("__bool__") = py::cpp_function([](const py::object&) { return true; },
                                            py::is_method(cls), py::name("__bool__"));
  }

  py::enum_<MemoryLocationType>(m, "MemoryLocationType", "Where registered memory lives.")
      .value("Unknown", MemoryLocationType::Unknown)
      .value("CPU", MemoryLocationType::CPU)
      .value("GPU", MemoryLocationType::GPU);

  py::class_<TransferState, StatePtr>(m, "TransferStatus", R"doc(
The status of one transfer (or batch), with MORI's methods. The engine finishes it
exactly once; Wait/WaitFor release the GIL.)doc")
      .def(py::init<>())
      // The predicates poll (TransferState::Poll): a TCP write whose waiter would read
      // its answer itself is read once, without blocking, when polled instead.
      .def("Code",
           [](TransferState& s) {
             s.Poll();
             return EnumObject(s.Code());
           })
      .def(
          "Detail",
          [](TransferState& s) {
            s.Poll();
            return EnumObject(s.Detail());
          },
          "mori's finer reason (StatusDetail), e.g. ERR_PEER_LOST behind ERR_RDMA_OP.")
      .def("Message", &TransferState::Message)
      .def("Init", &TransferState::Init)
      .def("InProgress",
           [](TransferState& s) {
             s.Poll();
             return s.InProgress();
           })
      .def("Succeeded",
           [](TransferState& s) {
             s.Poll();
             return s.Succeeded();
           })
      .def("Failed",
           [](TransferState& s) {
             s.Poll();
             return s.Failed();
           })
      .def("SetCode", &TransferState::SetCode, py::arg("code"))
      .def("SetMessage", &TransferState::SetMessage, py::arg("message"))
      .def("Update", &TransferState::Update, py::arg("code"), py::arg("message"),
           "Set code and message unless a failure is already recorded (first failure wins).")
      // A finished status returns without releasing the GIL (most small same-host
      // transfers have finished when they are waited for; the release and re-acquire
      // would cost more than the check).
      .def(
          "Wait",
          [](TransferState& s) {
            if (!s.InProgress()) return;
            py::gil_scoped_release nogil;
            s.WaitFor(-1);
          },
          R"doc(Block while IN_PROGRESS. Bounded for the engine's transfers: a lost peer fails
the transfer within its timeout.)doc")
      .def(
          "WaitFor",
          [](TransferState& s, double timeout_ms) {
            const int64_t ms = WaitTimeoutMs(timeout_ms, "timeout_ms");
            if (s.InProgress()) {
              py::gil_scoped_release nogil;
              s.WaitFor(ms);
            }
            return EnumObject(s.Code());
          },
          py::arg("timeout_ms") = -1,
          R"doc(Block while IN_PROGRESS, up to timeout_ms milliseconds (negative: no limit;
0: poll once; inf or above a year: a year; NaN is refused). Returns the StatusCode, still IN_PROGRESS when the time ran out.)doc")
      .def("__repr__", [](const TransferState& s) {
        std::string r = StrCat("TransferStatus(", StatusCodeName(s.Code()));
        if (s.Failed()) r += StrCat(" [", StatusDetailName(s.Detail()), "], '", s.Message(), "'");
        return r + ")";
      });

  // One span, submitted without the GIL.
  auto single = [](Session& s, Op op, uint64_t lo, uint64_t ro, uint64_t size, uint64_t uid) {
    TransferSpan span{lo, ro, size};
    py::gil_scoped_release nogil;
    return s.Transfer(op, &span, 1, uid);
  };
  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(
          "transfer",
          [single](Session& s, bool write, uint64_t lo, uint64_t ro, uint64_t size, uint64_t uid) {
            return single(s, write ? Op::kWrite : Op::kRead, lo, ro, size, uid);
          },
          py::arg("write"), py::arg("local_offset"), py::arg("remote_offset"), py::arg("size"),
          py::arg("uid"))
      // IOEngineSession.write/read with their Python signature, which the session
      // object exposes directly: a single small transfer then pays no Python frame.
      .def(
          "write",
          [single](Session& s, uint64_t lo, uint64_t ro, uint64_t size, uint64_t uid) {
            return single(s, Op::kWrite, lo, ro, size, uid);
          },
          py::arg("local_offset"), py::arg("remote_offset"), py::arg("size"),
          py::arg("transfer_uid"))
      .def(
          "read",
          [single](Session& s, uint64_t lo, uint64_t ro, uint64_t size, uint64_t uid) {
            return single(s, Op::kRead, lo, ro, size, uid);
          },
          py::arg("local_offset"), py::arg("remote_offset"), py::arg("size"),
          py::arg("transfer_uid"))
      .def(
          "batch_transfer",
          [](Session& s, bool write, const py::object& lo, const py::object& ro,
             const py::object& sizes, uint64_t uid) {
            std::vector<TransferSpan> spans = Spans(lo, ro, sizes);
            py::gil_scoped_release nogil;
            return s.Transfer(write ? Op::kWrite : Op::kRead, spans.data(), spans.size(), uid);
          },
          py::arg("write"), py::arg("local_offsets"), py::arg("remote_offsets"), py::arg("sizes"),
          py::arg("uid"))
      .def("alive", &Session::Alive)
      .def(
          "backend",
          [](Session& s) {
            BackendChoice c;
            {
              py::gil_scoped_release nogil;
              c = s.Backend();
            }
            return ChoiceTuple(c);
          },
          R"doc((name, reason): the backend this session's transfers use.)doc");

  // The native configs: their default constructors hold the one copy of each default,
  // which mori.io's config dataclasses take their field defaults from.
  py::class_<TcpBackendConfig>(m, "TcpBackendConfig", "The native TcpBackendConfig.")
      .def(py::init<>())
      .def_readwrite("num_worker_threads", &TcpBackendConfig::num_worker_threads)
      .def_readwrite("qp_per_transfer", &TcpBackendConfig::qp_per_transfer)
      .def_readwrite("enable_chunking", &TcpBackendConfig::enable_chunking)
      .def_readwrite("chunk_size", &TcpBackendConfig::chunk_size)
      .def_readwrite("peer_timeout_ms", &TcpBackendConfig::peer_timeout_ms)
      .def_readwrite("sock_buf_bytes", &TcpBackendConfig::sock_buf_bytes)
      .def_readwrite("transfer_timeout_ms", &TcpBackendConfig::transfer_timeout_ms)
      .def_readwrite("idle_timeout_ms", &TcpBackendConfig::idle_timeout_ms)
      .def_readwrite("max_pending_hellos", &TcpBackendConfig::max_pending_hellos)
      .def_readwrite("max_connections_per_peer", &TcpBackendConfig::max_connections_per_peer)
      .def_readwrite("max_inbound_statuses", &TcpBackendConfig::max_inbound_statuses)
      .def_readwrite("max_inbound_status_bytes", &TcpBackendConfig::max_inbound_status_bytes)
      .def_readwrite("enable_notification", &TcpBackendConfig::enable_notification);
  py::class_<P2pBackendConfig>(m, "P2pBackendConfig", "The native P2pBackendConfig.")
      .def(py::init<>())
      .def_readwrite("num_streams", &P2pBackendConfig::num_streams)
      .def_readwrite("max_blocks", &P2pBackendConfig::max_blocks)
      .def_readwrite("kernel_min_spans", &P2pBackendConfig::kernel_min_spans)
      .def_readwrite("kernel_max_mean_span", &P2pBackendConfig::kernel_max_mean_span);

  py::class_<RemoteRegion>(m, "RemoteRegion", R"doc(
A region of a remote engine as its MemoryDesc names it: the engine's key, the region's id
there, its size in bytes, where it lives and its capability (the target refuses requests
without it). Transports that learn the target's registered size bound transfers by that
instead.)doc")
      .def(py::init([](std::string key, uint64_t mem_id, uint64_t size, MemoryLocationType loc,
                       uint64_t capability) {
             return RemoteRegion{std::move(key), mem_id, size, loc, capability};
           }),
           py::arg("engine_key"), py::arg("mem_id"), py::arg("size"),
           py::arg("loc") = MemoryLocationType::CPU, py::kw_only(), py::arg("capability") = 0)
      .def_readonly("engine_key", &RemoteRegion::engine_key)
      .def_readonly("mem_id", &RemoteRegion::mem_id)
      .def_readonly("size", &RemoteRegion::size)
      .def_readonly("loc", &RemoteRegion::loc)
      .def_readonly("capability", &RemoteRegion::capability);

  py::class_<PeerDesc>(m, "RemoteEngine", R"doc(
What register_remote_engine needs of a remote EngineDesc: its key and address, its host
identity and pid (same-host paths), the backends it created and its secret (presented in
every hello; without it the remote refuses the connections).)doc")
      .def(py::init([](std::string key, std::string host, uint16_t port, std::string host_id,
                       int pid, bool remote_shm, bool remote_p2p, bool remote_rdma,
                       py::bytes secret) {
             return PeerDesc{std::move(key), std::move(host), port,        std::move(host_id), pid,
                             remote_shm,     remote_p2p,      remote_rdma, std::string(secret)};
           }),
           py::arg("key"), py::arg("host"), py::arg("port"), py::kw_only(),
           py::arg("host_id") = std::string(), py::arg("pid") = 0, py::arg("remote_shm") = false,
           py::arg("remote_p2p") = false, py::arg("remote_rdma") = false,
           py::arg("secret") = py::bytes())
      .def_readonly("key", &PeerDesc::key)
      .def_readonly("host", &PeerDesc::host)
      .def_readonly("port", &PeerDesc::port)
      .def_readonly("host_id", &PeerDesc::host_id)
      .def_readonly("pid", &PeerDesc::pid)
      .def_readonly("remote_shm", &PeerDesc::remote_shm)
      .def_readonly("remote_p2p", &PeerDesc::remote_p2p)
      .def_readonly("remote_rdma", &PeerDesc::remote_rdma);

  py::class_<IoEngine>(m, "Engine", "The native engine behind mori.io.IOEngine.")
      .def(py::init<std::string, std::string, uint16_t>(), py::arg("key"), py::arg("host"),
           py::arg("port"))
      .def_property_readonly("key", &IoEngine::key)
      .def_property_readonly("host", &IoEngine::host)
      .def_property_readonly("port", &IoEngine::port)
      .def_property_readonly("has_tcp_backend", &IoEngine::HasTcpBackend)
      .def_property_readonly("has_shm_backend", &IoEngine::HasShmBackend)
      .def_property_readonly("host_id", &IoEngine::host_id)
      .def_property_readonly("secret", [](IoEngine& e) { return py::bytes(e.secret()); })
      .def_property_readonly("hellos_refused", &IoEngine::hellos_refused)
      .def_property_readonly("hellos_dropped", &IoEngine::hellos_dropped)
      .def_property_readonly("idle_connections_closed", &IoEngine::idle_closed)
      .def_property_readonly("announcements_refused", &IoEngine::announcements_refused)
      .def_property_readonly("answers_read_by_waiters", &IoEngine::answers_read_by_waiters)
      .def("create_shm_backend", &IoEngine::CreateShmBackend)
      .def("create_p2p_backend", &IoEngine::CreateP2pBackend, py::arg("config"))
      .def(
          "p2p_mapping_kind",
          [](IoEngine& e, const std::string& key, uint64_t mem_id) {
            return e.transports().p2p().MappingKind(key, mem_id);
          },
          py::arg("remote_key"), py::arg("mem_id"),
          "-1: not mapped; 0: same process; 1: legacy CUDA IPC handle; 2: cuMem POSIX fds.")
      .def(
          "shm_mapping_state",
          [](IoEngine& e, const std::string& key, uint64_t mem_id) {
            return e.transports().shm().MappingState(key, mem_id);
          },
          py::arg("remote_key"), py::arg("mem_id"),
          "-1: not asked yet; 0: not shareable (CMA); 1: mapped (memcpy).")
      .def(
          "shm_cma_grant_state",
          [](IoEngine& e, const std::string& key, uint64_t mem_id) {
            return e.transports().shm().CmaGrantState(key, mem_id);
          },
          py::arg("remote_key"), py::arg("mem_id"),
          "1: a CMA grant of the remote region is held here; 0: none.")
      .def(
          "shm_liveness",
          [](IoEngine& e, const std::string& key) { return e.transports().shm().Liveness(key); },
          py::arg("remote_key"),
          "How same-host copies learn that remote_key's engine is gone: 'word', 'pidfd', ''.")
      .def(
          "notice_ring_state",
          [](IoEngine& e, const std::string& key) {
            return e.transports().same_host().NoticeRingState(key);
          },
          py::arg("remote_key"),
          "Write announcements to remote_key: 1 its notice ring; 0 not asked yet; -1 TCP.")
      .def_property_readonly(
          "notice_rings_granted",
          [](IoEngine& e) { return e.transports().same_host().notice_rings_granted(); })
      .def_property_readonly("shm_split_copies",
                             [](IoEngine& e) { return e.transports().shm().split_copies(); })
      .def("create_rdma_backend", &IoEngine::CreateRdmaBackend, py::arg("config"),
           py::call_guard<py::gil_scoped_release>())
      .def_static("p2p_unavailable", &P2pBackend::Unavailable,
                  "Why this build/machine cannot run the P2P backend; '' if it can.")
      .def(
          "set_backend_override",
          [](IoEngine& e, const std::string& text) {
            e.SetBackendOverride(ParseBackendOverride(text));
          },
          py::arg("backend"))
      .def(
          "backend_for",
          [](IoEngine& e, MemoryLocationType local_loc, const RemoteRegion& remote) {
            BackendChoice c;
            {
              py::gil_scoped_release nogil;  // may connect, probe the peer, ask for a mapping
              c = e.BackendFor(local_loc, remote);
            }
            return ChoiceTuple(c);
          },
          py::arg("local_loc"), py::arg("remote"))
      .def("create_tcp_backend", &IoEngine::CreateTcpBackend, py::arg("config"))
      .def(
          "register_memory",
          [](IoEngine& e, uintptr_t addr, uint64_t size, int device, MemoryLocationType loc) {
            MemoryRegion r = e.RegisterMemory(addr, size, device, loc);
            return py::make_tuple(r.id, r.capability);
          },
          py::arg("addr"), py::arg("size"), py::arg("device_id"), py::arg("loc"))
      // It may wait (bounded by transfer_timeout_ms) for grant holders to let go.
      .def("deregister_memory", &IoEngine::DeregisterMemory, py::arg("id"),
           py::call_guard<py::gil_scoped_release>())
      .def("register_remote_engine", &IoEngine::RegisterRemoteEngine, py::arg("remote"))
      .def("deregister_remote_engine", &IoEngine::DeregisterRemoteEngine, py::arg("key"))
      .def("has_remote_engine", &IoEngine::HasRemoteEngine, py::arg("key"))
      .def("allocate_transfer_uid", &IoEngine::AllocateTransferUid)
      .def(
          "transfer",
          [](IoEngine& e, bool write, uint64_t local_mem, uint64_t lo, const RemoteRegion& remote,
             uint64_t ro, uint64_t size, uint64_t uid) {
            TransferSpan span{lo, ro, size};
            py::gil_scoped_release nogil;
            return e.Transfer(write ? Op::kWrite : Op::kRead, local_mem, remote, &span, 1, uid);
          },
          py::arg("write"), py::arg("local_mem"), py::arg("local_offset"), py::arg("remote"),
          py::arg("remote_offset"), py::arg("size"), py::arg("uid"))
      .def(
          "batch_transfer",
          [](IoEngine& e, bool write, uint64_t local_mem, const py::object& lo,
             const RemoteRegion& remote, const py::object& ro, const py::object& sizes,
             uint64_t uid) {
            std::vector<TransferSpan> spans = Spans(lo, ro, sizes);
            py::gil_scoped_release nogil;
            return e.Transfer(write ? Op::kWrite : Op::kRead, local_mem, remote, spans.data(),
                              spans.size(), uid);
          },
          py::arg("write"), py::arg("local_mem"), py::arg("local_offsets"), py::arg("remote"),
          py::arg("remote_offsets"), py::arg("sizes"), py::arg("uid"))
      .def("pop_inbound_transfer_status", &IoEngine::PopInboundTransferStatus,
           py::arg("remote_key"), py::arg("uid"))
      .def("create_session", &IoEngine::CreateSession, py::arg("local_mem"), py::arg("remote"),
           py::keep_alive<0, 1>())
      .def("ledger_stats",
           [](IoEngine& e) {
             SubmissionLedger& l = e.ledger();
             return py::dict(py::arg("admission_limit") = l.admission_limit(),
                             py::arg("live") = l.live());
           })
      .def(
          "inbound_stats",
          [](IoEngine& e) {
            const InboundStatuses::Stats s = e.inbound_stats();
            return py::dict(py::arg("held") = s.held, py::arg("initiators") = s.initiators,
                            py::arg("bytes") = s.bytes, py::arg("evicted") = s.evicted,
                            py::arg("unrecorded") = s.unrecorded);
          },
          R"doc(Inbound statuses held for pop_inbound_transfer_status: held, the initiators
(keys) they are held under, the bytes the max_inbound_status_bytes bound counts, how many
the two bounds dropped (evicted, oldest first), and refused parts not recorded because
they named no region of this engine (unrecorded).)doc")
      .def(
          "grant_stats",
          [](IoEngine& e) {
            const RegionGrants::Stats s = e.grants().stats();
            return py::dict(py::arg("holders") = s.holders, py::arg("grants") = s.grants,
                            py::arg("refused") = s.refused, py::arg("dropped") = s.dropped);
          },
          R"doc(Region grants (CMA, shared-memory map, P2P) this engine holds for initiators:
holders (initiators), grants ((initiator, region) pairs), how many were refused at the
MORI_IO_MAX_GRANT_HOLDERS / MORI_IO_MAX_GRANTS bounds, and how many were dropped because
their holder had no connection left.)doc")
      .def_property_readonly("hot_path_options", [](IoEngine& e) {
        const HotPathOptions& o = e.options();
        return py::dict(py::arg("notice_ring") = o.notice_ring,
                        py::arg("notice_ring_slots") = o.notice_ring_slots,
                        py::arg("shm_split_bytes") = o.shm_split_bytes,
                        py::arg("tcp_waiter_reads") = o.tcp_waiter_reads,
                        py::arg("tcp_busy_poll_us") = o.tcp_busy_poll_us);
      });
}

}  // namespace mori::io
