// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "ledger/transfer_state.hpp"

namespace mori::io {

const char* StatusDetailName(StatusDetail detail) noexcept {
  switch (detail) {
    case StatusDetail::SUCCESS:
      return "SUCCESS";
    case StatusDetail::INIT:
      return "INIT";
    case StatusDetail::IN_PROGRESS:
      return "IN_PROGRESS";
    case StatusDetail::ERR_INVALID_ARGS:
      return "ERR_INVALID_ARGS";
    case StatusDetail::ERR_OUT_OF_BOUNDS:
      return "ERR_OUT_OF_BOUNDS";
    case StatusDetail::ERR_NOT_FOUND:
      return "ERR_NOT_FOUND";
    case StatusDetail::ERR_TRANSPORT:
      return "ERR_TRANSPORT";
    case StatusDetail::ERR_PEER_LOST:
      return "ERR_PEER_LOST";
    case StatusDetail::ERR_TIMEOUT:
      return "ERR_TIMEOUT";
    case StatusDetail::ERR_BAD_STATE:
      return "ERR_BAD_STATE";
    case StatusDetail::ERR_GPU_OP:
      return "ERR_GPU_OP";
  }
  return "?";
}

const char* StatusCodeName(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::SUCCESS:
      return "SUCCESS";
    case StatusCode::INIT:
      return "INIT";
    case StatusCode::IN_PROGRESS:
      return "IN_PROGRESS";
    case StatusCode::ERR_BEGIN:
      return "ERR_BEGIN";
    case StatusCode::ERR_INVALID_ARGS:
      return "ERR_INVALID_ARGS";
    case StatusCode::ERR_NOT_FOUND:
      return "ERR_NOT_FOUND";
    case StatusCode::ERR_RDMA_OP:
      return "ERR_RDMA_OP";
    case StatusCode::ERR_BAD_STATE:
      return "ERR_BAD_STATE";
    case StatusCode::ERR_GPU_OP:
      return "ERR_GPU_OP";
  }
  return "?";
}

}  // namespace mori::io
