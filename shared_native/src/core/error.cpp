// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/core/error.hpp"

namespace mori {

const char* ErrorCodeName(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInternal:
      return "Internal";
    case ErrorCode::kInvalidArgument:
      return "InvalidArgument";
    case ErrorCode::kOutOfMemory:
      return "OutOfMemory";
    case ErrorCode::kTimeout:
      return "Timeout";
    case ErrorCode::kTransport:
      return "Transport";
    case ErrorCode::kNotSupported:
      return "NotSupported";
    case ErrorCode::kCuda:
      return "Cuda";
    case ErrorCode::kInvalidState:
      return "InvalidState";
    case ErrorCode::kNotFound:
      return "NotFound";
  }
  return "Unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

// Out-of-line destructors are the key functions: they pin each class's vtable and
// type_info to this library.
Error::~Error() = default;
InternalError::~InternalError() = default;
InvalidArgumentError::~InvalidArgumentError() = default;
OutOfMemoryError::~OutOfMemoryError() = default;
TimeoutError::~TimeoutError() = default;
TransportError::~TransportError() = default;
NotSupportedError::~NotSupportedError() = default;
CudaError::~CudaError() = default;
InvalidStateError::~InvalidStateError() = default;
NotFoundError::~NotFoundError() = default;

void ThrowError(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kInternal:
      throw InternalError(message);
    case ErrorCode::kInvalidArgument:
      throw InvalidArgumentError(message);
    case ErrorCode::kOutOfMemory:
      throw OutOfMemoryError(message);
    case ErrorCode::kTimeout:
      throw TimeoutError(message);
    case ErrorCode::kTransport:
      throw TransportError(message);
    case ErrorCode::kNotSupported:
      throw NotSupportedError(message);
    case ErrorCode::kCuda:
      throw CudaError(message);
    case ErrorCode::kInvalidState:
      throw InvalidStateError(message);
    case ErrorCode::kNotFound:
      throw NotFoundError(message);
  }
  throw InvalidArgumentError(
      StrCat("unknown error code ", static_cast<int>(code), " (message: ", message, ")"));
}

}  // namespace mori
