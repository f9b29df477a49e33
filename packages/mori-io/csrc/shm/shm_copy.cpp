// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// SHM's copies: a same-host transfer copied on the submitting thread, or split into
// shares copied at once by it and the reactors (MORI_IO_SHM_SPLIT_BYTES); memcpy into
// a mapped region or CMA with a grant; the target's liveness checked after each copy,
// and a write announced through the same-host services once its bytes are in place.
#include "shm/shm_transport.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "control/part_requests.hpp"
#include "control/reactor.hpp"
#include "control/socket_io.hpp"
#include "host/transport_host.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/macros.hpp"
#include "mori/core/telemetry.hpp"
#include "samehost/same_host.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

static_assert(sizeof(TransferSpan) == sizeof(CmaSpan) &&
                  offsetof(TransferSpan, local_offset) == offsetof(CmaSpan, local_offset) &&
                  offsetof(TransferSpan, remote_offset) == offsetof(CmaSpan, remote_offset) &&
                  offsetof(TransferSpan, size) == offsetof(CmaSpan, size),
              "TransferSpan and CmaSpan share one layout");

namespace {
// Splits `spans` (`bytes` in all) into at most `k` shares of about bytes / k each, a span
// cut where a share ends: share i is (*out)[(*begin)[i], (*begin)[i + 1]).
void SplitSpans(const TransferSpan* spans, size_t n, uint64_t bytes, uint32_t k,
                std::vector<CmaSpan>* out, std::vector<size_t>* begin) {
  const uint64_t per = (bytes + k - 1) / k;
  out->reserve(n + k);
  begin->push_back(0);
  uint64_t room = per;
  for (size_t i = 0; i < n; ++i) {
    CmaSpan s{spans[i].local_offset, spans[i].remote_offset, spans[i].size};
    while (s.size > 0) {
      if (room == 0) {
        begin->push_back(out->size());
        room = per;
      }
      const uint64_t take = std::min(room, s.size);
      out->push_back({s.local_offset, s.remote_offset, take});
      s = {s.local_offset + take, s.remote_offset + take, s.size - take};
      room -= take;
    }
  }
  begin->push_back(out->size());
}

// The CPUs this process may run on (its affinity mask), at least 1.
uint32_t UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<uint32_t>(n);
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? n : 1;
}
}  // namespace

// One same-host transfer in flight, split into shares copied at once by several threads
// (the submitting thread and reactors): each share copies its spans and completes one
// part of the transfer's ledger record; the share that finishes last checks the
// target's liveness and announces a write before its part completes.
struct ShmTransport::CopyJob {
  // The target's region, mapped here (memcpy) or granted (CMA); reset by the last share:
  // a revoke waiting for this copy may then be acknowledged.
  std::shared_ptr<ShmMapping> map;
  std::shared_ptr<CmaRemote> cma;
  std::shared_ptr<Peer> peer;
  std::shared_ptr<Conn> conn;  // for the announcement when the ring has no room
  CopyView view;               // of the above, while they are held
  uint64_t rid = 0;
  uint64_t uid = 0;
  uint64_t bytes = 0;
  std::vector<CmaSpan> spans;  // the shares' spans, back to back
  std::vector<size_t> begin;   // share i is spans[begin[i], begin[i + 1])
  std::atomic<uint32_t> shares_left{1};
  std::atomic<bool> failed{false};
};

ShmTransport::CopyView::CopyView(const TransferRequest& req, ShmMapping* m, CmaRemote* c)
    : map(m),
      cma(c),
      peer(req.peer.get()),
      local_base(reinterpret_cast<char*>(req.local.addr)),
      pid(m ? m->owner->pid() : c->pid),
      remote_mem(req.remote.mem_id),
      write(req.op == Op::kWrite) {}

void ShmTransport::ChannelStarting() {
  same_host_->ChannelStarting();
  // The submitting thread and one share per reactor, no more than the CPUs we may use.
  const uint32_t threads = static_cast<uint32_t>(host_->tcp_config().num_worker_threads) + 1;
  max_shares_.store(std::min(threads, UsableCpus()), std::memory_order_relaxed);
}

uint32_t ShmTransport::SharesFor(uint64_t bytes) const {
  const uint64_t split = host_->options().shm_split_bytes;
  const uint32_t most = max_shares_.load(std::memory_order_relaxed);
  if (split == 0 || bytes < split || most < 2) return 1;
  // Shares of at least half the threshold: a transfer just past it goes in two.
  const uint64_t k = bytes / std::max<uint64_t>(split / 2, 1);
  return static_cast<uint32_t>(std::min<uint64_t>(k, most));
}

// Marks the peer failed; the message of a transfer that met its target gone.
std::string ShmTransport::PeerGone(Peer& peer, int pid, uint64_t mem_id, bool write) {
  const std::string why = StrCat("remote engine ", LogSafe(peer.key), " (pid ", pid,
                                 ") exited or was closed; its memory ", mem_id, " is gone");
  peer.MarkFailed(why);
  return StrCat(write ? "write" : "read", " failed: ", why, "; register it again to retry");
}

std::string ShmTransport::CopyLost(const CopyView& v) {
  return PeerGone(*v.peer, v.pid, v.remote_mem, v.write);
}

StatusDetail ShmTransport::CopySpans(const CopyView& v, const CmaSpan* spans, size_t n,
                                     std::string* error) {
  if (v.map) {
    // Into or out of the target's pages mapped here; the mapping (held by the caller)
    // cannot be unmapped by a revoke meanwhile.
    MORI_SCOPED_TIMER(kIo, "io.shm.memcpy_share");
    char* l = v.local_base;
    char* r = v.map->region;
    for (size_t i = 0; i < n; ++i) {
      if (v.write) {
        std::memcpy(r + spans[i].remote_offset, l + spans[i].local_offset, spans[i].size);
      } else {
        std::memcpy(l + spans[i].local_offset, r + spans[i].remote_offset, spans[i].size);
      }
    }
    return StatusDetail::SUCCESS;
  }
  int err;
  {
    MORI_SCOPED_TIMER(kIo, "io.shm.cma_copy");
    err = CmaCopySpans(v.pid, v.write, v.local_base, v.cma->addr, spans, n);
  }
  if (MORI_LIKELY(err == 0)) return StatusDetail::SUCCESS;
  if (err == ESRCH) {
    *error = CopyLost(v);
    return StatusDetail::ERR_PEER_LOST;
  }
  *error = StrCat(v.write ? "process_vm_writev" : "process_vm_readv", " of ", n,
                  " span(s) with pid ", v.pid, " (remote engine ", LogSafe(v.peer->key),
                  ", memory ", v.remote_mem, ") failed: ", ErrnoText(err));
  if (err == EPERM) {
    // Allowed at connect, refused now: later transfers of this pair go over TCP.
    StateOf(*v.peer).refused.store(true, std::memory_order_release);
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': ", *error,
                  "; transfers to it fall back to TCP");
  }
  return StatusDetail::ERR_TRANSPORT;
}

void ShmTransport::CopyShare(CopyJob& job, const CmaSpan* spans, size_t n) {
  std::string error;
  StatusDetail code = CopySpans(job.view, spans, n, &error);
  if (code != StatusDetail::SUCCESS) job.failed.store(true, std::memory_order_release);
  // The other shares' copies happen before this decrement's acquire, so the last share's
  // liveness check below comes after every byte of the transfer was in place.
  if (job.shares_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    // As in CopyNow: success only if the target still ran after the last byte.
    if (!job.failed.load(std::memory_order_acquire)) {
      if (MORI_UNLIKELY(!job.view.TargetAlive())) {
        code = StatusDetail::ERR_PEER_LOST;
        error = CopyLost(job.view);
      } else if (job.view.write) {  // announced before the status completes, as for P2P
        job.map.reset();
        job.cma.reset();
        same_host_->AnnounceWrite(*job.peer, job.conn, job.uid, job.view.remote_mem, job.bytes);
      }
    }
    job.map.reset();  // a revoke waiting for this copy may be acknowledged now
    job.cma.reset();
  }
  host_->CompletePart(job.rid, code, error);
}

std::shared_ptr<TransferState> ShmTransport::SubmitInShares(const TransferRequest& req,
                                                            std::shared_ptr<ShmMapping> map,
                                                            std::shared_ptr<CmaRemote> cma,
                                                            uint64_t bytes, uint32_t shares) {
  auto job = std::make_shared<CopyJob>();
  SplitSpans(req.spans, req.n, bytes, shares, &job->spans, &job->begin);
  const auto parts = static_cast<uint32_t>(job->begin.size() - 1);
  uint64_t rid = SubmissionLedger::kNoRecord;
  std::shared_ptr<TransferState> state = host_->BeginTransfer(req.local, parts, false, &rid);
  if (rid == SubmissionLedger::kNoRecord) return state;
  job->peer = req.peer;
  job->rid = rid;
  job->uid = req.uid;
  job->bytes = bytes;
  job->map = std::move(map);
  job->cma = std::move(cma);
  const CopyView& v = job->view = CopyView(req, job->map.get(), job->cma.get());
  if (v.write) job->conn = req.peer->NextConn(*req.conns);
  // Copy only while the target's engine is known to run (one load), as for one share.
  if (MORI_UNLIKELY(!v.TargetAlive())) {
    const std::string error = CopyLost(v);
    job->map.reset();
    job->cma.reset();
    for (uint32_t p = 0; p < parts; ++p) {
      host_->CompletePart(rid, StatusDetail::ERR_PEER_LOST, error);
    }
    return state;
  }
  job->shares_left.store(parts, std::memory_order_relaxed);
  split_copies_.fetch_add(1, std::memory_order_relaxed);
  // Share 0 on this thread, the others on reactors (round robin: one each while there
  // are no more shares than reactors, which SharesFor keeps).
  for (uint32_t i = 1; i < parts; ++i) {
    host_->channel().Post([this, job, i] {
      CopyShare(*job, job->spans.data() + job->begin[i], job->begin[i + 1] - job->begin[i]);
    });
  }
  CopyShare(*job, job->spans.data(), job->begin[1]);
  return state;
}

std::shared_ptr<TransferState> ShmTransport::CopyNow(const TransferRequest& req,
                                                     std::shared_ptr<ShmMapping> map,
                                                     std::shared_ptr<CmaRemote> cma,
                                                     uint64_t bytes) {
  if (auto refused = host_->EnterLocal(req.local)) return refused;
  const CopyView v(req, map.get(), cma.get());
  std::string error;
  StatusDetail code = StatusDetail::SUCCESS;
  // A CMA grant names a pid, and a pid is reused once its process is gone: copy only
  // while the target's engine is known to run (one load), so a cached grant never
  // reaches a later process that got the same pid. (What remains is the time from this
  // load to the syscall: the pid would have to be freed and handed to a new process
  // within it, as between a per-transfer grant's arrival and its copy before.) A mapping
  // reaches only the target's pages: it is checked after the copy alone.
  if (MORI_UNLIKELY(cma && !v.TargetAlive())) {
    code = StatusDetail::ERR_PEER_LOST;
    error = CopyLost(v);
  } else {
    code = CopySpans(v, reinterpret_cast<const CmaSpan*>(req.spans), req.n, &error);
  }
  // A mapped copy "succeeds" even into a dead target (our mapping keeps its pages), and
  // its TCP connections report the death only later; a CMA grant names a pid that a
  // later process may get. Success only if the target's engine still ran after the bytes
  // were in place (written) or taken (read): its liveness word is loaded after the copy
  // (no syscall). A target that dies after that is one that died after receiving the
  // write (as after a TCP write's acknowledgement).
  if (code == StatusDetail::SUCCESS && MORI_UNLIKELY(!v.TargetAlive())) {
    code = StatusDetail::ERR_PEER_LOST;
    error = CopyLost(v);
  }
  map.reset();  // a revoke waiting for this copy may be acknowledged now
  cma.reset();
  if (code == StatusDetail::SUCCESS && v.write) {  // announced before the status exists
    same_host_->AnnounceWrite(*req.peer, *req.conns, req.uid, req.remote.mem_id, bytes);
  }
  // Left before the status is final: a caller that saw it may deregister its memory.
  if (RegionUse* use = req.local.use.get()) use->Leave();
  return ControlHost::Finished(code, std::move(error));
}

std::shared_ptr<TransferState> ShmTransport::SubmitCma(const TransferRequest& req,
                                                       std::shared_ptr<CmaRemote> remote) {
  MORI_SCOPED_TIMER(kIo, "io.shm.cma_direct");
  // The grant's size is the target's registered size: the whole transfer is checked
  // against it before any byte moves.
  if (auto err = ControlHost::RemoteBoundsError(req, remote->size)) return err;
  uint64_t bytes = 0;
  for (size_t i = 0; i < req.n; ++i) bytes += req.spans[i].size;
  // Asked before the copy, as the announcement needs it.
  if (req.op == Op::kWrite) same_host_->NoticeRingOf(*req.peer);
  if (const uint32_t shares = SharesFor(bytes); shares > 1) {
    return SubmitInShares(req, nullptr, std::move(remote), bytes, shares);
  }
  return CopyNow(req, nullptr, std::move(remote), bytes);
}

std::shared_ptr<TransferState> ShmTransport::SubmitMapped(const TransferRequest& req,
                                                          std::shared_ptr<ShmMapping> remote) {
  MORI_SCOPED_TIMER(kIo, "io.shm.memcpy");
  if (auto err = ControlHost::RemoteBoundsError(req, remote->size)) return err;
  if (req.op == Op::kWrite) same_host_->NoticeRingOf(*req.peer);
  uint64_t bytes = 0;
  for (size_t i = 0; i < req.n; ++i) bytes += req.spans[i].size;
  if (const uint32_t shares = SharesFor(bytes); shares > 1) {
    return SubmitInShares(req, std::move(remote), nullptr, bytes, shares);
  }
  return CopyNow(req, std::move(remote), nullptr, bytes);
}

}  // namespace mori::io
