// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/verbs/verbs_objects.hpp"

#if MORI_CORE_WITH_VERBS

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"

namespace mori::transport::verbs {
namespace {

[[noreturn]] void ThrowVerb(const char* verb, const std::string& what, int err) {
  MORI_THROW(TransportError, verb, " failed for ", what, ": ", std::strerror(err), " (errno ", err,
             ")");
}

// The header's ibv_query_port is an inline wrapper that falls back to the exported
// (compat) symbol; the same here without naming that symbol.
int QueryPort(const VerbsApi& api, ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  std::memset(attr, 0, sizeof(*attr));
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx != nullptr) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  return api.query_port(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

uint32_t RandomPsn() {
  static thread_local std::mt19937 rng{std::random_device{}()};
  return rng() & kPsnMask;
}

}  // namespace

std::vector<GidEntry> ReadGidTable(const VerbsApi& api, ibv_context* ctx, const std::string& device,
                                   uint8_t port, int table_len) {
  std::vector<GidEntry> table;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid gid{};
    if (api.query_gid(ctx, port, i, &gid) != 0) continue;
    GidEntry e;
    e.index = i;
    std::memcpy(e.gid.data(), gid.raw, 16);
    if (IsZeroGid(e.gid)) continue;
    e.type = ReadFirstLine(
        StrCat("/sys/class/infiniband/", device, "/ports/", int{port}, "/gid_attrs/types/", i));
    table.push_back(e);
  }
  return table;
}

VerbsDevice::VerbsDevice(const VerbsApi& api, const std::string& device, int port, int gid_index,
                         int num_cqs, int cq_depth, bool event_mode)
    : api_(api), name_(device), port_(static_cast<uint8_t>(port)) {
  try {
    int count = 0;
    ibv_device** list = api.get_device_list(&count);
    if (list == nullptr) ThrowVerb("ibv_get_device_list", "the device list", errno);
    std::string seen;
    for (int i = 0; i < count && ctx_ == nullptr; ++i) {
      const char* n = api.get_device_name(list[i]);
      seen += StrCat(i ? ", " : "", n ? n : "?");
      if (n != nullptr && device == n) {
        ctx_ = api.open_device(list[i]);
        if (ctx_ == nullptr) {
          int err = errno;
          api.free_device_list(list);
          ThrowVerb("ibv_open_device", device, err);
        }
      }
    }
    api.free_device_list(list);
    if (ctx_ == nullptr) {
      MORI_THROW(NotFoundError, "RDMA device '", device, "' is not in libibverbs' list (",
                 seen.empty() ? "empty" : seen, ")");
    }
    if (int rc = api.query_device(ctx_, &device_attr_); rc != 0) {
      ThrowVerb("ibv_query_device", device, rc);
    }
    if (int rc = QueryPort(api, ctx_, port_, &port_attr_); rc != 0) {
      ThrowVerb("ibv_query_port", StrCat(device, " port ", port), rc);
    }
    MORI_CHECK_ARG(port_attr_.state == IBV_PORT_ACTIVE, "RDMA device ", device, " port ", port,
                   " is not ACTIVE (state ", static_cast<int>(port_attr_.state), ")");
    link_layer_ = port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::kEthernet
                                                                   : LinkLayer::kInfiniBand;
    std::vector<GidEntry> table =
        ReadGidTable(api, ctx_, device, port_, static_cast<int>(port_attr_.gid_tbl_len));
    gid_ = SelectGidIndex(table, link_layer_, gid_index);
    for (const GidEntry& e : table) {
      if (e.index == gid_.index) gid_value_ = e.gid;
    }
    pd_ = api.alloc_pd(ctx_);
    if (pd_ == nullptr) ThrowVerb("ibv_alloc_pd", device, errno);
    int depth = std::min(cq_depth, device_attr_.max_cqe);
    for (int i = 0; i < num_cqs; ++i) {
      CompletionQueue q;
      if (event_mode) {
        q.channel = api.create_comp_channel(ctx_);
        if (q.channel == nullptr) ThrowVerb("ibv_create_comp_channel", device, errno);
      }
      q.cq = api.create_cq(ctx_, depth, nullptr, q.channel, 0);
      if (q.cq == nullptr) {
        int err = errno;
        if (q.channel != nullptr) api.destroy_comp_channel(q.channel);
        ThrowVerb("ibv_create_cq", StrCat(device, " (", depth, " entries)"), err);
      }
      cqs_.push_back(q);
      if (event_mode && ibv_req_notify_cq(q.cq, 0) != 0) {
        ThrowVerb("ibv_req_notify_cq", device, errno);
      }
    }
  } catch (...) {
    Close();
    throw;
  }
  MORI_LOG_INFO(kCore, "rdma: opened ", Describe());
}

VerbsDevice::~VerbsDevice() { Close(); }

void VerbsDevice::Close() noexcept {
  for (CompletionQueue& q : cqs_) {
    if (q.cq != nullptr) api_.destroy_cq(q.cq);
    if (q.channel != nullptr) api_.destroy_comp_channel(q.channel);
  }
  cqs_.clear();
  if (pd_ != nullptr) api_.dealloc_pd(pd_);
  pd_ = nullptr;
  if (ctx_ != nullptr) api_.close_device(ctx_);
  ctx_ = nullptr;
}

LocalPortInfo VerbsDevice::PortInfo() const {
  LocalPortInfo info;
  info.link_layer = link_layer_;
  info.active_mtu = static_cast<uint8_t>(port_attr_.active_mtu);
  info.gid_index = gid_.index;
  return info;
}

std::string VerbsDevice::Describe() const {
  return StrCat(name_, " port ", int{port_}, " (", LinkLayerName(link_layer_), ", LID ",
                port_attr_.lid, ", MTU ", MtuBytesFromEnum(port_attr_.active_mtu), ", ",
                gid_.reason, ", max_qp_wr ", device_attr_.max_qp_wr, ", max_sge ",
                device_attr_.max_sge, ", max_msg ", port_attr_.max_msg_sz, ")");
}

MemoryRegistration::MemoryRegistration(const VerbsDevice& device, uintptr_t addr, uint64_t length)
    : api_(device.api()), addr_(addr), length_(length) {
  void* p = reinterpret_cast<void*>(addr);
  int access = static_cast<int>(kRegionAccess);
  mr_ = api_.reg_mr_iova2 != nullptr
            ? api_.reg_mr_iova2(device.pd(), p, length, addr, static_cast<unsigned>(access))
            : api_.reg_mr(device.pd(), p, length, access);
  if (mr_ == nullptr) {
    ThrowVerb("ibv_reg_mr", StrCat("[0x", std::hex, addr, ", +0x", length, ")"), errno);
  }
}

MemoryRegistration::~MemoryRegistration() {
  if (int rc = api_.dereg_mr(mr_); rc != 0) {
    MORI_LOG_WARN(kCore, "rdma: ibv_dereg_mr failed: ", std::strerror(rc));
  }
}

RcQueuePair::RcQueuePair(const VerbsDevice& device, int cq_index, uint32_t max_send_wr,
                         uint32_t max_recv_wr, uint32_t max_sge)
    : device_(device), cq_index_(cq_index), psn_(RandomPsn()) {
  const ibv_device_attr& dev = device.device_attr();
  ibv_qp_init_attr init{};
  ibv_cq* cq = device.cqs().at(static_cast<size_t>(cq_index)).cq;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;  // the plan decides which WRs are signaled
  init.cap.max_send_wr = std::min<uint32_t>(max_send_wr, static_cast<uint32_t>(dev.max_qp_wr));
  init.cap.max_recv_wr = std::min<uint32_t>(max_recv_wr, static_cast<uint32_t>(dev.max_qp_wr));
  init.cap.max_send_sge = std::min<uint32_t>(max_sge, static_cast<uint32_t>(dev.max_sge));
  init.cap.max_recv_sge = 1;
  qp_ = device.api().create_qp(device.pd(), &init);
  if (qp_ == nullptr) {
    ThrowVerb("ibv_create_qp", StrCat(device.name(), " (RC, ", init.cap.max_send_wr, " send WRs)"),
              errno);
  }
  // The provider may round the capacities up; the plan may only use what was asked.
  max_send_wr_ = init.cap.max_send_wr;
  max_recv_wr_ = init.cap.max_recv_wr;
  max_sge_ = std::max<uint32_t>(1, std::min<uint32_t>(max_sge, init.cap.max_send_sge));
}

RcQueuePair::~RcQueuePair() {
  if (qp_ != nullptr) {
    if (int rc = device_.api().destroy_qp(qp_); rc != 0) {
      MORI_LOG_WARN(kCore, "rdma: ibv_destroy_qp(", qp_->qp_num, ") failed: ", std::strerror(rc));
    }
  }
}

EndpointInfo RcQueuePair::LocalEndpoint() const {
  EndpointInfo e;
  e.qpn = qp_->qp_num;
  e.psn = psn_;
  e.lid = device_.port_attr().lid;
  e.port_num = device_.port();
  e.active_mtu = static_cast<uint8_t>(device_.port_attr().active_mtu);
  e.link_layer = device_.link_layer();
  e.gid = device_.gid_value();
  return e;
}

void RcQueuePair::Modify(const QpTransition& t, const char* what) {
  ibv_qp_attr a{};
  a.qp_state = static_cast<ibv_qp_state>(t.state);
  a.qp_access_flags = t.access_flags;
  a.pkey_index = t.pkey_index;
  a.port_num = t.port_num;
  a.path_mtu = static_cast<ibv_mtu>(t.path_mtu);
  a.dest_qp_num = t.dest_qpn;
  a.rq_psn = t.rq_psn;
  a.max_dest_rd_atomic = t.max_dest_rd_atomic;
  a.min_rnr_timer = t.min_rnr_timer;
  a.ah_attr.dlid = t.av.dlid;
  a.ah_attr.sl = t.av.sl;
  a.ah_attr.src_path_bits = t.av.src_path_bits;
  a.ah_attr.port_num = t.av.port_num;
  a.ah_attr.is_global = t.av.is_global ? 1 : 0;
  std::memcpy(a.ah_attr.grh.dgid.raw, t.av.dgid.data(), 16);
  a.ah_attr.grh.flow_label = t.av.flow_label;
  a.ah_attr.grh.sgid_index = t.av.sgid_index;
  a.ah_attr.grh.hop_limit = t.av.hop_limit;
  a.ah_attr.grh.traffic_class = t.av.traffic_class;
  a.timeout = t.timeout;
  a.retry_cnt = t.retry_cnt;
  a.rnr_retry = t.rnr_retry;
  a.sq_psn = t.sq_psn;
  a.max_rd_atomic = t.max_rd_atomic;
  if (int rc = device_.api().modify_qp(qp_, &a, static_cast<int>(t.attr_mask)); rc != 0) {
    ThrowVerb("ibv_modify_qp",
              StrCat(what, " of QP ", qp_->qp_num, " (mask 0x", std::hex, t.attr_mask, ")"), rc);
  }
}

void RcQueuePair::Connect(const QpConfig& config, const EndpointInfo& remote) {
  QpConfig c = config;
  c.port_num = device_.port();
  // The device bounds what a QP may ask for; asking for more fails ibv_modify_qp.
  const ibv_device_attr& dev = device_.device_attr();
  c.max_rd_atomic = static_cast<uint8_t>(std::min<int>(c.max_rd_atomic, dev.max_qp_init_rd_atom));
  c.max_dest_rd_atomic =
      static_cast<uint8_t>(std::min<int>(c.max_dest_rd_atomic, dev.max_qp_rd_atom));
  Modify(BuildInitTransition(c), "RESET->INIT");
  Modify(BuildRtrTransition(c, device_.PortInfo(), remote), "INIT->RTR");
  Modify(BuildRtsTransition(c, psn_), "RTR->RTS");
  MORI_LOG_DEBUG(kCore, "rdma: QP ", qp_->qp_num, " connected to QPN ", remote.qpn, " (LID ",
                 remote.lid, ", GID ", FormatGid(remote.gid), ")");
}

void RcQueuePair::MarkError() noexcept {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  device_.api().modify_qp(qp_, &a, IBV_QP_STATE);
}

int RcQueuePair::PostChain(const PlannedWr* wrs, size_t n, const PlannedSge* sges,
                           const PostTarget& target, uint32_t slot, size_t* posted) {
  *posted = 0;
  if (n == 0) return 0;
  wr_buf_.assign(n, ibv_send_wr{});
  size_t total_sges = 0;
  for (size_t i = 0; i < n; ++i) total_sges += wrs[i].sge_count;
  sge_buf_.resize(total_sges);
  size_t s = 0;
  for (size_t i = 0; i < n; ++i) {
    const PlannedWr& p = wrs[i];
    ibv_send_wr& w = wr_buf_[i];
    w.wr_id = EncodeWrId({WrKind::kSend, p.retire, slot});
    w.next = i + 1 < n ? &wr_buf_[i + 1] : nullptr;
    w.sg_list = p.sge_count ? &sge_buf_[s] : nullptr;
    w.num_sge = static_cast<int>(p.sge_count);
    for (uint32_t k = 0; k < p.sge_count; ++k, ++s) {
      const PlannedSge& g = sges[p.sge_begin + k];
      sge_buf_[s] = {target.local_base + g.local_offset, g.length, target.lkey};
    }
    w.opcode = static_cast<ibv_wr_opcode>(p.opcode);
    w.send_flags = p.send_flags;
    if (p.opcode == WrOpcode::kWriteWithImm) w.imm_data = htonl(p.imm);
    w.wr.rdma.remote_addr = target.remote_base + p.remote_offset;
    w.wr.rdma.rkey = target.rkey;
  }
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(qp_, wr_buf_.data(), &bad);
  *posted = rc == 0 ? n : bad != nullptr ? static_cast<size_t>(bad - wr_buf_.data()) : 0;
  return rc;
}

int RcQueuePair::PostReceives(uint32_t n) {
  std::vector<ibv_recv_wr> wrs(n);
  for (uint32_t i = 0; i < n; ++i) {
    wrs[i].wr_id = EncodeWrId({WrKind::kRecv, 0, i});
    wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    wrs[i].sg_list = nullptr;
    wrs[i].num_sge = 0;  // WRITE_WITH_IMM places its data by rkey; only the imm arrives here
  }
  ibv_recv_wr* bad = nullptr;
  return n == 0 ? 0 : ibv_post_recv(qp_, wrs.data(), &bad);
}

int RcQueuePair::PostSendOps(const SendOp* ops, size_t n) {
  if (n == 0) return 0;
  wr_buf_.assign(n, ibv_send_wr{});
  sge_buf_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const SendOp& op = ops[i];
    ibv_send_wr& w = wr_buf_[i];
    sge_buf_[i] = {op.local_addr, op.length, op.lkey};
    w.wr_id = op.wr_id;
    w.next = i + 1 < n ? &wr_buf_[i + 1] : nullptr;
    w.sg_list = op.length > 0 ? &sge_buf_[i] : nullptr;
    w.num_sge = op.length > 0 ? 1 : 0;
    w.opcode = static_cast<ibv_wr_opcode>(op.opcode);
    w.send_flags = op.signaled ? IBV_SEND_SIGNALED : 0;
    if (op.opcode == WrOpcode::kWrite) {
      w.wr.rdma.remote_addr = op.remote_addr;
      w.wr.rdma.rkey = op.rkey;
    }
  }
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp_, wr_buf_.data(), &bad);
}

int RcQueuePair::PostRecvOps(const RecvOp* ops, size_t n) {
  if (n == 0) return 0;
  std::vector<ibv_recv_wr> wrs(n);
  std::vector<ibv_sge> sges(n);
  for (size_t i = 0; i < n; ++i) {
    sges[i] = {ops[i].addr, ops[i].length, ops[i].lkey};
    wrs[i].wr_id = ops[i].wr_id;
    wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
  }
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp_, wrs.data(), &bad);
}

std::string DescribeWcStatus(const VerbsApi* api, int status) {
  const char* text =
      api != nullptr ? api->wc_status_str(static_cast<ibv_wc_status>(status)) : nullptr;
  return StrCat(WcStatusName(status), text != nullptr ? StrCat(" (", text, ")") : std::string(),
                ": ", WcStatusHint(status));
}

}  // namespace mori::transport::verbs

#endif  // MORI_CORE_WITH_VERBS
