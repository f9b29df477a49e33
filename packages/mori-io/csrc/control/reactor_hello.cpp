// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
// The reactor's accepts and hellos: the listener's backoff when accept fails, and the
// hello an inbound connection must open with (the target's secret, the initiator's key
// and credential) before anything else is read.
#include "control/reactor.hpp"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "control/answer_reader.hpp"
#include "control/control_channel.hpp"
#include "control/control_handlers.hpp"
#include "control/control_host.hpp"
#include "control/reactor_limits.hpp"
#include "control/socket_io.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/telemetry.hpp"
#include "registry/gpu_staging.hpp"
#include "wire/log_safe.hpp"
#include "wire/wire_status.hpp"

namespace mori::io {

using namespace reactor_limits;  // NOLINT(build/namespaces)

void Reactor::AcceptAll() {
  // A batch at a time (the listener is level-triggered): between batches the reactor
  // reads the hellos that came with the connections, and closes the ones dropped.
  for (int i = 0; i < kAcceptBatch; ++i) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) PauseAccept(errno);
      return;
    }
    accept_backoff_ms_ = 0;
    SetSocketOptions(fd, host_->tcp_config());
    // Its own control block: the pending-hello queue's weak pointers keep no Conn alive.
    std::shared_ptr<Conn> c(new Conn());
    c->fd = fd;
    c->outbound = false;
    c->opened_ns = NowNs();
    std::shared_ptr<Conn> dropped = channel_->AdmitHello(c);
    channel_->Add(std::move(c));
    if (dropped) DropPendingHello(dropped);
  }
}

// Unauthenticated connections cost the target a descriptor and a small buffer each
// until their hello passes; past max_pending_hellos the oldest goes (counted, logged
// once a second), so a flood of silent connections holds a bounded number.
void Reactor::DropPendingHello(const std::shared_ptr<Conn>& c) {
  host_->CountDroppedHello();
  uint64_t more = 0;
  if (hello_dropped_log_.Due(&more)) {
    MORI_LOG_WARN(kIo, "engine '", host_->key(), "': dropped the oldest inbound connection ",
                  "still in its hello: max_pending_hellos (",
                  host_->tcp_config().max_pending_hellos, ") reached (", host_->hellos_dropped(),
                  " dropped so far, ", more, " since the last such message)");
  }
  const std::string why = "dropped in its hello: max_pending_hellos reached";
  if (c->reactor == this) {
    Close(*c, why);
    return;
  }
  std::lock_guard<std::mutex> lock(c->mu);  // its reactor closes it as hung up
  if (!c->dead) ::shutdown(c->fd, SHUT_RDWR);
}

// Out of descriptors (EMFILE, ENFILE) or kernel memory, accept fails while the
// connection stays in the backlog, so the level-triggered listener would wake this loop
// at once, forever (a core spent, the log flooded). The listener leaves the epoll set
// for a growing interval instead; the backlog keeps the connection until then, and one
// warning per second counts the failures it does not log.
void Reactor::PauseAccept(int err) {
  const int64_t now = NowNs();
  accept_backoff_ms_ = accept_backoff_ms_ == 0
                           ? kAcceptBackoffMinMs
                           : std::min(2 * accept_backoff_ms_, kAcceptBackoffMaxMs);
  accept_resume_ns_ = now + accept_backoff_ms_ * 1000000;
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  uint64_t more = 0;
  if (!accept_failed_log_.Due(&more)) return;
  MORI_LOG_WARN(kIo, "engine '", host_->key(), "': accept failed: ", ErrnoText(err),
                "; not accepting for ", accept_backoff_ms_, " ms (", more,
                " more failure(s) since the last such message)");
}

void Reactor::ResumeAcceptIfDue(int64_t now) {
  if (accept_resume_ns_ == 0 || now < accept_resume_ns_) return;
  accept_resume_ns_ = 0;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
}

bool Reactor::FinishHello(Conn& c) {
  // Dropped meanwhile as the oldest pending hello (by the accepting reactor): closed.
  if (!channel_->SettleHello(c)) return false;
  // Only an initiator given our EngineDesc knows the secret; nothing else it sends
  // is read before this check passed.
  const bool trusted = host_->SecretMatches(c.hello.data(), wire::kSecretBytes);
  if (c.cur.num_parts > 0) {  // the key's length; the initiator's credential follows it
    c.remote_key = c.hello.substr(wire::kSecretBytes, c.cur.num_parts);
    c.credential = c.hello.substr(wire::kSecretBytes + c.cur.num_parts);
  } else {  // a hello without a credential (raw peers; refused for registered keys)
    c.remote_key = c.hello.substr(wire::kSecretBytes);
  }
  std::string().swap(c.hello);
  std::string why_not;
  uint64_t more = 0;
  const size_t per_peer = host_->tcp_config().max_connections_per_peer;
  bool accepted = trusted && host_->InitiatorAccepted(c.remote_key, c.credential, &why_not);
  if (accepted && !channel_->NoteInbound(c.remote_key, SharedOf(c), per_peer)) {
    accepted = false;
    host_->CountRefusedHello();
    if (peer_full_log_.Due(&more)) {
      MORI_LOG_WARN(kIo, "engine '", host_->key(), "': refused a connection from ",
                    LogSafe(c.remote_key), ": it holds max_connections_per_peer (", per_peer,
                    ") already (", host_->hellos_refused(), " hellos refused so far, ", more,
                    " such since the last such message)");
    }
  } else if (trusted && !accepted) {
    host_->CountRefusedHello();
    if (not_accepted_log_.Due(&more)) {
      MORI_LOG_WARN(kIo, "engine '", host_->key(), "': refused a connection claiming to be ",
                    LogSafe(c.remote_key), ": ", why_not, " (", host_->hellos_refused(),
                    " refused so far, ", more, " such since the last such message)");
    }
  }
  if (trusted && !accepted) {
    // It holds our EngineDesc: told that the close is ours (kIdleClose), so an initiator
    // refused for now (its key held by other connections; a registration here that is
    // not its current EngineDesc) tries again on its next transfer instead of staying
    // failed until it registers us again. Nothing is sent to a hello without our secret.
    std::lock_guard<std::mutex> lock(c.mu);
    SendIdleClose(c);
    return false;
  }
  if (!trusted) {
    host_->CountRefusedHello();
    if (no_secret_log_.Due(&more)) {
      MORI_LOG_WARN(kIo, "engine '", host_->key(), "': refused a connection from ",
                    "an initiator whose hello (key ", LogSafe(c.remote_key),
                    ") lacks this engine's secret (", host_->hellos_refused(), " refused so far, ",
                    more, " such since the last such message)");
    }
    return false;
  }
  c.hello_done = true;
  MORI_LOG_DEBUG(kIo, "engine '", host_->key(), "': inbound connection from ",
                 LogSafe(c.remote_key));
  return true;
}

}  // namespace mori::io
