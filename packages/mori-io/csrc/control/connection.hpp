// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "control/recv_buffer.hpp"
#include "registry/memory_registry.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class Reactor;
struct Peer;

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct SendItem {
  wire::Header hdr;
  const char* payload;  // not owned: registered memory
  uint64_t len;         // payload bytes to send after the header
  uint64_t sent;        // bytes of header + payload already sent
  RegionUse* use;       // a target's read response: entered, left once sent or dropped
  std::shared_ptr<char> staged = nullptr;  // payload's staging buffer (GPU memory), if any
};

inline void LeaveAll(std::deque<SendItem>& q) {
  for (SendItem& it : q) {
    if (it.use != nullptr) it.use->Leave();
  }
  q.clear();
}

// An initiator's request awaiting its response.
struct Pending {
  uint64_t record_id;  // SubmissionLedger::kNoRecord: nothing to complete (a failed copy's
                       // done message, whose part already failed)
  wire::MsgType type;
  bool write;  // moves bytes into the target (for messages)
  char* local;
  uint64_t length;
  uint64_t mem_id;
  uint64_t offset;
  uint64_t uid;
  uint32_t num_parts;
  int gpu_device = -1;  // a read into GPU memory of this device: received via staging
};

// What a transport keeps per connection beyond the TCP state (ControlHandlers hands
// out the slots), released when the connection closes.
struct ConnExtension {
  virtual ~ConnExtension() = default;
  // Work the peer still owes on this connection: the stuck clock applies.
  virtual bool Busy() const = 0;
  // The connection closed (reactor thread).
  virtual void Release() = 0;
};
inline constexpr size_t kMaxConnExtensions = 4;

// Who reads a connection's receive side (Conn::rx_owner).
inline constexpr int kRxFree = 0;
inline constexpr int kRxReactor = 1;  // its reactor, in a read pass
inline constexpr int kRxWaiter = 2;   // a thread waiting for its answer (control/answer_reader.hpp)
inline constexpr int kRxLent = 3;     // kept for the waiter of the transfer just submitted

// One TCP connection. The send side (queue, pending responses, liveness) is shared by
// submitting threads and the owning reactor, under `mu`; the receive side belongs to
// whoever holds `rx_owner`: the reactor, or on an outbound connection a thread that
// waits for the answer of its transfer (EPOLLIN is off meanwhile).
struct Conn {
  int fd = -1;
  bool outbound = false;
  Reactor* reactor = nullptr;
  std::string remote_key;
  std::weak_ptr<Peer> peer;
  std::string peer_addr;
  int remote_pid = 0;  // outbound: the target's pid (its EngineDesc's)

  std::mutex mu;
  std::deque<SendItem> sendq;
  std::deque<Pending> pending;  // outbound: requests awaiting their response, in order
  bool dead = false;
  bool out_armed = false;
  bool in_paused = false;     // inbound: not reading requests (answers queued; under mu)
  uint64_t queued_bytes = 0;  // inbound: payload bytes of the answers in sendq (under mu)
  bool need_flush = false;    // the reactor queued requests in sendq
  bool rx_waiter = false;     // outbound: a waiter reads the answers; EPOLLIN off (under mu)
  std::atomic<int> rx_owner{kRxFree};
  std::string dead_reason;
  // Last time a byte was sent, or work was queued on an idle connection (NowNs).
  int64_t progress_ns = 0;

  RecvBuffer rbuf;
  size_t rpos = 0;
  size_t rlen = 0;
  // Set after a payload was received straight into its destination: large messages
  // tend to follow each other, so the next buffered read takes only the header and
  // the next payload goes direct too instead of up to a buffer's worth of it being
  // staged and copied.
  bool header_only = false;
  wire::Header cur{};
  bool in_payload = false;
  uint64_t payload_left = 0;
  char* payload_dst = nullptr;  // null: discard the payload
  wire::WireStatus cur_status = wire::WireStatus::kOk;
  Pending cur_pending{};
  bool hello_done = false;
  bool idle_closed = false;  // outbound: the target said kIdleClose (reactor only)
  std::string hello;
  std::string credential;  // inbound: what the hello proved (InitiatorCredential); "" none
  int64_t opened_ns = 0;   // inbound: accepted (NowNs); a hello must complete in time
  // Inbound, accepted and not yet through its hello: counted against max_pending_hellos
  // (ControlChannel::AdmitHello); cleared once, by whoever settles it (the hello's end,
  // the close, or the drop of the oldest pending connection).
  std::atomic<bool> awaiting_hello{false};
  // Inbound, after the hello (reactor only). The first bytes of a header that has not
  // completed arrived then (0: none buffered); it must complete within
  // transfer_timeout_ms, however slowly its bytes trickle in.
  int64_t header_since_ns = 0;
  // The current payload began then, of this many bytes: it must keep up
  // kMinPayloadBytesPerS after transfer_timeout_ms (Reactor::CloseStuck), refused or
  // not, since a peer trickling bytes resets the stuck clock with each one.
  int64_t payload_since_ns = 0;
  uint64_t payload_bytes = 0;
  int64_t rx_ns = 0;             // last readiness event (reactor only)
  RegionUse* cur_use = nullptr;  // inbound write mid-payload: its region, entered
  // The current payload is received into stage_in and then copied to stage_dst, GPU
  // memory of stage_dev (reads into local GPU memory; inbound writes into it).
  std::shared_ptr<char> stage_in;
  char* stage_dst = nullptr;
  int stage_dev = -1;
  // Inbound: answers to side requests (grants, keys), alive until the connection closes
  // (a short-lived connection carries one; more than kMaxSideAnswers is a protocol
  // violation).
  std::deque<std::string> side_answers;
  std::string request_payload;      // inbound: a side request's payload
  std::vector<SendItem> out_local;  // responses of one read pass, queued at its end
  // Inbound: the last kTransferExtent, which the following parts of its transfer need.
  bool extent_set = false;
  uint64_t extent_uid = 0;
  uint64_t extent_mem = 0;
  wire::WireStatus extent_status = wire::WireStatus::kOk;
  // Transports' per-connection state (reactor thread only).
  std::array<std::unique_ptr<ConnExtension>, kMaxConnExtensions> ext;
};

// Queues a header-only message on `c` for its reactor to send (EPOLLOUT armed once;
// messages queued meanwhile leave in the same sendmsg), so the calling thread runs no
// socket send. `answer`: the response the peer will send, or null for a message that
// answers nothing. Dropped when the connection is dead.
void PostOnConn(Conn& c, const wire::Header& h, const Pending* answer);
// Tells the initiator of idle inbound connection `c` that it is about to be closed
// (kIdleClose); `c.mu` held, its send queue empty.
void SendIdleClose(Conn& c);

}  // namespace mori::io
