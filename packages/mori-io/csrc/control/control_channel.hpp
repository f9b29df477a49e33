// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/control_handlers.hpp"
#include "control/tcp_config.hpp"
#include "ledger/transfer_state.hpp"
#include "registry/peer_registry.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class ControlHost;
class Reactor;

// The TCP connections between engines and the epoll reactors serving them: TCP's own
// data path and every other transport's control messages (ControlHandlers).
class ControlChannel {
 public:
  explicit ControlChannel(ControlHost* host);
  ~ControlChannel();

  ControlHandlers& handlers() { return handlers_; }
  const ControlHandlers& handlers() const { return handlers_; }

  // Starts config.num_worker_threads reactors, the first accepting on `listen_fd`;
  // `on_start`/`on_stop` run on the first reactor's thread as it starts and before it
  // ends. Returns once that reactor runs.
  void Start(const TcpBackendConfig& config, int listen_fd, std::function<void()> on_start,
             std::function<void()> on_stop);
  // Stops the reactors and closes every connection, failing what was pending.
  void Stop();
  bool running() const { return !reactors_.empty(); }
  // Hands a connection to a reactor (round robin).
  void Add(std::shared_ptr<Conn> conn);
  // Runs `task` on a reactor's thread (round robin).
  void Post(std::function<void()> task);

  // An inbound connection just accepted awaits its hello: counted against
  // max_pending_hellos; past it, the oldest connection still awaiting its hello is
  // returned, uncounted, for the caller to close (else null). The accepting reactor only.
  std::shared_ptr<Conn> AdmitHello(const std::shared_ptr<Conn>& conn);
  // The hello of `conn` ended (passed, refused, or the connection closed): uncounted.
  // False when it was not counted any more (AdmitHello dropped it).
  bool SettleHello(Conn& conn);
  // Inbound connections by the initiator key their hello named: `conn` is noted unless
  // `max` open connections of that key are already (then false).
  bool NoteInbound(const std::string& initiator_key, std::weak_ptr<Conn> conn, size_t max);
  // An inbound connection of `key` that is not closed, or null.
  // Shuts down every inbound connection of initiator `key` (its reactors then close
  // them as hung up); how many there were.
  size_t CutOff(const std::string& key);
  std::shared_ptr<Conn> LiveInbound(const std::string& key);
  // Whether an open inbound connection of `key` proved another credential.
  bool CredentialConflicts(const std::string& key, const std::string& credential);
  // Shuts down the inbound connections of `key` that proved another credential than
  // `credential` (the initiator was registered here: connections that spoke for it
  // before without its EngineDesc's secret go); how many.
  size_t CutOffOthers(const std::string& key, const std::string& credential);
  // Whether every reactor scanned after `t_ns` and found no connection accepted by then
  // still in its hello (Reactor::HellosSettledSince).
  bool HellosSettledSince(int64_t t_ns) const;

  // Opens the peer's connections (each starting with a hello), runs `before_serving` on
  // them while no reactor reads them yet, then publishes them; null with *error when the
  // peer cannot be reached.
  PeerConnections* Connect(const std::shared_ptr<Peer>& peer,
                           const std::function<void(PeerConnections&)>& before_serving,
                           std::string* error);
  // One request and its answer on a connection of its own (grants, mappings, keys: rare,
  // blocking, bounded by peer_timeout_ms). False with *code/*error when the peer refused
  // or could not be reached. `mem_id` and its `capability`: the region named (0, 0: none).
  bool SideRequest(const Peer& peer, wire::MsgType type, wire::MsgType answer_type, uint64_t mem_id,
                   uint64_t capability, const std::string& payload, std::string* answer,
                   StatusDetail* code, std::string* error, wire::WireStatus* status_out = nullptr);
  // The same exchange, header only, on `fd` before it is served (a probe at connect):
  // the answer's header into *answer; "" or why it failed.
  std::string Exchange(int fd, wire::MsgType type, wire::Header* answer);

 private:
  // The first message on every connection this engine opens: a hello presenting the
  // peer's secret and naming our key.
  std::string HelloMessage(const Peer& peer) const;
  ControlHost* host_;
  ControlHandlers handlers_;
  std::vector<std::unique_ptr<Reactor>> reactors_;
  std::atomic<uint32_t> next_reactor_{0};
  // AdmitHello's connections in accept order (accepting reactor only), and how many
  // of them still await their hello.
  std::deque<std::weak_ptr<Conn>> hello_queue_;
  std::atomic<size_t> hellos_pending_{0};
  std::mutex inbound_mu_;
  std::unordered_multimap<std::string, std::weak_ptr<Conn>> inbound_by_key_;
};

}  // namespace mori::io
