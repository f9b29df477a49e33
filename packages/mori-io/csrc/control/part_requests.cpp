// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "control/part_requests.hpp"

#include <sys/socket.h>

#include <algorithm>

#include "control/answer_reader.hpp"
#include "control/control_host.hpp"
#include "control/reactor.hpp"
#include "mori/core/telemetry.hpp"
#include "registry/gpu_staging.hpp"

namespace mori::io {

std::shared_ptr<TransferState> PostParts(ControlHost& host, const TransferRequest& req,
                                         wire::MsgType write_type, wire::MsgType read_type) {
  const TcpBackendConfig& config = host.tcp_config();
  const MemoryRegion& local = req.local;
  const bool local_gpu = local.loc == MemoryLocationType::GPU;
  uint64_t chunk = config.enable_chunking ? config.chunk_size : ~uint64_t{0};
  if (local_gpu || req.remote.loc != MemoryLocationType::CPU) {
    chunk = std::min(chunk, staging::kGpuChunk);
  }
  uint64_t parts = 0;
  uint64_t extent_lo = ~uint64_t{0};  // the lowest offset and highest end of the spans
  uint64_t extent_hi = 0;
  for (size_t i = 0; i < req.n; ++i) {
    const TransferSpan& s = req.spans[i];
    // Not (size + chunk - 1) / chunk: with chunking off, chunk is UINT64_MAX and that
    // sum wraps to zero parts.
    if (s.size > 0) {
      parts += (s.size - 1) / chunk + 1;
      extent_lo = std::min(extent_lo, s.remote_offset);
      extent_hi = std::max(extent_hi, s.remote_offset + s.size);
    }
  }
  if (parts > UINT32_MAX) {
    return ControlHost::Finished(StatusDetail::ERR_INVALID_ARGS,
                                 StrCat("transfer of ", parts, " parts is too large"));
  }
  if (parts == 0) return ControlHost::Finished(StatusDetail::SUCCESS, {});

  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state =
      host.BeginTransfer(local, static_cast<uint32_t>(parts), false, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;

  PeerConnections* pc = req.conns;
  const size_t nconn = pc->conns.size();
  const uint32_t start = req.peer->next_conn.fetch_add(1, std::memory_order_relaxed);
  const bool write = req.op == Op::kWrite;
  const wire::MsgType type = write ? write_type : read_type;
  const bool payload = type == wire::MsgType::kWrite;
  const uint64_t remote_mem = req.remote.mem_id;
  char* local_base = reinterpret_cast<char*>(local.addr);
  wire::Header h{};
  h.type = static_cast<uint8_t>(type);
  h.version = wire::kVersion;
  h.num_parts = static_cast<uint32_t>(parts);
  h.uid = req.uid;
  h.mem_id = remote_mem;
  h.capability = req.remote.capability;
  // A single TCP write alone on its connection: its waiter may read the answer itself.
  const bool waiter_reads =
      parts == 1 && type == wire::MsgType::kWrite && host.options().tcp_waiter_reads;
  std::shared_ptr<Conn> answered_on;
  for (size_t k = 0; k < nconn && k < parts; ++k) {
    const std::shared_ptr<Conn>& conn = pc->conns[(start + k) % nconn];
    Conn& c = *conn;
    uint32_t refused = 0;
    uint32_t unstaged = 0;
    int err = 0;
    std::string dead_reason;
    std::string stage_error;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.pending.empty()) c.progress_ns = NowNs();  // the stall clock starts now
      if (parts > 1 && !c.dead) {  // the target checks the whole before any part
        wire::Header x = h;
        x.type = static_cast<uint8_t>(wire::MsgType::kTransferExtent);
        x.offset = extent_lo;
        x.length = extent_hi - extent_lo;
        c.sendq.push_back({x, nullptr, 0, 0, nullptr});
      }
      RevokeLend(c);   // an answer before ours must not wait for our waiter
      uint64_t p = 0;  // part index across the transfer; part p goes to connection p % nconn
      for (size_t i = 0; i < req.n; ++i) {
        const TransferSpan& s = req.spans[i];
        for (uint64_t off = 0; off < s.size; off += chunk, ++p) {
          if (p % nconn != k) continue;
          uint64_t len = std::min(chunk, s.size - off);
          if (c.dead) {
            ++refused;
            continue;
          }
          h.offset = s.remote_offset + off;
          h.length = len;
          char* local_ptr = local_base + s.local_offset + off;
          std::shared_ptr<char> staged;
          if (payload && local_gpu) {
            try {
              staged = staging::Buffer(len);
              staging::ToHost(staged.get(), local_ptr, len, local.device_id);
            } catch (const std::exception& e) {
              ++unstaged;
              stage_error = StrCat("staging ", len, " bytes of local GPU memory ", local.id,
                                   " failed: ", e.what());
              continue;
            }
          }
          const char* src = staged ? staged.get() : local_ptr;
          c.sendq.push_back({h, payload ? src : nullptr, payload ? len : 0, 0, nullptr, staged});
          c.pending.push_back({rid, type, write, local_ptr, len, remote_mem, h.offset, req.uid,
                               h.num_parts, local_gpu ? local.device_id : -1});
          if (waiter_reads && c.pending.size() == 1 && LendAnswers(c)) answered_on = conn;
        }
      }
      if (c.dead) {
        dead_reason = c.dead_reason;
      } else {
        err = c.reactor->FlushLocked(c);
        // The reactor notices the shutdown as a hang-up and fails this connection's
        // pending requests, ours included.
        if (err != 0) ::shutdown(c.fd, SHUT_RDWR);
      }
    }
    for (uint32_t r = 0; r < refused; ++r) {
      host.CompletePart(rid, StatusDetail::ERR_PEER_LOST,
                        StrCat("connection to remote engine '", req.remote.engine_key,
                               "' lost: ", dead_reason, "; register it again to retry"));
    }
    for (uint32_t r = 0; r < unstaged; ++r) {
      host.CompletePart(rid, StatusDetail::ERR_GPU_OP, stage_error);
    }
  }
  if (answered_on) state->SetWaitHelp(&ReadAnswersWhileWaiting, std::move(answered_on));
  return state;
}

}  // namespace mori::io
