// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <memory>

#include "ledger/transfer_state.hpp"

namespace mori::io {

// The thread waiting for a TCP write reads the answers from the socket itself instead
// of being woken by the reactor that read them: on loopback or a fast link a single
// small write otherwise costs three thread wake-ups (the target's reactor, ours, and
// the waiter through its condition variable) and this path saves two of them.
//
// Installed (TransferState::SetWaitHelp, context: the Conn) on a single-part kWrite
// that found no other request outstanding on its connection. Its submitter lends the
// connection's receive side to the coming waiter before the request leaves
// (Conn::rx_owner kRxLent, EPOLLIN off), so an answer that arrives before the wait
// starts does not wake the reactor either. The lend ends when the waiter takes it
// (kRxWaiter: the reactor skips the connection while it is held), and is revoked (the
// reactor reads as before) by the next request queued on the connection, by a
// readiness event the reactor still gets for it (a hang-up), and by the reactor's
// periodic scan, so an answer nobody waits for is read within one scan period; a poll
// of the status (TransferState::Poll: WaitFor(0), the Python predicates) takes the
// lend for one non-blocking pass. The waiter completes
// every kWriteAck that answers the oldest pending kWrite, its own among them. It polls
// the socket without blocking for MORI_IO_TCP_WAIT_POLL_US, then sleeps in poll(2) in
// slices. It hands the socket back to the reactor (EPOLLIN on again; bytes it
// buffered are parsed by the reactor) when its transfer finished, at its deadline, or
// at anything other than a write's answer: a notice, a read's data, the end of the
// stream or an error, all of which the reactor then handles as before. A Close
// meanwhile shuts the socket down to wake it and closes the descriptor only after it
// let go.
void ReadAnswersWhileWaiting(const std::shared_ptr<void>& conn, TransferState& state,
                             int64_t deadline_ns);

// MORI_IO_TCP_WAIT_POLL_US (read once): how long the waiter polls its socket without
// sleeping; 0 sleeps in poll(2) at once.
int64_t WaitPollNs();

struct Conn;
// With c.mu held, before a lone single-part write's request is sent: lends the
// receive side to its waiter if nobody reads it now. False: not lent.
bool LendAnswers(Conn& c);
// With c.mu held: ends a lend nobody took (EPOLLIN on again).
void RevokeLend(Conn& c);

}  // namespace mori::io
