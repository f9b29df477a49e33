// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <memory>

#include "host/transport.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class TransportHost;

// Bytes in TCP messages on the control connections: transfers cut into parts (chunk_size,
// kGpuChunk for GPU memory, which is staged through host buffers) spread over the
// peer's connections; the target checks every part against its registry.
class TcpTransport : public Transport {
 public:
  explicit TcpTransport(TransportHost* host) : host_(host) {}
  BackendType type() const override { return BackendType::kTcp; }
  TransportSlot slot() const override { return kTcpSlot; }
  bool created() const override;
  std::shared_ptr<TransferState> Precheck(const TransferRequest& req) override;
  // The transfer's parts as kWrite/kRead requests on the control connections
  // (control/part_requests.hpp); the target serves them in its reactor.
  std::shared_ptr<TransferState> Submit(const TransferRequest& req) override;

 private:
  TransportHost* host_;
};

}  // namespace mori::io
