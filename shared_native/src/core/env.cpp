// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/core/env.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "mori/core/error.hpp"

namespace mori::env {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The decimal digits of `text` from `i` on, as an unsigned value; `*end` the first
// character after them. False when there are none or they overflow 64 bits.
bool Digits(const std::string& text, size_t i, uint64_t* value, size_t* end) {
  uint64_t v = 0;
  size_t j = i;
  for (; j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])); ++j) {
    const uint64_t d = static_cast<uint64_t>(text[j] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  if (j == i) return false;
  *value = v;
  *end = j;
  return true;
}

}  // namespace

std::optional<std::string> Get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool ParseBool(const char* name, const std::string& value) {
  const std::string v = Lower(value);
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  MORI_THROW(InvalidArgumentError, name, "='", value,
             "': expected a boolean (1/0, true/false, on/off, yes/no)");
}

int64_t ParseInt(const char* name, const std::string& value, int64_t lo, int64_t hi) {
  const bool negative = !value.empty() && value[0] == '-';
  uint64_t magnitude = 0;
  size_t end = 0;
  const bool ok = Digits(value, negative ? 1 : 0, &magnitude, &end) && end == value.size() &&
                  magnitude <= (negative ? uint64_t{1} << 63 : uint64_t{INT64_MAX});
  if (ok) {
    const int64_t v =
        negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
    if (v >= lo && v <= hi) return v;
  }
  MORI_THROW(InvalidArgumentError, name, "='", value, "': expected an integer in [", lo, ", ", hi,
             "]");
}

uint64_t ParseSize(const char* name, const std::string& value, uint64_t lo, uint64_t hi) {
  uint64_t number = 0;
  size_t end = 0;
  bool ok = Digits(value, 0, &number, &end);
  int shift = 0;
  if (ok) {
    std::string unit = Lower(value.substr(end));
    if (!unit.empty() && unit.back() == 'b') unit.pop_back();
    if (unit.size() == 2 && unit[1] == 'i') unit.pop_back();
    if (unit == "k") {
      shift = 10;
    } else if (unit == "m") {
      shift = 20;
    } else if (unit == "g") {
      shift = 30;
    } else if (unit == "t") {
      shift = 40;
    } else if (!unit.empty()) {
      MORI_THROW(InvalidArgumentError, name, "='", value, "': unknown unit '", value.substr(end),
                 "' (expected bytes: a number with an optional unit K, M, G or T)");
    }
    ok = ok && number <= (UINT64_MAX >> shift);
  }
  if (ok) {
    const uint64_t v = number << shift;
    if (v >= lo && v <= hi) return v;
  }
  MORI_THROW(InvalidArgumentError, name, "='", value, "': expected bytes in [", lo, ", ", hi,
             "] (a number with an optional unit K, M, G or T)");
}

bool Bool(const char* name, bool fallback) {
  const auto v = Get(name);
  return v ? ParseBool(name, *v) : fallback;
}

int64_t Int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const auto v = Get(name);
  return v ? ParseInt(name, *v, lo, hi) : fallback;
}

uint64_t Size(const char* name, uint64_t fallback, uint64_t lo, uint64_t hi) {
  const auto v = Get(name);
  return v ? ParseSize(name, *v, lo, hi) : fallback;
}

std::string String(const char* name, const std::string& fallback) {
  const auto v = Get(name);
  return v ? *v : fallback;
}

}  // namespace mori::env
