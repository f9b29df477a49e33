// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Turning a transfer (spans of a local and a remote region) into RDMA work requests,
// and the encodings carried by them (wr_id, immediate data). Pure: no verbs calls, no
// <infiniband/verbs.h>; the transport copies a plan into ibv_send_wr chains.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mori/core/macros.hpp"

namespace mori::transport::verbs {

// enum ibv_wr_opcode values (checked against the header in work_request_plan.cpp).
enum class WrOpcode : uint8_t { kWrite = 0, kWriteWithImm = 1, kSend = 2, kRead = 4 };
// enum ibv_send_flags values.
namespace send_flag {
inline constexpr uint32_t kFence = 1u << 0;  // wait for earlier RDMA READs of this QP
inline constexpr uint32_t kSignaled = 1u << 1;
}  // namespace send_flag

enum class PlanOp { kRead, kWrite };

struct PlanSpan {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t size;
};

struct PlanLimits {
  uint64_t local_size = 0;                // bytes of the local region (bounds check)
  uint64_t remote_size = 0;               // bytes of the remote region
  uint64_t max_message_bytes = 1u << 30;  // per work request, 1..2^31 (IB's limit)
  uint32_t max_sge = 1;                   // scatter/gather entries per work request, >= 1
  uint32_t signal_interval = 16;          // signal every Nth WR of a QP's slice, >= 1
  uint32_t post_batch_size = 32;          // WRs per ibv_post_send, >= 1
  uint32_t num_qps = 1;                   // QPs the transfer is spread over, 1..127
  bool notify = true;                     // end each QP's slice with WRITE_WITH_IMM
};

// A plan larger than this is refused (a span of 2^40 bytes at 1-byte messages would
// otherwise allocate without bound).
inline constexpr uint64_t kMaxPlannedWrs = uint64_t{1} << 22;

struct PlannedSge {
  uint64_t local_offset;  // into the local region; the transport adds its address
  uint32_t length;
};

struct PlannedWr {
  WrOpcode opcode = WrOpcode::kWrite;
  uint32_t send_flags = 0;  // send_flag::*
  uint64_t remote_offset = 0;
  uint32_t length = 0;  // sum of its SGEs' lengths
  uint32_t sge_begin = 0;
  uint32_t sge_count = 0;
  uint32_t imm = 0;        // host order; only for kWriteWithImm
  bool batch_end = false;  // last WR of one ibv_post_send chain
  // For a signaled WR, how many send-queue slots its completion frees (itself and the
  // unsignaled WRs posted since the previous signaled one); 0 when unsignaled.
  uint32_t retire = 0;
};

// The work of one QP: its WRs in posting order, their SGEs.
struct QpPlan {
  std::vector<PlannedWr> wrs;
  std::vector<PlannedSge> sges;
  uint64_t bytes = 0;
  uint32_t signaled = 0;  // completions this slice produces
};

struct TransferPlan {
  std::vector<QpPlan> qps;  // non-empty slices only (parts of the transfer)
  uint64_t bytes = 0;
  uint64_t wrs = 0;
};

// Plans a one-sided transfer.
//  - Every span is checked against both regions (overflow-safe); a bad one raises
//    InvalidArgumentError naming its index and values. Zero-length spans are skipped.
//  - A span longer than max_message_bytes is cut into messages of at most that size.
//    Consecutive spans that are contiguous in remote memory share a WR (up to
//    max_message_bytes and max_sge); pieces contiguous locally too share an SGE.
//  - The WRs are cut into at most num_qps contiguous slices of near-equal count. In
//    each slice WRs are grouped into post batches of post_batch_size; a WR is signaled
//    if it is every signal_interval-th of its slice or ends a batch, so each batch's
//    send-queue slots are freed by a completion of that batch (no batch can wait on a
//    later one) and the queue's occupancy is bounded by the posted batches.
//  - With notify, each slice ends in a WRITE_WITH_IMM whose immediate data is
//    EncodeImm(uid, number of slices, op == read): for a write its last WRITE becomes
//    one; for a read a zero-length one is appended with the fence flag, so the target
//    hears of it only after the reads before it completed. A transfer of zero bytes
//    with notify is one zero-length WRITE_WITH_IMM; without notify it has no WRs.
MORI_API TransferPlan PlanTransfer(PlanOp op, const PlanSpan* spans, size_t n,
                                   const PlanLimits& limits, uint64_t uid);

// Immediate data of a notification (32 bits, sent big-endian as ibverbs requires):
//   bit 31      1 = the initiator READ the target's memory, 0 = it WROTE it
//   bits 30..24 the number of parts (QP slices) of the transfer, 1..127; the target
//               counts notifications per (peer, uid) and the transfer is complete
//               there once it saw this many
//   bits 23..0  the transfer uid modulo 2^24 (uids of one initiator are sequential,
//               so two transfers alias only 16M transfers apart)
inline constexpr uint32_t kImmUidBits = 24;
inline constexpr uint32_t kImmUidMask = (1u << kImmUidBits) - 1;
inline constexpr uint32_t kImmMaxParts = 127;

struct ImmData {
  uint32_t uid24;
  uint32_t parts;
  bool read;
};

// Throws InvalidArgumentError for parts outside [1, 127].
MORI_API uint32_t EncodeImm(uint64_t uid, uint32_t parts, bool read);
// Throws InvalidArgumentError for a value with parts == 0 (never sent by EncodeImm).
MORI_API ImmData DecodeImm(uint32_t imm);

// wr_id layout (64 bits):
//   bits 63..56 kind (1 = send-queue WR, 2 = receive WR for notifications)
//   bits 55..32 retire: send-queue slots its completion frees (24 bits)
//   bits 31..0  slot: the transfer's record (send) or the receive buffer index (recv)
enum class WrKind : uint8_t { kSend = 1, kRecv = 2 };

struct WrId {
  WrKind kind;
  uint32_t retire;
  uint32_t slot;
};

inline constexpr uint32_t kMaxRetire = (1u << 24) - 1;

// Throws InvalidArgumentError for retire over 24 bits or an unknown kind.
MORI_API uint64_t EncodeWrId(const WrId& id);
// Throws InvalidArgumentError for a kind that is neither send nor recv.
MORI_API WrId DecodeWrId(uint64_t wr_id);

// Completion status (enum ibv_wc_status) -> "IBV_WC_RETRY_EXC_ERR"; "IBV_WC_<n>" for
// a value this build does not know.
MORI_API std::string WcStatusName(int status);
// What a failed completion usually means, in a few words, for the transfer's message.
MORI_API const char* WcStatusHint(int status) noexcept;
inline constexpr int kWcSuccess = 0;
inline constexpr int kWcLocLenError = 1;      // a SEND longer than the receive buffer
inline constexpr int kWcLocProtError = 4;     // a local buffer outside its registration
inline constexpr int kWcFlushError = 5;       // flushed because the QP went to ERROR
inline constexpr int kWcRemAccessError = 10;  // remote address/rkey not registered there
inline constexpr int kWcRetryExceeded = 12;   // the peer did not answer (gone, link down)

// Throws InvalidArgumentError naming the first bad limit.
MORI_API void ValidatePlanLimits(const PlanLimits& limits);

}  // namespace mori::transport::verbs
