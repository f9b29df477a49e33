// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "control/control_channel.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include "control/answer_reader.hpp"
#include "control/control_host.hpp"
#include "control/reactor.hpp"
#include "control/socket_io.hpp"
#include "mori/core/logging.hpp"
#include "wire/log_safe.hpp"
#include "wire/secret.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

namespace {
constexpr size_t kHdr = sizeof(wire::Header);
constexpr uint64_t kMaxSideAnswerBytes = 1 << 22;
}  // namespace

void PostOnConn(Conn& c, const wire::Header& h, const Pending* answer) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.dead) return;
  // The stall clock starts when the connection turns busy: a message that answers
  // nothing makes it busy too, and on a connection that carried nothing yet (or idled
  // past transfer_timeout_ms) the reaper would otherwise find it stuck since then.
  if (c.pending.empty() && (answer != nullptr || c.sendq.empty())) c.progress_ns = NowNs();
  RevokeLend(c);  // the reactor reads whatever answers this
  if (answer != nullptr) c.pending.push_back(*answer);
  c.sendq.push_back({h, nullptr, 0, 0, nullptr});
  if (!c.out_armed) {
    c.reactor->ArmOut(c, true);
    c.out_armed = true;
  }
}

void ControlHandlers::OnSideRequest(wire::MsgType type, wire::MsgType answer_type, Grant grant) {
  OnRequest(type, [answer_type, grant = std::move(grant)](Reactor& r, Conn& c, std::string* why) {
    if (!Reactor::SideAnswerRoom(c)) {
      *why = StrCat("more side requests (type ", int(c.cur.type), ") than one connection carries");
      return false;
    }
    std::string payload;
    wire::WireStatus st = grant(c, &payload);
    r.SideAnswer(c, c.cur, answer_type, st, std::move(payload));
    return true;
  });
}

ControlChannel::ControlChannel(ControlHost* host) : host_(host) {
  handlers_.OnNotice(wire::MsgType::kIdleClose, [](Reactor&, Conn& c, std::string*) {
    c.idle_closed = true;  // the close that follows is the target's, not a lost peer
    return true;
  });
}

void SendIdleClose(Conn& c) {
  wire::Header h = wire::MakeHeader(wire::MsgType::kIdleClose);
  // The connection carries nothing (its send queue is empty): one header fits the
  // socket buffer, and a peer that cannot take it is closed all the same.
  ssize_t ignored = ::send(c.fd, &h, kHdr, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
}

ControlChannel::~ControlChannel() { Stop(); }

void ControlChannel::Start(const TcpBackendConfig& config, int listen_fd,
                           std::function<void()> on_start, std::function<void()> on_stop) {
  for (int i = 0; i < config.num_worker_threads; ++i) {
    reactors_.push_back(std::make_unique<Reactor>(host_, this, i == 0 ? listen_fd : -1,
                                                  i == 0 ? on_start : nullptr,
                                                  i == 0 ? on_stop : nullptr));
  }
  reactors_[0]->WaitStarted();
}

void ControlChannel::Stop() {
  for (auto& r : reactors_) r->Stop();
  reactors_.clear();  // closes every connection, failing what was pending
}

void ControlChannel::Add(std::shared_ptr<Conn> conn) {
  reactors_[next_reactor_.fetch_add(1, std::memory_order_relaxed) % reactors_.size()]->Add(conn);
}

void ControlChannel::Post(std::function<void()> task) {
  if (reactors_.empty()) {  // stopped (the engine is shutting down): run here, as a
    task();                 // stopped reactor does
    return;
  }
  reactors_[next_reactor_.fetch_add(1, std::memory_order_relaxed) % reactors_.size()]->Post(
      std::move(task));
}

std::shared_ptr<Conn> ControlChannel::AdmitHello(const std::shared_ptr<Conn>& conn) {
  const size_t max = host_->tcp_config().max_pending_hellos;
  conn->awaiting_hello.store(true, std::memory_order_relaxed);
  hellos_pending_.fetch_add(1, std::memory_order_relaxed);
  hello_queue_.push_back(conn);
  auto waiting = [](const std::weak_ptr<Conn>& w) {
    std::shared_ptr<Conn> c = w.lock();
    return c && c->awaiting_hello.load(std::memory_order_relaxed);
  };
  std::shared_ptr<Conn> dropped;
  while (hellos_pending_.load(std::memory_order_relaxed) > max && !hello_queue_.empty()) {
    std::shared_ptr<Conn> oldest = hello_queue_.front().lock();
    hello_queue_.pop_front();
    if (oldest && oldest->awaiting_hello.exchange(false, std::memory_order_relaxed)) {
      hellos_pending_.fetch_sub(1, std::memory_order_relaxed);
      dropped = std::move(oldest);
      break;  // one admitted, at most one out
    }
  }
  while (!hello_queue_.empty() && !waiting(hello_queue_.front())) hello_queue_.pop_front();
  // Settled entries behind a waiting one accumulate: swept when they outnumber the bound.
  if (hello_queue_.size() > 2 * max + 64) {
    std::deque<std::weak_ptr<Conn>> kept;
    for (const auto& w : hello_queue_) {
      if (waiting(w)) kept.push_back(w);
    }
    hello_queue_.swap(kept);
  }
  return dropped;
}

bool ControlChannel::SettleHello(Conn& conn) {
  if (!conn.awaiting_hello.exchange(false, std::memory_order_relaxed)) return false;
  hellos_pending_.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

bool ControlChannel::NoteInbound(const std::string& initiator_key, std::weak_ptr<Conn> conn,
                                 size_t max) {
  std::lock_guard<std::mutex> lock(inbound_mu_);
  // Drop entries of closed connections as they accumulate.
  for (auto it = inbound_by_key_.begin(); it != inbound_by_key_.end();) {
    it = it->second.expired() ? inbound_by_key_.erase(it) : std::next(it);
  }
  size_t open = 0;
  auto range = inbound_by_key_.equal_range(initiator_key);
  for (auto it = range.first; it != range.second; ++it) {
    if (std::shared_ptr<Conn> c = it->second.lock()) {
      std::lock_guard<std::mutex> cl(c->mu);
      open += c->dead ? 0 : 1;
    }
  }
  if (open >= max) return false;
  inbound_by_key_.emplace(initiator_key, std::move(conn));
  return true;
}

std::shared_ptr<Conn> ControlChannel::LiveInbound(const std::string& key) {
  std::lock_guard<std::mutex> lock(inbound_mu_);
  auto range = inbound_by_key_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    if (std::shared_ptr<Conn> c = it->second.lock()) {
      std::lock_guard<std::mutex> cl(c->mu);
      if (!c->dead) return c;
    }
  }
  return nullptr;
}

size_t ControlChannel::CutOff(const std::string& key) {
  std::lock_guard<std::mutex> lock(inbound_mu_);
  size_t n = 0;
  auto range = inbound_by_key_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    if (std::shared_ptr<Conn> c = it->second.lock()) {
      std::lock_guard<std::mutex> cl(c->mu);
      if (!c->dead) {
        ::shutdown(c->fd, SHUT_RDWR);
        ++n;
      }
    }
  }
  return n;
}

bool ControlChannel::CredentialConflicts(const std::string& key, const std::string& credential) {
  std::lock_guard<std::mutex> lock(inbound_mu_);
  auto range = inbound_by_key_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    std::shared_ptr<Conn> c = it->second.lock();
    if (!c) continue;
    std::lock_guard<std::mutex> cl(c->mu);
    if (!c->dead && !SecretEqual(c->credential, credential.data(), credential.size())) return true;
  }
  return false;
}

size_t ControlChannel::CutOffOthers(const std::string& key, const std::string& credential) {
  std::lock_guard<std::mutex> lock(inbound_mu_);
  size_t n = 0;
  auto range = inbound_by_key_.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    std::shared_ptr<Conn> c = it->second.lock();
    if (!c) continue;
    std::lock_guard<std::mutex> cl(c->mu);
    if (!c->dead && !SecretEqual(c->credential, credential.data(), credential.size())) {
      ::shutdown(c->fd, SHUT_RDWR);
      ++n;
    }
  }
  return n;
}

bool ControlChannel::HellosSettledSince(int64_t t_ns) const {
  if (reactors_.empty()) return false;
  for (const auto& r : reactors_) {
    if (!r->HellosSettledSince(t_ns)) return false;
  }
  return true;
}

std::string ControlChannel::HelloMessage(const Peer& peer) const {
  wire::Header hello = wire::MakeHeader(wire::MsgType::kHello);
  // A peer registered without a secret (an EngineDesc that carried none) gets zeros,
  // which it refuses: the hello keeps its layout.
  std::string secret = peer.secret;
  secret.resize(wire::kSecretBytes, '\0');
  const std::string& key = host_->key();
  hello.num_parts = static_cast<uint32_t>(key.size());
  hello.length = 2 * wire::kSecretBytes + key.size();
  return std::string(reinterpret_cast<const char*>(&hello), kHdr) + secret + key +
         InitiatorCredential(host_->secret(), secret, key);
}

PeerConnections* ControlChannel::Connect(
    const std::shared_ptr<Peer>& peer_ptr,
    const std::function<void(PeerConnections&)>& before_serving, std::string* error) {
  Peer& peer = *peer_ptr;
  std::lock_guard<std::mutex> lock(peer.connect_mu);
  if (PeerConnections* pc = peer.published.load(std::memory_order_acquire)) return pc;
  const TcpBackendConfig& config = host_->tcp_config();
  auto pc = std::make_unique<PeerConnections>();
  int timeout = config.peer_timeout_ms;
  std::string addr = StrCat(peer.host, ":", peer.port);
  const std::string msg = HelloMessage(peer);
  for (int i = 0; i < config.qp_per_transfer; ++i) {
    int fd = ConnectTo(peer.host, peer.port, timeout, error);
    if (fd < 0 || !SendAll(fd, msg.data(), msg.size(), timeout, error)) {
      if (fd >= 0) ::close(fd);
      for (auto& c : pc->conns) ::close(c->fd);
      *error = StrCat("cannot reach remote engine ", LogSafe(peer.key), " at ", addr, ": ", *error);
      return nullptr;
    }
    SetSocketOptions(fd, config);
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->outbound = true;
    c->remote_key = peer.key;
    c->peer = peer_ptr;
    c->peer_addr = addr;
    c->remote_pid = peer.pid;
    pc->conns.push_back(std::move(c));
  }
  before_serving(*pc);
  for (auto& c : pc->conns) Add(c);
  peer.owned = std::move(pc);
  peer.published.store(peer.owned.get(), std::memory_order_release);
  MORI_LOG_DEBUG(kIo, "engine '", host_->key(), "' connected to ", LogSafe(peer.key), " at ", addr,
                 " with ", config.qp_per_transfer, " connection(s)");
  return peer.owned.get();
}

std::string ControlChannel::Exchange(int fd, wire::MsgType type, wire::Header* answer) {
  const int timeout = host_->tcp_config().peer_timeout_ms;
  wire::Header req = wire::MakeHeader(type);
  std::string error;
  if (!SendAll(fd, reinterpret_cast<const char*>(&req), kHdr, timeout, &error)) {
    return "the request could not be sent: " + error;
  }
  if (!RecvAll(fd, reinterpret_cast<char*>(answer), kHdr, timeout, &error)) {
    return "no answer: " + error;
  }
  return {};
}

bool ControlChannel::SideRequest(const Peer& peer, wire::MsgType type, wire::MsgType answer_type,
                                 uint64_t mem_id, uint64_t capability, const std::string& payload,
                                 std::string* answer, StatusDetail* code, std::string* error,
                                 wire::WireStatus* status_out) {
  const int timeout = host_->tcp_config().peer_timeout_ms;
  std::string why;
  int fd = ConnectTo(peer.host, peer.port, timeout, &why);
  auto fail = [&](StatusDetail c, const std::string& text) {
    if (fd >= 0) ::close(fd);
    *code = c;
    *error = text;
    return false;
  };
  if (fd < 0) return fail(StatusDetail::ERR_PEER_LOST, why);
  std::string msg = HelloMessage(peer);
  wire::Header h = wire::MakeHeader(type, mem_id, capability);
  h.length = payload.size();
  msg.append(reinterpret_cast<const char*>(&h), kHdr);
  msg += payload;
  wire::Header r{};
  if (!SendAll(fd, msg.data(), msg.size(), timeout, &why) ||
      !RecvAll(fd, reinterpret_cast<char*>(&r), kHdr, timeout, &why)) {
    return fail(StatusDetail::ERR_PEER_LOST, why);
  }
  if (r.type == static_cast<uint8_t>(wire::MsgType::kIdleClose) && r.version == wire::kVersion) {
    return fail(StatusDetail::ERR_PEER_LOST,
                "the target refused this engine's hello (another connection holds this "
                "engine's key there, or it registered another EngineDesc under it)");
  }
  if (r.type != static_cast<uint8_t>(answer_type) || r.version != wire::kVersion ||
      r.length > kMaxSideAnswerBytes) {
    return fail(StatusDetail::ERR_TRANSPORT,
                StrCat("unexpected answer (type ", int(r.type), ", version ", r.version, ", ",
                       r.length, " bytes)"));
  }
  answer->assign(r.length, '\0');
  if (!RecvAll(fd, answer->data(), answer->size(), timeout, &why)) {
    return fail(StatusDetail::ERR_PEER_LOST, why);
  }
  auto status = static_cast<wire::WireStatus>(r.status);
  if (status_out != nullptr) *status_out = status;
  if (status != wire::WireStatus::kOk) {
    std::string text = wire::WireStatusText(status);
    if (!answer->empty()) text += ": " + LogSafe(*answer, 512);
    return fail(wire::WireStatusCode(status), text);
  }
  ::close(fd);
  return true;
}

}  // namespace mori::io
