// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace mori::io {

// A string a peer chose (an engine key from a hello or a descriptor, a refusal's text),
// quoted for a log line or an error message: control characters, quotes, backslashes and
// bytes >= 0x80 are escaped, so it cannot forge a line or a terminal sequence, and at most
// `max` bytes are shown, so it cannot flood the log: 'abc\n...' (4096 bytes).
inline std::string LogSafe(std::string_view s, size_t max = 64) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(s.size(), max) + 2);
  out += '\'';
  const size_t shown = s.size() > max ? max : s.size();
  for (size_t i = 0; i < shown; ++i) {
    const auto ch = static_cast<unsigned char>(s[i]);
    switch (ch) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\'':
        out += "\\'";
        break;
      default:
        if (ch < 0x20 || ch >= 0x7f) {
          out += "\\x";
          out += kHex[ch >> 4];
          out += kHex[ch & 0xf];
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  if (shown < s.size()) {
    out += "...' (";
    out += std::to_string(s.size());
    out += " bytes)";
  } else {
    out += '\'';
  }
  return out;
}

}  // namespace mori::io
