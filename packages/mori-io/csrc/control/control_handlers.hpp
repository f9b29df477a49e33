// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "control/connection.hpp"
#include "mori/core/error.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

// The messages the TCP control channel carries for other transports, by type: each
// transport registers its own handlers (at engine construction, before any reactor
// runs; the table is read without a lock after that). The reactor itself handles only
// the hello, kTransferExtent and TCP's kWrite/kRead with their answers.
//
// Target side (inbound connections, after the hello; the header is c.cur):
//   request: false is a protocol violation (*why), which closes the connection;
//   payload: the payload a request handler asked for (Reactor::ReceiveRequestPayload)
//            is in c.request_payload.
// Initiator side (outbound connections):
//   response: the answer c.cur to pending request p, of a request type it was
//             registered for (any other pairing is a protocol violation);
//   notice:   a target's message that answers no request.
class ControlHandlers {
 public:
  using Request = std::function<bool(Reactor&, Conn&, std::string* why)>;
  using Payload = std::function<void(Reactor&, Conn&)>;
  using Response = std::function<bool(Reactor&, Conn&, const Pending& p, std::string* why)>;
  using Notice = std::function<bool(Reactor&, Conn&, std::string* why)>;

  void OnRequest(wire::MsgType type, Request handler, Payload payload = nullptr) {
    request_[Index(type)] = std::move(handler);
    payload_[Index(type)] = std::move(payload);
  }
  // A side request (one per short-lived connection, answered with `answer_type` and a
  // payload): `grant` computes the status and the payload for the request c.cur.
  using Grant = std::function<wire::WireStatus(Conn&, std::string* payload)>;
  void OnSideRequest(wire::MsgType type, wire::MsgType answer_type, Grant grant);
  void OnResponse(wire::MsgType type, wire::MsgType answers, Response handler) {
    response_[Index(type)].emplace_back(answers, std::move(handler));
  }
  void OnNotice(wire::MsgType type, Notice handler) { notice_[Index(type)] = std::move(handler); }
  // A slot of Conn::ext for a transport's per-connection state.
  size_t AllocateConnExtension() {
    MORI_CHECK(next_ext_ < kMaxConnExtensions, "more than ", kMaxConnExtensions,
               " connection extensions");
    return next_ext_++;
  }

  const Request* request(uint8_t type) const { return request_[type] ? &request_[type] : nullptr; }
  const Payload* payload(uint8_t type) const { return payload_[type] ? &payload_[type] : nullptr; }
  const Notice* notice(uint8_t type) const { return notice_[type] ? &notice_[type] : nullptr; }
  // The handler of response `type` to a request of `request_type`, or nullptr.
  const Response* response(uint8_t type, wire::MsgType request_type) const {
    for (const auto& [answers, h] : response_[type]) {
      if (answers == request_type) return &h;
    }
    return nullptr;
  }

 private:
  static size_t Index(wire::MsgType t) { return static_cast<uint8_t>(t); }
  std::array<Request, 256> request_;
  std::array<Payload, 256> payload_;
  std::array<std::vector<std::pair<wire::MsgType, Response>>, 256> response_;
  std::array<Notice, 256> notice_;
  size_t next_ext_ = 0;
};

}  // namespace mori::io
