// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "tcp/tcp_transport.hpp"

#include "control/part_requests.hpp"
#include "host/transport_host.hpp"
#include "registry/gpu_staging.hpp"

namespace mori::io {

bool TcpTransport::created() const { return host_->channel().running(); }

std::shared_ptr<TransferState> TcpTransport::Precheck(const TransferRequest& req) {
  // GPU memory over TCP: local GPU bytes are staged here (parts of at most kGpuChunk),
  // the target stages its own GPU memory (or refuses where it cannot).
  if (req.local.loc == MemoryLocationType::GPU && !staging::Unavailable().empty()) {
    return ControlHost::Finished(
        StatusDetail::ERR_INVALID_ARGS,
        StrCat(req.op == Op::kWrite ? "write" : "read", " from/into local GPU memory ",
               req.local.id, " over TCP needs staging, and ", staging::Unavailable(), " (",
               ChooseBackend(host_->ChoiceInput(*req.peer, req.local.loc, req.remote.loc)).reason,
               ")"));
  }
  return nullptr;
}

std::shared_ptr<TransferState> TcpTransport::Submit(const TransferRequest& req) {
  return PostParts(*host_, req, wire::MsgType::kWrite, wire::MsgType::kRead);
}

}  // namespace mori::io
