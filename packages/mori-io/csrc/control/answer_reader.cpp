// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "control/answer_reader.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "control/connection.hpp"
#include "control/control_host.hpp"
#include "control/reactor.hpp"
#include "ledger/wait_options.hpp"
#include "mori/core/telemetry.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

namespace {
constexpr size_t kHdr = sizeof(wire::Header);
// The longest one poll(2) sleeps before the deadline is looked at again.
constexpr int64_t kPollSliceNs = 5'000'000;
}  // namespace

int64_t WaitPollNs() { return WaitOptions::Process().tcp_wait_poll_ns; }

bool LendAnswers(Conn& c) {
  int free = kRxFree;
  if (c.dead || !c.rx_owner.compare_exchange_strong(free, kRxLent, std::memory_order_acquire)) {
    return false;
  }
  c.rx_waiter = true;
  c.reactor->ArmOut(c, c.out_armed);
  return true;
}

void RevokeLend(Conn& c) {
  int lent = kRxLent;
  if (!c.rx_owner.compare_exchange_strong(lent, kRxFree, std::memory_order_acq_rel)) return;
  c.rx_waiter = false;
  if (!c.dead) c.reactor->ArmOut(c, c.out_armed);
}

void ReadAnswersWhileWaiting(const std::shared_ptr<void>& conn, TransferState& state,
                             int64_t deadline_ns) {
  Conn& c = *static_cast<Conn*>(conn.get());
  int owner = kRxLent;
  if (!c.rx_owner.compare_exchange_strong(owner, kRxWaiter, std::memory_order_acquire)) {
    owner = kRxFree;
    if (!c.rx_owner.compare_exchange_strong(owner, kRxWaiter, std::memory_order_acquire)) return;
  }
  MORI_SCOPED_TIMER(kIo, "io.tcp.waiter_reads");
  Reactor* reactor = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    // Mid-payload (a read's data) the stream belongs to the reactor's parser.
    if (c.dead || c.in_payload || !c.outbound) {
      c.rx_owner.store(kRxFree, std::memory_order_release);
      return;
    }
    reactor = c.reactor;
    if (!c.rx_waiter) {  // not lent (EPOLLIN still on): off now, so the reactor sleeps
      c.rx_waiter = true;
      reactor->ArmOut(c, c.out_armed);
    }
  }
  ControlHost& host = reactor->host();
  const int64_t busy_until = NowNs() + WaitPollNs();
  while (state.InProgress()) {
    bool hand_back = false;
    for (size_t avail = c.rlen - c.rpos; avail >= kHdr; avail -= kHdr) {
      wire::Header h;
      std::memcpy(&h, c.rbuf.data() + c.rpos, kHdr);
      if (h.version != wire::kVersion ||
          static_cast<wire::MsgType>(h.type) != wire::MsgType::kWriteAck) {
        hand_back = true;
        break;
      }
      Pending p;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        if (c.pending.empty() || c.pending.front().type != wire::MsgType::kWrite) {
          hand_back = true;  // the reactor's parser calls it a protocol error
          break;
        }
        p = c.pending.front();
        c.pending.pop_front();
      }
      c.rpos += kHdr;
      host.CountAnswerReadByWaiter();
      auto status = static_cast<wire::WireStatus>(h.status);
      host.CompletePart(p.record_id, wire::WireStatusCode(status),
                        status == wire::WireStatus::kOk ? "" : Reactor::Refusal(c, p, status));
    }
    if (hand_back || !state.InProgress()) break;
    if (c.rpos == c.rlen) {
      c.rpos = c.rlen = 0;
    } else if (c.rpos > 0) {  // a partial header: to the front, as the reactor does
      std::memmove(c.rbuf.data(), c.rbuf.data() + c.rpos, c.rlen - c.rpos);
      c.rlen -= c.rpos;
      c.rpos = 0;
    }
    ssize_t n;
    int err = 0;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.dead) break;  // Close failed the pending requests
      n = ::recv(c.fd, c.rbuf.data() + c.rlen, c.rbuf.size() - c.rlen, MSG_DONTWAIT);
      if (n < 0) err = errno;
      if (n > 0) c.progress_ns = NowNs();  // the stuck clock: bytes moved
    }
    if (n > 0) {
      c.rlen += static_cast<size_t>(n);
      continue;
    }
    // The end of the stream or an error: the reactor meets it again and closes.
    if (n == 0 || (err != EAGAIN && err != EWOULDBLOCK && err != EINTR)) break;
    const int64_t now = NowNs();
    if (now >= deadline_ns) break;
    if (now < busy_until) {
      // The thread that must answer (a target's reactor on this host) may be waiting
      // for this vCPU: spinning without yielding held it for the whole poll budget on
      // a contended 2-vCPU VM (80 against 25 us per write, BENCHMARKS.md).
      sched_yield();
      continue;
    }
    // Not under mu (a submitter may send meanwhile); the descriptor stays open while
    // we hold the receive side (Reactor::Close waits for us), and a Close shuts it
    // down, which wakes us.
    pollfd pfd{c.fd, POLLIN, 0};
    const int64_t slice = std::min(kPollSliceNs, deadline_ns - now);
    ::poll(&pfd, 1, static_cast<int>((slice + 999'999) / 1'000'000));
  }
  const bool buffered = c.rlen > c.rpos;
  std::lock_guard<std::mutex> lock(c.mu);
  c.rx_waiter = false;
  if (!c.dead) reactor->ArmOut(c, c.out_armed);  // a byte already there wakes the reactor
  c.rx_owner.store(kRxFree, std::memory_order_release);
  // Not dead under mu: the reactor is alive (its Close of c needs mu first).
  if (!c.dead && buffered) reactor->ResumeRead(std::static_pointer_cast<Conn>(conn));
}

}  // namespace mori::io
