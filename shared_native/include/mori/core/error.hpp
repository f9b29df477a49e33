// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <stdexcept>
#include <string>

#include "mori/core/macros.hpp"
#include "mori/core/str.hpp"

namespace mori {

// Stable numeric codes: Python maps each to one exception class (mori.core.errors),
// so a value is never reused for another meaning.
enum class ErrorCode : int {
  kInternal = 1,
  kInvalidArgument = 2,
  kOutOfMemory = 3,
  kTimeout = 4,
  kTransport = 5,
  kNotSupported = 6,
  kCuda = 7,
  kInvalidState = 8,
  kNotFound = 9,
};

MORI_API const char* ErrorCodeName(ErrorCode code) noexcept;

// Root of the hierarchy. Every subclass is exported and has its key function in
// libmori_core, so its type_info is unique in the process and a throw inside the
// library is caught by type in any extension.
class MORI_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ~Error() override;
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define MORI_DECLARE_ERROR(Name, Code)                                  \
  class MORI_API Name : public Error {                                  \
   public:                                                              \
    explicit Name(const std::string& message) : Error(Code, message) {} \
    ~Name() override;                                                   \
  }

MORI_DECLARE_ERROR(InternalError, ErrorCode::kInternal);
MORI_DECLARE_ERROR(InvalidArgumentError, ErrorCode::kInvalidArgument);
MORI_DECLARE_ERROR(OutOfMemoryError, ErrorCode::kOutOfMemory);
MORI_DECLARE_ERROR(TimeoutError, ErrorCode::kTimeout);
MORI_DECLARE_ERROR(TransportError, ErrorCode::kTransport);
MORI_DECLARE_ERROR(NotSupportedError, ErrorCode::kNotSupported);
MORI_DECLARE_ERROR(CudaError, ErrorCode::kCuda);
MORI_DECLARE_ERROR(InvalidStateError, ErrorCode::kInvalidState);
MORI_DECLARE_ERROR(NotFoundError, ErrorCode::kNotFound);

#undef MORI_DECLARE_ERROR

// Throws the Error subclass that matches `code`; used where the code is data
// (for example an error relayed from a peer).
[[noreturn]] MORI_API void ThrowError(ErrorCode code, const std::string& message);

}  // namespace mori

// MORI_THROW(InvalidArgumentError, "expert id ", id, " out of range [0, ", n, ")")
#define MORI_THROW(ErrorType, ...) throw ::mori::ErrorType(::mori::StrCat(__VA_ARGS__))

// Throws InvalidArgumentError with the message when `cond` is false.
#define MORI_CHECK_ARG(cond, ...)                                      \
  do {                                                                 \
    if (MORI_UNLIKELY(!(cond))) {                                      \
      throw ::mori::InvalidArgumentError(::mori::StrCat(__VA_ARGS__)); \
    }                                                                  \
  } while (0)

// Throws InternalError naming the failed invariant, its place and a message.
#define MORI_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (MORI_UNLIKELY(!(cond))) {                                                              \
      throw ::mori::InternalError(::mori::StrCat("check failed: " #cond " at ", __FILE__, ":", \
                                                 __LINE__, ": ", __VA_ARGS__));                \
    }                                                                                          \
  } while (0)
