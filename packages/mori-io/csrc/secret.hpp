// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Secrets of the trust model (README "Trust model"): engine secrets and region
// capabilities come from the kernel's CSPRNG and are compared in constant time.

#include <sys/random.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "mori/core/error.hpp"

namespace mori::io {

// `n` bytes from getrandom(2) (blocks only until the kernel's pool is initialised, at
// boot); throws TransportError naming errno if the kernel refuses.
inline std::string RandomSecret(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      MORI_THROW(TransportError, "getrandom of ", n, " bytes failed: ", std::strerror(errno),
                 " (errno ", errno, ")");
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

// Equal length and bytes; the time taken depends on the length only, not on where the
// first difference is.
inline bool SecretEqual(const std::string& a, const char* b, size_t b_len) {
  if (a.size() != b_len) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < b_len; ++i) {
    diff = diff | (static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

}  // namespace mori::io
