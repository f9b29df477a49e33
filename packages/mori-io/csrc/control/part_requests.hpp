// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <memory>

#include "ledger/transfer_state.hpp"
#include "registry/transfer_request.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class ControlHost;

// A transfer as requests on the peer's control connections (req.conns), one per part:
// spans cut into parts (tcp_config().chunk_size when chunking is on, at most kGpuChunk
// where GPU memory is staged through host buffers), spread round robin over the
// connections, each preceded by the transfer's extent when it has several parts.
// `write_type`/`read_type` name the requests: kWrite (carrying the bytes) and kRead move
// the data over TCP; other types ask the target for something per part, answered in
// order (SHM's per-part grants). Parts that cannot be sent complete at once as failed.
std::shared_ptr<TransferState> PostParts(ControlHost& host, const TransferRequest& req,
                                         wire::MsgType write_type, wire::MsgType read_type);

}  // namespace mori::io
