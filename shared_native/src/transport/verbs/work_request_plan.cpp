// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/verbs/work_request_plan.hpp"

#include <algorithm>

#include "mori/core/error.hpp"

#if MORI_CORE_WITH_VERBS
#include <infiniband/verbs.h>

static_assert(static_cast<int>(mori::transport::verbs::WrOpcode::kWrite) == IBV_WR_RDMA_WRITE &&
                  static_cast<int>(mori::transport::verbs::WrOpcode::kWriteWithImm) ==
                      IBV_WR_RDMA_WRITE_WITH_IMM &&
                  static_cast<int>(mori::transport::verbs::WrOpcode::kSend) == IBV_WR_SEND &&
                  static_cast<int>(mori::transport::verbs::WrOpcode::kRead) == IBV_WR_RDMA_READ,
              "WrOpcode differs from enum ibv_wr_opcode");
static_assert(IBV_WC_SUCCESS == mori::transport::verbs::kWcSuccess &&
                  IBV_WC_WR_FLUSH_ERR == mori::transport::verbs::kWcFlushError &&
                  IBV_WC_LOC_LEN_ERR == mori::transport::verbs::kWcLocLenError &&
                  IBV_WC_LOC_PROT_ERR == mori::transport::verbs::kWcLocProtError &&
                  IBV_WC_REM_ACCESS_ERR == mori::transport::verbs::kWcRemAccessError &&
                  IBV_WC_RETRY_EXC_ERR == mori::transport::verbs::kWcRetryExceeded &&
                  IBV_WC_RETRY_EXC_ERR == 12 && IBV_WC_GENERAL_ERR == 21,
              "WcStatusName's table differs from enum ibv_wc_status");
static_assert(mori::transport::verbs::send_flag::kFence == IBV_SEND_FENCE &&
                  mori::transport::verbs::send_flag::kSignaled == IBV_SEND_SIGNALED,
              "send_flag differs from enum ibv_send_flags");
#endif

namespace mori::transport::verbs {

void ValidatePlanLimits(const PlanLimits& l) {
  MORI_CHECK_ARG(l.max_message_bytes >= 1 && l.max_message_bytes <= (uint64_t{1} << 31),
                 "max_message_bytes ", l.max_message_bytes, " outside [1, 2^31]");
  MORI_CHECK_ARG(l.max_sge >= 1, "max_sge ", l.max_sge, " must be >= 1");
  MORI_CHECK_ARG(l.signal_interval >= 1, "signal_interval ", l.signal_interval, " must be >= 1");
  MORI_CHECK_ARG(l.post_batch_size >= 1, "post_batch_size ", l.post_batch_size, " must be >= 1");
  MORI_CHECK_ARG(l.num_qps >= 1 && l.num_qps <= kImmMaxParts, "num_qps ", l.num_qps,
                 " outside [1, ", kImmMaxParts, "] (the notification counts parts in 7 bits)");
}

namespace {

// Whether [offset, offset + size) lies inside [0, limit), without overflow.
bool Inside(uint64_t offset, uint64_t size, uint64_t limit) {
  return size <= limit && offset <= limit - size;
}

// Sets signaled flags, retire counts and batch ends of one slice.
void ApplySignaling(QpPlan* slice, const PlanLimits& l) {
  size_t n = slice->wrs.size();
  size_t last_signaled = 0;  // index + 1 of the previous signaled WR
  for (size_t i = 0; i < n; ++i) {
    PlannedWr& wr = slice->wrs[i];
    wr.batch_end = (i + 1) % l.post_batch_size == 0 || i + 1 == n;
    bool signaled = (i + 1) % l.signal_interval == 0 || wr.batch_end;
    if (signaled) {
      wr.send_flags |= send_flag::kSignaled;
      wr.retire = static_cast<uint32_t>(i + 1 - last_signaled);
      last_signaled = i + 1;
      ++slice->signaled;
    }
  }
}

}  // namespace

TransferPlan PlanTransfer(PlanOp op, const PlanSpan* spans, size_t n, const PlanLimits& l,
                          uint64_t uid) {
  ValidatePlanLimits(l);
  MORI_CHECK_ARG(n == 0 || spans != nullptr, "PlanTransfer: ", n, " spans but no span array");
  uint64_t upper_bound = 0;
  for (size_t i = 0; i < n; ++i) {
    const PlanSpan& s = spans[i];
    MORI_CHECK_ARG(Inside(s.local_offset, s.size, l.local_size), "span ", i, ": local [",
                   s.local_offset, ", +", s.size, ") outside the local region of ", l.local_size,
                   " bytes");
    MORI_CHECK_ARG(Inside(s.remote_offset, s.size, l.remote_size), "span ", i, ": remote [",
                   s.remote_offset, ", +", s.size, ") outside the remote region of ", l.remote_size,
                   " bytes");
    upper_bound += s.size / l.max_message_bytes + (s.size % l.max_message_bytes != 0);
    MORI_CHECK_ARG(upper_bound <= kMaxPlannedWrs, "transfer needs more than ", kMaxPlannedWrs,
                   " work requests at max_message_bytes=", l.max_message_bytes, " (span ", i,
                   " of ", s.size, " bytes)");
  }

  const WrOpcode data_op = op == PlanOp::kWrite ? WrOpcode::kWrite : WrOpcode::kRead;
  std::vector<PlannedWr> wrs;
  std::vector<PlannedSge> sges;
  wrs.reserve(static_cast<size_t>(upper_bound));
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t lo = spans[i].local_offset;
    uint64_t ro = spans[i].remote_offset;
    uint64_t left = spans[i].size;
    total += left;
    while (left > 0) {
      PlannedWr* cur = wrs.empty() ? nullptr : &wrs.back();
      bool joins = cur != nullptr && cur->remote_offset + cur->length == ro &&
                   cur->length < l.max_message_bytes;
      if (joins) {
        PlannedSge& last = sges.back();
        bool local_contiguous = last.local_offset + last.length == lo;
        if (!local_contiguous && cur->sge_count >= l.max_sge) joins = false;
        if (joins) {
          uint64_t take = std::min<uint64_t>(left, l.max_message_bytes - cur->length);
          if (local_contiguous) {
            last.length += static_cast<uint32_t>(take);
          } else {
            sges.push_back({lo, static_cast<uint32_t>(take)});
            ++cur->sge_count;
          }
          cur->length += static_cast<uint32_t>(take);
          lo += take, ro += take, left -= take;
          continue;
        }
      }
      uint64_t take = std::min<uint64_t>(left, l.max_message_bytes);
      PlannedWr wr;
      wr.opcode = data_op;
      wr.remote_offset = ro;
      wr.length = static_cast<uint32_t>(take);
      wr.sge_begin = static_cast<uint32_t>(sges.size());
      wr.sge_count = 1;
      wrs.push_back(wr);
      sges.push_back({lo, static_cast<uint32_t>(take)});
      lo += take, ro += take, left -= take;
    }
  }

  TransferPlan plan;
  plan.bytes = total;
  if (wrs.empty() && !l.notify) return plan;

  size_t slices = wrs.empty() ? 1 : std::min<size_t>(l.num_qps, wrs.size());
  uint32_t imm = l.notify ? EncodeImm(uid, static_cast<uint32_t>(slices), op == PlanOp::kRead) : 0;
  plan.qps.resize(slices);
  for (size_t j = 0; j < slices; ++j) {
    QpPlan& slice = plan.qps[j];
    size_t begin = j * wrs.size() / slices;
    size_t end = (j + 1) * wrs.size() / slices;
    for (size_t w = begin; w < end; ++w) {
      PlannedWr wr = wrs[w];
      uint32_t first = wr.sge_begin;
      wr.sge_begin = static_cast<uint32_t>(slice.sges.size());
      slice.sges.insert(slice.sges.end(), sges.begin() + first,
                        sges.begin() + first + wr.sge_count);
      slice.bytes += wr.length;
      slice.wrs.push_back(wr);
    }
    if (l.notify) {
      if (op == PlanOp::kWrite && !slice.wrs.empty()) {
        slice.wrs.back().opcode = WrOpcode::kWriteWithImm;
        slice.wrs.back().imm = imm;
      } else {
        PlannedWr note;
        note.opcode = WrOpcode::kWriteWithImm;
        note.imm = imm;
        note.sge_begin = static_cast<uint32_t>(slice.sges.size());
        // After reads the notification must not overtake them at the target.
        if (op == PlanOp::kRead && !slice.wrs.empty()) note.send_flags = send_flag::kFence;
        slice.wrs.push_back(note);
      }
    }
    ApplySignaling(&slice, l);
    plan.wrs += slice.wrs.size();
  }
  return plan;
}

uint32_t EncodeImm(uint64_t uid, uint32_t parts, bool read) {
  MORI_CHECK_ARG(parts >= 1 && parts <= kImmMaxParts, "notification part count ", parts,
                 " outside [1, ", kImmMaxParts, "]");
  return (read ? 1u << 31 : 0u) | (parts << kImmUidBits) | static_cast<uint32_t>(uid & kImmUidMask);
}

ImmData DecodeImm(uint32_t imm) {
  ImmData d{imm & kImmUidMask, (imm >> kImmUidBits) & 0x7F, (imm >> 31) != 0};
  MORI_CHECK_ARG(d.parts != 0, "immediate data 0x", std::hex, imm,
                 " carries part count 0: not a mori notification");
  return d;
}

uint64_t EncodeWrId(const WrId& id) {
  MORI_CHECK_ARG(id.kind == WrKind::kSend || id.kind == WrKind::kRecv, "wr_id kind ",
                 static_cast<int>(id.kind), " is neither send (1) nor recv (2)");
  MORI_CHECK_ARG(id.retire <= kMaxRetire, "wr_id retire count ", id.retire,
                 " does not fit 24 bits");
  return (uint64_t{static_cast<uint8_t>(id.kind)} << 56) | (uint64_t{id.retire} << 32) | id.slot;
}

WrId DecodeWrId(uint64_t wr_id) {
  auto kind = static_cast<uint8_t>(wr_id >> 56);
  MORI_CHECK_ARG(
      kind == static_cast<uint8_t>(WrKind::kSend) || kind == static_cast<uint8_t>(WrKind::kRecv),
      "wr_id 0x", std::hex, wr_id, " has kind ", std::dec, int{kind}, ": not a mori work request");
  return {static_cast<WrKind>(kind), static_cast<uint32_t>((wr_id >> 32) & kMaxRetire),
          static_cast<uint32_t>(wr_id)};
}

namespace {

struct WcStatusText {
  const char* name;
  const char* hint;
};

// Indexed by enum ibv_wc_status.
constexpr WcStatusText kWcStatus[] = {
    {"IBV_WC_SUCCESS", "completed"},
    {"IBV_WC_LOC_LEN_ERR", "local length error: a message exceeds what the peer accepts"},
    {"IBV_WC_LOC_QP_OP_ERR", "local QP operation error: a malformed work request"},
    {"IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error"},
    {"IBV_WC_LOC_PROT_ERR", "local protection error: an SGE outside its registration (lkey)"},
    {"IBV_WC_WR_FLUSH_ERR", "flushed: the QP entered the error state before this ran"},
    {"IBV_WC_MW_BIND_ERR", "memory window bind error"},
    {"IBV_WC_BAD_RESP_ERR", "unexpected response from the peer"},
    {"IBV_WC_LOC_ACCESS_ERR", "local access error: the local region refuses the access"},
    {"IBV_WC_REM_INV_REQ_ERR", "the peer found the request invalid (length, opcode)"},
    {"IBV_WC_REM_ACCESS_ERR",
     "remote access error: bad rkey, range outside the peer's region, or access not granted"},
    {"IBV_WC_REM_OP_ERR", "the peer could not complete the operation"},
    {"IBV_WC_RETRY_EXC_ERR",
     "transport retries exhausted: no answer within timeout x retry_cnt (peer gone, path down)"},
    {"IBV_WC_RNR_RETRY_EXC_ERR",
     "receiver-not-ready retries exhausted: the peer posted no receive for a notification"},
    {"IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation"},
    {"IBV_WC_REM_INV_RD_REQ_ERR", "the peer refused an RDMA READ (responder resources)"},
    {"IBV_WC_REM_ABORT_ERR", "the peer aborted the operation"},
    {"IBV_WC_INV_EECN_ERR", "invalid EE context number"},
    {"IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state"},
    {"IBV_WC_FATAL_ERR", "fatal device error"},
    {"IBV_WC_RESP_TIMEOUT_ERR", "response timeout"},
    {"IBV_WC_GENERAL_ERR", "general error reported by the provider"},
    {"IBV_WC_TM_ERR", "tag matching error"},
    {"IBV_WC_TM_RNDV_INCOMPLETE", "tag matching rendezvous incomplete"},
};
constexpr int kWcStatusCount = static_cast<int>(sizeof(kWcStatus) / sizeof(kWcStatus[0]));

}  // namespace

std::string WcStatusName(int status) {
  if (status >= 0 && status < kWcStatusCount) return kWcStatus[status].name;
  return StrCat("IBV_WC_", status);
}

const char* WcStatusHint(int status) noexcept {
  if (status >= 0 && status < kWcStatusCount) return kWcStatus[status].hint;
  return "unknown completion status";
}

}  // namespace mori::transport::verbs
