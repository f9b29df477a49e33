// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "control/connection.hpp"
#include "control/log_throttle.hpp"
#include "ledger/transfer_state.hpp"
#include "registry/memory_registry.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class ControlChannel;
class ControlHost;
class ControlHandlers;

// One epoll loop over some of the engine's TCP connections: the hello, TCP's own
// kWrite/kRead and their answers, and every other message through the handlers the
// transports registered (ControlHandlers). The helpers in the public section are what
// those handlers use; they run on the reactor's thread.
class Reactor {
 public:
  // `listen_fd` >= 0: this reactor accepts; `on_start`/`on_stop` run on its thread.
  Reactor(ControlHost* host, ControlChannel* channel, int listen_fd, std::function<void()> on_start,
          std::function<void()> on_stop);
  ~Reactor();

  // Returns once the reactor runs (on_start has run then).
  void WaitStarted() { started_future_.wait(); }
  // Runs `task` on this reactor's thread (the second half of a large copy); tasks
  // still queued when the reactor stops run on the stopping thread, so none is lost.
  void Post(std::function<void()> task);
  // A waiting thread handed back connection `c` with bytes buffered in its rbuf: the
  // reactor parses them (the socket may hold nothing more to wake it). Dropped once
  // the reactor stopped. Takes only the task lock (callers hold c.mu).
  void ResumeRead(std::shared_ptr<Conn> c);
  void Stop();
  void Add(const std::shared_ptr<Conn>& c);
  void ArmOut(Conn& c, bool on);
  // Sends what the queue holds without blocking; arms EPOLLOUT for the rest. Called
  // with c.mu held. Returns 0 or the errno of a fatal send error.
  int FlushLocked(Conn& c);
  // With c.mu held, after answers were queued (inbound) or some left: stops or resumes
  // reading requests from the connection (kPauseQueued*, kResumeQueued*).
  void PaceRequests(Conn& c);
  // Closes the connection and fails every request still waiting on it. Owner thread
  // only (or after Stop).
  void Close(Conn& c, const std::string& reason, StatusDetail code = StatusDetail::ERR_PEER_LOST);
  std::shared_ptr<Conn> SharedOf(Conn& c);
  // Whether this reactor scanned its connections after `t_ns` and found none accepted
  // at or before `t_ns` still in its hello (any thread).
  bool HellosSettledSince(int64_t t_ns) const {
    return hello_scan_ns_.load(std::memory_order_acquire) > t_ns &&
           oldest_hello_ns_.load(std::memory_order_acquire) > t_ns;
  }

  // For message handlers.
  ControlHost& host() { return *host_; }
  // Receives the next `length` payload bytes into dst (null: discarded).
  void StartPayload(Conn& c, uint64_t length, char* dst);
  // Receives the request's payload (at most `max` bytes) into c.request_payload, then
  // runs the type's payload handler; false (with *why) when it is too large or the
  // connection carried too many side requests.
  bool ReceiveRequestPayload(Conn& c, uint64_t max, std::string* why);
  // The target's check of request c.cur against its registry (a lookup under the
  // registry's shared lock per part). With `enter`, a kOk lookup has entered the region's use count
  // (the caller leaves it once its bytes moved); a region being deregistered reads as unknown.
  RegionLookup Target(Conn& c, const wire::Header& h, bool enter, bool allow_gpu = false);
  // A part of a multi-part transfer is served only after its transfer's extent passed
  // the registry on this connection, so a transfer with one span out of bounds lands no
  // byte of the others. false: a protocol violation (no extent for this part); else
  // *refused is the extent's verdict (kOk: the part is then checked itself).
  bool ExtentVerdict(const Conn& c, const wire::Header& h, wire::WireStatus* refused,
                     std::string* why);
  // Records an inbound part in the engine's inbound statuses.
  void Account(Conn& c, const wire::Header& h, wire::WireStatus status);
  // Queues an answer (header only, or a payload kept alive elsewhere) for the end of the
  // read pass.
  void Answer(Conn& c, const SendItem& item) { c.out_local.push_back(item); }
  // Whether the connection may take one more side request (a short-lived connection
  // carries one; more than kMaxSideAnswers is a protocol violation).
  static bool SideAnswerRoom(const Conn& c);
  // The answer to a side request, its payload kept alive by the connection.
  void SideAnswer(Conn& c, const wire::Header& h, wire::MsgType type, wire::WireStatus st,
                  std::string payload);
  // The message of a transfer part the target refused.
  static std::string Refusal(const Conn& c, const Pending& p, wire::WireStatus s);

 private:
  void Loop();
  void RunTasks();
  void LoopUntilStopped();
  void CloseStuck(int64_t now, int64_t timeout_ns);
  // Why an authenticated inbound connection missed the deadline of the phase it is in
  // (header, payload, answers), or "" (reactor thread; c.mu held).
  std::string DeadlineMissed(const Conn& c, int64_t now, int64_t timeout_ns) const;
  void ShrinkRecvBuffer(Conn& c);
  void AcceptAll();
  void PauseAccept(int err);
  // Closes (or, on another reactor, shuts down) a connection AdmitHello dropped.
  void DropPendingHello(const std::shared_ptr<Conn>& c);
  void ResumeAcceptIfDue(int64_t now);
  void StagePayload(Conn& c, uint64_t length, char* dst, int dev);
  std::string Unstage(Conn& c, uint64_t length);
  bool FinishPayload(Conn& c);
  bool FinishHello(Conn& c);
  bool HandleHeader(Conn& c, std::string* why);
  bool HandleRequest(Conn& c, std::string* why);
  bool HandleResponse(Conn& c, std::string* why);
  bool OnReadable(Conn& c);
  bool HandleRecvResult(Conn& c, ssize_t n);
  bool FlushResponses(Conn& c);
  void OnWritable(Conn& c);
  void CloseAll(const std::string& reason);

  ControlHost* host_;
  ControlChannel* channel_;
  const ControlHandlers& handlers_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  int listen_fd_ = -1;
  std::function<void()> on_start_;
  std::function<void()> on_stop_;
  // PauseAccept's state (reactor thread only): the current interval and when the
  // listener rejoins the epoll set (0: it is in it).
  static constexpr int64_t kAcceptBackoffMinMs = 10;
  static constexpr int64_t kAcceptBackoffMaxMs = 1000;
  int64_t accept_backoff_ms_ = 0;
  int64_t accept_resume_ns_ = 0;
  // Warnings a peer can repeat, one per second per cause (LogThrottle).
  LogThrottle accept_failed_log_;
  LogThrottle no_secret_log_;      // a hello without this engine's secret
  LogThrottle not_accepted_log_;   // a hello that may not speak for its key
  LogThrottle peer_full_log_;      // a key holding max_connections_per_peer already
  LogThrottle hello_dropped_log_;  // the oldest pending hello dropped (max_pending_hellos)
  std::atomic<bool> stop_{false};
  // The last scan's start, and the oldest accept time of an inbound connection then still
  // in its hello (INT64_MAX: none); written by the reactor thread (HellosSettledSince).
  std::atomic<int64_t> hello_scan_ns_{0};
  std::atomic<int64_t> oldest_hello_ns_{INT64_MAX};
  std::promise<void> started_;
  std::future<void> started_future_;
  std::mutex tasks_mu_;
  std::vector<std::function<void()>> tasks_;
  bool tasks_stopped_ = false;
  std::thread thread_;
  std::mutex conns_mu_;
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;
  std::vector<std::shared_ptr<Conn>> graveyard_;  // freed after the event batch
};

}  // namespace mori::io
