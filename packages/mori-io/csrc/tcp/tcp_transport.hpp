// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <memory>

#include "host/transport.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class IoEngine;

// Bytes in TCP messages on the control connections: transfers cut into parts (chunk_size,
// kGpuChunk for GPU memory, which is staged through host buffers) spread over the
// peer's connections; the target checks every part against its registry.
class TcpTransport : public Transport {
 public:
  explicit TcpTransport(IoEngine* engine) : engine_(engine) {}
  BackendType type() const override { return BackendType::kTcp; }
  TransportSlot slot() const override { return kTcpSlot; }
  bool created() const override;
  std::shared_ptr<TransferState> Precheck(const TransferRequest& req) override;
  std::shared_ptr<TransferState> Submit(const TransferRequest& req) override {
    return PostParts(req, wire::MsgType::kWrite, wire::MsgType::kRead);
  }
  // The parts of the transfer as requests of `write_type`/`read_type` (kWrite/kRead carry
  // the bytes; other types ask the target for something per part, answered in order).
  std::shared_ptr<TransferState> PostParts(const TransferRequest& req, wire::MsgType write_type,
                                           wire::MsgType read_type);

 private:
  IoEngine* engine_;
};

}  // namespace mori::io
