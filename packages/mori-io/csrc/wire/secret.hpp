// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Secrets of the trust model (README "Trust model"): engine secrets and region
// capabilities come from the kernel's CSPRNG and are compared in constant time.

#include <sys/random.h>

#include <algorithm>
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

// SipHash-2-4 (Aumasson and Bernstein) of `n` bytes under a 128-bit key: a keyed hash
// (MAC) for short messages.
inline uint64_t SipHash24(const unsigned char key[16], const unsigned char* in, size_t n) {
  auto load = [](const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
  };
  auto rotl = [](uint64_t x, int b) { return (x << b) | (x >> (64 - b)); };
  const uint64_t k0 = load(key), k1 = load(key + 8);
  uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
  uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
  auto round = [&] {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  };
  const size_t whole = n - n % 8;
  for (size_t i = 0; i < whole; i += 8) {
    const uint64_t m = load(in + i);
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
  uint64_t last = static_cast<uint64_t>(n) << 56;
  for (size_t i = whole; i < n; ++i) last |= static_cast<uint64_t>(in[i]) << (8 * (i - whole));
  v3 ^= last;
  round();
  round();
  v0 ^= last;
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

// What an initiator's hello proves to a target (kSecretBytes): a MAC under the
// initiator's own engine secret of the target's secret and the initiator's key. A target
// that registered the initiator (and so holds its EngineDesc's secret) checks it; the
// target learns nothing it could present elsewhere (the MAC is bound to its own secret),
// and the initiator's secret never leaves its EngineDesc.
inline std::string InitiatorCredential(const std::string& initiator_secret,
                                       const std::string& target_secret, const std::string& key) {
  unsigned char k[16] = {};
  std::memcpy(k, initiator_secret.data(), std::min<size_t>(16, initiator_secret.size()));
  std::string msg(1, '\0');
  msg += target_secret;
  msg += key;
  std::string out(16, '\0');
  for (unsigned char domain = 1; domain <= 2; ++domain) {  // two 64-bit halves
    msg[0] = static_cast<char>(domain);
    const uint64_t h = SipHash24(k, reinterpret_cast<const unsigned char*>(msg.data()), msg.size());
    std::memcpy(&out[8 * (domain - 1)], &h, 8);
  }
  return out;
}

}  // namespace mori::io
