// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "ledger/transfer_state.hpp"
#include "mori/core/error.hpp"
#include "mori/transport/socket.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io::wire {

// What a target's refusal means, for the initiator's message.
const char* WireStatusText(WireStatus s);
// The transfer status a refusal reports as.
StatusDetail WireStatusCode(WireStatus s);

// A header of `type` in this build's wire version, other fields zero.
inline Header MakeHeader(MsgType type, uint64_t mem_id = 0, uint64_t capability = 0) {
  Header h{};
  h.type = static_cast<uint8_t>(type);
  h.version = kVersion;
  h.mem_id = mem_id;
  h.capability = capability;
  return h;
}

}  // namespace mori::io::wire

namespace mori::io {

using transport::ErrnoText;

}  // namespace mori::io
