// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The one syntax of mori's environment variables; docs/configuration.md lists every
// variable (a test keeps the table and the code in step). Each component reads its
// variables through these functions into one options struct, once, when the object
// they configure is built (process-wide state: when the library loads).
//
// An unset or empty variable means "not set": the caller's default applies. A value
// that does not parse, or lies outside the bounds, is an InvalidArgumentError that
// names the variable, the value and what was expected. Mirrored in Python by
// mori.core.env (the same functions, bound).

#include <cstdint>
#include <optional>
#include <string>

#include "mori/core/macros.hpp"

namespace mori::env {

// The value, or nullopt when the variable is unset or empty.
MORI_API std::optional<std::string> Get(const char* name);

// Booleans: 1/0, true/false, on/off, yes/no (any case).
MORI_API bool ParseBool(const char* name, const std::string& value);
// Decimal integers in [lo, hi].
MORI_API int64_t ParseInt(const char* name, const std::string& value, int64_t lo, int64_t hi);
// Byte counts in [lo, hi]: a decimal number with an optional unit K, M, G or T
// (powers of 1024; "KiB", "KB", "k" alike).
MORI_API uint64_t ParseSize(const char* name, const std::string& value, uint64_t lo, uint64_t hi);

MORI_API bool Bool(const char* name, bool fallback);
MORI_API int64_t Int(const char* name, int64_t fallback, int64_t lo, int64_t hi);
MORI_API uint64_t Size(const char* name, uint64_t fallback, uint64_t lo, uint64_t hi);
MORI_API std::string String(const char* name, const std::string& fallback);

}  // namespace mori::env
