// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "wire/wire_status.hpp"

namespace mori::io::wire {

const char* WireStatusText(WireStatus s) {
  switch (s) {
    case WireStatus::kOk:
      return "ok";
    case WireStatus::kUnknownMemory:
      return "the memory id is not registered with the target (never, or deregistered)";
    case WireStatus::kOutOfBounds:
      return "out of bounds of the registered region";
    case WireStatus::kNotHostMemory:
      return "the region is GPU memory, which this path cannot move (CMA moves host memory "
             "only; over TCP the target stages GPU memory only when built with CUDA and a "
             "GPU is visible, and at most kMaxStagedPart bytes per part)";
    case WireStatus::kNoShm:
      return "the target engine has no SHM backend";
    case WireStatus::kCopyFailed:
      return "the initiator's CMA copy failed";
    case WireStatus::kNoP2p:
      return "the target engine has no P2P backend";
    case WireStatus::kNotGpuMemory:
      return "the region is host memory, which P2P does not map";
    case WireStatus::kExportFailed:
      return "the target could not export the region";
    case WireStatus::kNoRdma:
      return "the target engine has no RDMA backend";
    case WireStatus::kNotShareable:
      return "the region is not in shared host memory";
    case WireStatus::kTooManyGrants:
      return "the target holds as many region grants as it allows (MORI_IO_MAX_GRANT_HOLDERS "
             "initiators, MORI_IO_MAX_GRANTS grants)";
  }
  return "unknown status";
}

StatusDetail WireStatusCode(WireStatus s) {
  switch (s) {
    case WireStatus::kOk:
      return StatusDetail::SUCCESS;
    case WireStatus::kUnknownMemory:
      return StatusDetail::ERR_NOT_FOUND;
    case WireStatus::kOutOfBounds:
      return StatusDetail::ERR_OUT_OF_BOUNDS;
    case WireStatus::kNotHostMemory:
    case WireStatus::kNoShm:
    case WireStatus::kNoP2p:
    case WireStatus::kNotGpuMemory:
    case WireStatus::kNoRdma:
    case WireStatus::kNotShareable:
      return StatusDetail::ERR_INVALID_ARGS;
    case WireStatus::kCopyFailed:
      return StatusDetail::ERR_TRANSPORT;
    case WireStatus::kExportFailed:
      return StatusDetail::ERR_GPU_OP;
    case WireStatus::kTooManyGrants:
      return StatusDetail::ERR_BAD_STATE;
  }
  return StatusDetail::ERR_TRANSPORT;
}

}  // namespace mori::io::wire
