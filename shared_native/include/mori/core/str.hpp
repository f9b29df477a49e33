// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <sstream>
#include <string>
#include <utility>

namespace mori {

// Concatenates the streamed form of each argument; used for error and log messages
// so that they can name the offending values.
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace mori
