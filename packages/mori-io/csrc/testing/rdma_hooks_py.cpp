// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// Test hooks of the RDMA backend (test builds only, mori.io._C._testing.rdma): the
// loader report and the hardware-independent functions (plans, encodings, QP
// transitions, NIC and GID choice, send-queue accounting) so that tests exercise them
// without a NIC, and the engine-facing backend itself, real or the loopback double.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mori/core/error.hpp"
#include "mori/transport/verbs/endpoint_codec.hpp"
#include "mori/transport/verbs/nic_select.hpp"
#include "mori/transport/verbs/qp_attributes.hpp"
#include "mori/transport/verbs/send_queue.hpp"
#include "mori/transport/verbs/verbs_loader.hpp"
#include "mori/transport/verbs/work_request_plan.hpp"
#include "rdma/rdma_backend.hpp"
#include "testing/loopback_backend.hpp"
#include "testing/testing_py.hpp"

namespace py = pybind11;

namespace mori::io::testing {
namespace {

using namespace rdma;  // NOLINT: one binding file for the whole area

py::dict TransitionDict(const QpTransition& t) {
  py::dict av;
  av["dlid"] = t.av.dlid;
  av["sl"] = t.av.sl;
  av["port_num"] = t.av.port_num;
  av["is_global"] = t.av.is_global;
  av["dgid"] = py::bytes(reinterpret_cast<const char*>(t.av.dgid.data()), 16);
  av["sgid_index"] = t.av.sgid_index;
  av["hop_limit"] = t.av.hop_limit;
  av["traffic_class"] = t.av.traffic_class;
  py::dict d;
  d["state"] = static_cast<int>(t.state);
  d["attr_mask"] = t.attr_mask;
  d["access_flags"] = t.access_flags;
  d["pkey_index"] = t.pkey_index;
  d["port_num"] = t.port_num;
  d["path_mtu"] = t.path_mtu;
  d["dest_qpn"] = t.dest_qpn;
  d["rq_psn"] = t.rq_psn;
  d["max_dest_rd_atomic"] = t.max_dest_rd_atomic;
  d["min_rnr_timer"] = t.min_rnr_timer;
  d["ah_attr"] = av;
  d["timeout"] = t.timeout;
  d["retry_cnt"] = t.retry_cnt;
  d["rnr_retry"] = t.rnr_retry;
  d["sq_psn"] = t.sq_psn;
  d["max_rd_atomic"] = t.max_rd_atomic;
  return d;
}

std::array<uint8_t, 16> GidFromBytes(const py::bytes& b) {
  std::string s = b;
  MORI_CHECK_ARG(s.size() == 16, "a GID is 16 bytes, got ", s.size());
  std::array<uint8_t, 16> g{};
  std::copy(s.begin(), s.end(), g.begin());
  return g;
}

py::bytes GidBytes(const std::array<uint8_t, 16>& g) {
  return py::bytes(reinterpret_cast<const char*>(g.data()), 16);
}

topology::RdmaDevice DeviceFromDict(const py::dict& d) {
  topology::RdmaDevice dev;
  dev.name = d["name"].cast<std::string>();
  if (d.contains("pci_path")) dev.pci_path = d["pci_path"].cast<std::string>();
  if (d.contains("numa_node")) dev.numa_node = d["numa_node"].cast<int>();
  if (d.contains("ports")) {
    for (const py::handle& h : d["ports"]) {
      py::dict p = py::reinterpret_borrow<py::dict>(h);
      topology::RdmaPort port;
      port.port = p["port"].cast<int>();
      port.state = p["state"].cast<std::string>();
      if (p.contains("link_layer")) port.link_layer = p["link_layer"].cast<std::string>();
      dev.ports.push_back(port);
    }
  }
  return dev;
}

// The holder of Backend: a backend's destructor joins its threads, which may be waiting
// for the GIL to run a Python callback, so it runs without the GIL.
struct DeleteWithoutGil {
  void operator()(RdmaBackend* backend) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      delete backend;
    } else {
      delete backend;
    }
  }
};
using BackendHolder = std::unique_ptr<RdmaBackend, DeleteWithoutGil>;

// A Python callable kept by a backend, called and dropped on its threads: every touch
// takes the GIL. An exception it raises is reported as unraisable (a backend thread
// has no caller to raise it to).
class PyCallback {
 public:
  explicit PyCallback(py::function fn)
      : fn_(new py::function(std::move(fn)), [](py::function* f) {
          py::gil_scoped_acquire gil;
          delete f;
        }) {}
  template <typename... Args>
  void operator()(Args&&... args) const {
    py::gil_scoped_acquire gil;
    try {
      (*fn_)(std::forward<Args>(args)...);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("mori.io._C.rdma.Backend callback");
    }
  }

 private:
  std::shared_ptr<py::function> fn_;
};

template <typename F>
auto WithoutGil(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

py::dict PlanDict(const TransferPlan& plan) {
  py::list qps;
  for (const QpPlan& q : plan.qps) {
    py::list wrs;
    for (const PlannedWr& w : q.wrs) {
      py::list sges;
      for (uint32_t k = 0; k < w.sge_count; ++k) {
        const PlannedSge& s = q.sges[w.sge_begin + k];
        sges.append(py::make_tuple(s.local_offset, s.length));
      }
      py::dict d;
      d["opcode"] = static_cast<int>(w.opcode);
      d["send_flags"] = w.send_flags;
      d["signaled"] = (w.send_flags & send_flag::kSignaled) != 0;
      d["fence"] = (w.send_flags & send_flag::kFence) != 0;
      d["remote_offset"] = w.remote_offset;
      d["length"] = w.length;
      d["sges"] = sges;
      d["imm"] = w.imm;
      d["batch_end"] = w.batch_end;
      d["retire"] = w.retire;
      wrs.append(d);
    }
    py::dict d;
    d["wrs"] = wrs;
    d["bytes"] = q.bytes;
    d["signaled"] = q.signaled;
    qps.append(d);
  }
  py::dict out;
  out["qps"] = qps;
  out["bytes"] = plan.bytes;
  out["wrs"] = plan.wrs;
  return out;
}

}  // namespace

void register_rdma_hooks(py::module_& t) {
  py::module_ r = t.def_submodule("rdma", "RDMA backend internals (tests)");
#if MORI_IO_WITH_RDMA
  r.attr("built_with_verbs") = true;
#else
  r.attr("built_with_verbs") = false;
#endif
  r.attr("IMM_UID_MASK") = kImmUidMask;
  r.attr("IMM_MAX_PARTS") = kImmMaxParts;
  r.attr("MAX_PLANNED_WRS") = kMaxPlannedWrs;

  r.def("verbs_library_path", &VerbsLibraryPath,
        R"doc(The library the backend dlopens: MORI_IO_IBVERBS_LIB or libibverbs.so.1.)doc");
  r.def("required_symbols", &RequiredVerbsSymbols);
  r.def(
      "try_load_verbs",
      [](const std::string& path) {
        VerbsLoadReport rep = TryLoadVerbs(path);
        py::dict d;
        d["ok"] = rep.ok;
        d["path"] = rep.path;
        d["reason"] = rep.reason;
        d["missing"] = rep.missing;
        d["optional"] = rep.optional;
        return d;
      },
      py::arg("path"),
      R"doc(dlopen ``path``, resolve every verbs symbol, dlclose: {ok, path, reason,
missing, optional}. Never raises.)doc");

  r.def(
      "plan_transfer",
      [](const std::string& op, const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& spans,
         uint64_t local_size, uint64_t remote_size, uint64_t max_message_bytes, uint32_t max_sge,
         uint32_t signal_interval, uint32_t post_batch_size, uint32_t num_qps, bool notify,
         uint64_t uid) {
        MORI_CHECK_ARG(op == "read" || op == "write", "op '", op, "' is not read or write");
        std::vector<PlanSpan> s;
        for (const auto& [lo, ro, size] : spans) s.push_back({lo, ro, size});
        PlanLimits l;
        l.local_size = local_size;
        l.remote_size = remote_size;
        l.max_message_bytes = max_message_bytes;
        l.max_sge = max_sge;
        l.signal_interval = signal_interval;
        l.post_batch_size = post_batch_size;
        l.num_qps = num_qps;
        l.notify = notify;
        return PlanDict(PlanTransfer(op == "write" ? PlanOp::kWrite : PlanOp::kRead, s.data(),
                                     s.size(), l, uid));
      },
      py::arg("op"), py::arg("spans"), py::arg("local_size"), py::arg("remote_size"),
      py::arg("max_message_bytes") = uint64_t{1} << 30, py::arg("max_sge") = 1,
      py::arg("signal_interval") = 16, py::arg("post_batch_size") = 32, py::arg("num_qps") = 1,
      py::arg("notify") = true, py::arg("uid") = 1,
      R"doc(Plan a transfer: spans are (local_offset, remote_offset, size) in bytes.
Returns {qps: [{wrs, bytes, signaled}], bytes, wrs}; each WR a dict with opcode
(0 WRITE, 1 WRITE_WITH_IMM, 4 READ), send_flags, signaled, fence, remote_offset,
length, sges [(local_offset, length)], imm, batch_end, retire.)doc");

  r.def("encode_imm", &EncodeImm, py::arg("uid"), py::arg("parts"), py::arg("read"));
  r.def(
      "decode_imm",
      [](uint32_t imm) {
        ImmData d = DecodeImm(imm);
        return py::make_tuple(d.uid24, d.parts, d.read);
      },
      py::arg("imm"), R"doc(-> (uid mod 2^24, parts, read))doc");
  r.def(
      "encode_wr_id",
      [](int kind, uint64_t retire, uint64_t slot) {
        MORI_CHECK_ARG(kind >= 0 && kind <= 255, "wr_id kind ", kind, " outside [0, 255]");
        MORI_CHECK_ARG(retire <= 0xFFFFFFFFu, "wr_id retire count ", retire,
                       " does not fit 24 bits");
        MORI_CHECK_ARG(slot <= 0xFFFFFFFFu, "wr_id slot ", slot, " does not fit 32 bits");
        return EncodeWrId({static_cast<WrKind>(kind), static_cast<uint32_t>(retire),
                           static_cast<uint32_t>(slot)});
      },
      py::arg("kind"), py::arg("retire"), py::arg("slot"));
  r.def(
      "decode_wr_id",
      [](uint64_t wr_id) {
        WrId id = DecodeWrId(wr_id);
        return py::make_tuple(static_cast<int>(id.kind), id.retire, id.slot);
      },
      py::arg("wr_id"), R"doc(-> (kind, retire, slot))doc");
  r.def("wc_status_name", &WcStatusName, py::arg("status"));
  r.def("wc_status_hint", &WcStatusHint, py::arg("status"));

  py::class_<EndpointInfo>(r, "EndpointInfo", "What one QP tells its peer.")
      .def(py::init<>())
      .def_readwrite("qpn", &EndpointInfo::qpn)
      .def_readwrite("psn", &EndpointInfo::psn)
      .def_readwrite("lid", &EndpointInfo::lid)
      .def_readwrite("port_num", &EndpointInfo::port_num)
      .def_readwrite("active_mtu", &EndpointInfo::active_mtu)
      .def_property(
          "link_layer", [](const EndpointInfo& e) { return static_cast<int>(e.link_layer); },
          [](EndpointInfo& e, int v) { e.link_layer = static_cast<LinkLayer>(v); })
      .def_property(
          "gid", [](const EndpointInfo& e) { return GidBytes(e.gid); },
          [](EndpointInfo& e, const py::bytes& b) { e.gid = GidFromBytes(b); })
      .def("__eq__", [](const EndpointInfo& a, const EndpointInfo& b) {
        return a.qpn == b.qpn && a.psn == b.psn && a.lid == b.lid && a.port_num == b.port_num &&
               a.active_mtu == b.active_mtu && a.link_layer == b.link_layer && a.gid == b.gid;
      });

  r.def(
      "build_init_transition",
      [](const QpConfig& c) { return TransitionDict(BuildInitTransition(c)); }, py::arg("config"));
  r.def(
      "build_rtr_transition",
      [](const QpConfig& c, int link_layer, int active_mtu, int gid_index,
         const EndpointInfo& remote) {
        LocalPortInfo local;
        local.link_layer = static_cast<LinkLayer>(link_layer);
        local.active_mtu = static_cast<uint8_t>(active_mtu);
        local.gid_index = gid_index;
        return TransitionDict(BuildRtrTransition(c, local, remote));
      },
      py::arg("config"), py::arg("link_layer"), py::arg("active_mtu"), py::arg("gid_index"),
      py::arg("remote"),
      R"doc(link_layer: 1 InfiniBand, 2 Ethernet; active_mtu: enum ibv_mtu.)doc");
  r.def(
      "build_rts_transition",
      [](const QpConfig& c, uint32_t psn) { return TransitionDict(BuildRtsTransition(c, psn)); },
      py::arg("config"), py::arg("local_psn"));

  r.def(
      "choose_rdma_port",
      [](const py::list& devices, const py::object& gpu, const std::string& requested,
         int requested_port) {
        std::vector<topology::RdmaDevice> devs;
        for (const py::handle& h : devices)
          devs.push_back(DeviceFromDict(py::reinterpret_borrow<py::dict>(h)));
        topology::Gpu g;
        const topology::Gpu* gp = nullptr;
        if (!gpu.is_none()) {
          py::dict d = gpu.cast<py::dict>();
          g.index = d.contains("index") ? d["index"].cast<int>() : 0;
          g.pci_path = d["pci_path"].cast<std::string>();
          g.numa_node = d.contains("numa_node") ? d["numa_node"].cast<int>() : -1;
          gp = &g;
        }
        RdmaPortChoice c = ChooseRdmaPort(devs, gp, requested, requested_port);
        py::dict out;
        out["device"] = c.device;
        out["port"] = c.port;
        out["link_layer"] = static_cast<int>(c.link_layer);
        out["distance"] = topology::PciDistanceName(c.distance);
        out["reason"] = c.reason;
        return out;
      },
      py::arg("devices"), py::arg("gpu") = py::none(), py::arg("requested") = "",
      py::arg("requested_port") = 0,
      R"doc(NIC choice on a (synthetic) topology: devices are dicts {name, pci_path,
numa_node, ports: [{port, state, link_layer}]}, gpu a dict {index, pci_path, numa_node}
or None. -> {device, port, link_layer, distance, reason}.)doc");

  r.def(
      "select_gid_index",
      [](const std::vector<std::tuple<int, std::string, std::string>>& table, int link_layer,
         int requested) {
        std::vector<GidEntry> entries;
        for (const auto& [index, text, type] : table) {
          GidEntry e;
          e.index = index;
          e.gid = ParseGid(text);
          e.type = type;
          entries.push_back(e);
        }
        GidChoice c = SelectGidIndex(entries, static_cast<LinkLayer>(link_layer), requested);
        return py::make_tuple(c.index, c.reason);
      },
      py::arg("table"), py::arg("link_layer"), py::arg("requested") = -1,
      R"doc(table: [(index, gid text, type)] with type "RoCE v2", "IB/RoCE v1" or "".)doc");
  r.def("format_gid", [](const py::bytes& b) { return FormatGid(GidFromBytes(b)); });

  r.def(
      "encode_endpoints",
      [](const std::vector<EndpointInfo>& eps) { return py::bytes(EncodeEndpoints(eps)); },
      py::arg("endpoints"));
  r.def(
      "decode_endpoints", [](const py::bytes& b) { return DecodeEndpoints(std::string(b)); },
      py::arg("data"));
  r.def(
      "encode_region_key",
      [](uint64_t addr, uint64_t length, uint32_t rkey) {
        return py::bytes(EncodeRegionKey({addr, length, rkey}));
      },
      py::arg("addr"), py::arg("length"), py::arg("rkey"));
  r.def(
      "decode_region_key",
      [](const py::bytes& b) {
        RegionKey k = DecodeRegionKey(std::string(b));
        return py::make_tuple(k.addr, k.length, k.rkey);
      },
      py::arg("data"), R"doc(-> (addr, length, rkey))doc");

  py::class_<SendQueueTracker>(r, "SendQueueTracker",
                               "Send-queue occupancy and due completions of one QP.")
      .def(py::init<uint32_t>(), py::arg("depth"))
      .def_property_readonly("depth", &SendQueueTracker::depth)
      .def_property_readonly("outstanding", &SendQueueTracker::outstanding)
      .def_property_readonly("expected_completions", &SendQueueTracker::expected_completions)
      .def("fits", &SendQueueTracker::Fits, py::arg("n"))
      .def(
          "posted",
          [](SendQueueTracker& t, const std::vector<std::pair<bool, uint32_t>>& wrs,
             uint32_t slot) {
            std::vector<PlannedWr> planned(wrs.size());
            for (size_t i = 0; i < wrs.size(); ++i) {
              planned[i].send_flags = wrs[i].first ? send_flag::kSignaled : 0;
              planned[i].retire = wrs[i].second;
            }
            t.Posted(planned.data(), planned.size(), slot);
          },
          py::arg("wrs"), py::arg("slot"), R"doc(wrs: [(signaled, retire)] of one chain.)doc")
      .def("completed", &SendQueueTracker::Completed, py::arg("wr_id"))
      .def("drain", &SendQueueTracker::Drain);

  r.attr("LOOPBACK_ENV_VAR") = kLoopbackEnvVar;
  r.def("loopback_requested", &LoopbackBackendRequested,
        R"doc(Whether MORI_IO_RDMA_LOOPBACK is "1" (the engine then creates the loopback
test double instead of the RDMA backend).)doc");

  py::class_<RdmaBackend, BackendHolder>(r, "Backend", R"doc(The native RDMA backend
(engine-facing; the engine wires it in). Construction opens the chosen NIC or raises
NotSupportedError; ``Backend.loopback(config)`` makes the in-process test double.
Peer keys are str; region keys and connect payloads are the codec's bytes.)doc")
      .def(py::init([](const RdmaBackendConfig& c) { return RdmaBackend::Create(c).release(); }),
           py::arg("config"), py::call_guard<py::gil_scoped_release>())
      .def_static(
          "loopback",
          [](const RdmaBackendConfig& c) {
            return WithoutGil([&] { return CreateLoopbackBackend(c).release(); });
          },
          py::arg("config"), py::return_value_policy::take_ownership,
          R"doc(The loopback TEST DOUBLE (loopback_backend.hpp): the same interface, bytes
moved with memmove between loopback backends of this process, no NIC.)doc")
      .def("describe", &RdmaBackend::Describe)
      .def(
          "register_region",
          [](RdmaBackend& b, uint64_t mem_id, uintptr_t addr, uint64_t size) {
            return py::bytes(WithoutGil([&] { return b.RegisterRegion(mem_id, addr, size); }));
          },
          py::arg("mem_id"), py::arg("addr"), py::arg("size"),
          R"doc(Register [addr, addr+size) (bytes) as mem_id; -> its encoded region key.)doc")
      .def("deregister_region", &RdmaBackend::DeregisterRegion, py::arg("mem_id"),
           py::call_guard<py::gil_scoped_release>())
      .def("in_flight", &RdmaBackend::InFlight, py::arg("mem_id"),
           py::call_guard<py::gil_scoped_release>(),
           R"doc(Transfers in flight from or into the region.)doc")
      .def(
          "open_initiator",
          [](RdmaBackend& b, const std::string& peer_key) {
            return py::bytes(WithoutGil([&] { return b.OpenInitiator(peer_key); }));
          },
          py::arg("peer_key"), R"doc(-> the request payload (encoded endpoints).)doc")
      .def(
          "accept_initiator",
          [](RdmaBackend& b, const std::string& peer_key, const std::string& request) {
            return py::bytes(WithoutGil([&] { return b.AcceptInitiator(peer_key, request); }));
          },
          py::arg("peer_key"), py::arg("request"), R"doc(-> the reply payload.)doc")
      .def("complete_initiator", &RdmaBackend::CompleteInitiator, py::arg("peer_key"),
           py::arg("reply"), py::call_guard<py::gil_scoped_release>())
      .def("peer_ready", &RdmaBackend::PeerReady, py::arg("peer_key"),
           py::call_guard<py::gil_scoped_release>())
      .def("disconnect_peer", &RdmaBackend::DisconnectPeer, py::arg("peer_key"), py::arg("reason"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "submit",
          [](RdmaBackend& b, const std::string& op, uint64_t local_mem, const std::string& peer_key,
             const std::string& remote_key,
             const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& spans, uint64_t uid,
             const py::function& done) {
            MORI_CHECK_ARG(op == "read" || op == "write", "op '", op, "' is not read or write");
            RegionKey remote = DecodeRegionKey(remote_key);
            std::vector<PlanSpan> s;
            s.reserve(spans.size());
            for (const auto& [lo, ro, size] : spans) s.push_back({lo, ro, size});
            PyCallback cb(done);
            WithoutGil([&] {
              b.Submit(op == "write" ? RdmaOp::kWrite : RdmaOp::kRead, local_mem, peer_key, remote,
                       s.data(), s.size(), uid,
                       [cb](StatusDetail code, const std::string& message) { cb(code, message); });
              return 0;
            });
          },
          py::arg("op"), py::arg("local_mem"), py::arg("peer_key"), py::arg("remote_key"),
          py::arg("spans"), py::arg("uid"), py::arg("done"),
          R"doc(One-sided transfer: spans are (local_offset, remote_offset, size) in bytes
of local region local_mem and the region remote_key (encoded) names. done(StatusDetail,
message) runs once, on a backend thread. Raises before anything moves for an unknown
region or peer or a bad span.)doc")
      .def(
          "set_inbound_handler",
          [](RdmaBackend& b, const py::object& handler) {
            RdmaInboundHandler h;
            if (!handler.is_none()) {
              PyCallback cb(handler.cast<py::function>());
              h = [cb](const std::string& peer_key, uint32_t uid24, uint32_t parts, bool read) {
                cb(peer_key, uid24, parts, read);
              };
            }
            WithoutGil([&] {
              b.SetInboundHandler(std::move(h));
              return 0;
            });
          },
          py::arg("handler"),
          R"doc(handler(peer_key, uid24, parts, read) per notification received, on a backend
thread; None removes it.)doc");
}

}  // namespace mori::io::testing
