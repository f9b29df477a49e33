// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/core/logging.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "mori/core/env.hpp"
#include "mori/core/error.hpp"

namespace mori::log {
namespace {

constexpr int kDefaultThreshold = static_cast<int>(Level::kWarn);
constexpr const char* kModuleNames[kModuleCount] = {"core", "shmem", "io", "ep", "ccl"};
constexpr const char* kLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A bad value in the environment must not stop the library from loading: it is
// reported on stderr and the default kept.
void ApplyEnv(const char* var, int first, int last) {
  const auto value = env::Get(var);
  if (!value) return;
  try {
    int level = static_cast<int>(ParseLevel(*value));
    for (int m = first; m < last; ++m) g_thresholds[m].store(level, std::memory_order_relaxed);
  } catch (const Error& e) {
    std::string line = StrCat("[mori] ignoring ", var, ": ", e.what(), "\n");
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  }
}

struct EnvLevels {
  EnvLevels() {
    ApplyEnv("MORI_LOG_LEVEL", 0, kModuleCount);
    for (int m = 0; m < kModuleCount; ++m) {
      ApplyEnv(("MORI_LOG_LEVEL_" + Upper(kModuleNames[m])).c_str(), m, m + 1);
    }
  }
};

}  // namespace

std::atomic<int> g_thresholds[kModuleCount] = {
    kDefaultThreshold, kDefaultThreshold, kDefaultThreshold, kDefaultThreshold, kDefaultThreshold};

// Runs when libmori_core is loaded, after g_thresholds' constant initialization.
static EnvLevels env_levels;

void SetLevel(Module module, Level level) noexcept {
  g_thresholds[static_cast<int>(module)].store(static_cast<int>(level), std::memory_order_relaxed);
}

Level GetLevel(Module module) noexcept {
  return static_cast<Level>(g_thresholds[static_cast<int>(module)].load(std::memory_order_relaxed));
}

const char* ModuleName(Module module) noexcept {
  int m = static_cast<int>(module);
  return (m >= 0 && m < kModuleCount) ? kModuleNames[m] : "?";
}

const char* LevelName(Level level) noexcept {
  int l = static_cast<int>(level);
  return (l >= 0 && l <= static_cast<int>(Level::kOff)) ? kLevelNames[l] : "?";
}

Module ParseModule(const std::string& name) {
  std::string lower = Lower(name);
  for (int m = 0; m < kModuleCount; ++m) {
    if (lower == kModuleNames[m]) return static_cast<Module>(m);
  }
  MORI_THROW(InvalidArgumentError, "unknown log module '", name,
             "' (expected one of core, shmem, io, ep, ccl)");
}

Level ParseLevel(const std::string& name) {
  std::string lower = Lower(name);
  if (lower == "warning") return Level::kWarn;
  if (lower == "none") return Level::kOff;
  for (int l = 0; l <= static_cast<int>(Level::kOff); ++l) {
    if (lower == kLevelNames[l]) return static_cast<Level>(l);
  }
  MORI_THROW(InvalidArgumentError, "unknown log level '", name,
             "' (expected one of trace, debug, info, warn, error, off)");
}

void Write(Module module, Level level, const char* file, int line,
           const std::string& message) noexcept {
  try {
    using Clock = std::chrono::system_clock;
    auto now = Clock::now();
    std::time_t secs = Clock::to_time_t(now);
    auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
        1000000;
    std::tm tm{};
    localtime_r(&secs, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
    const char* base = file;
    for (const char* p = file; *p; ++p) {
      if (*p == '/') base = p + 1;
    }
    char micro_buf[8];
    std::snprintf(micro_buf, sizeof(micro_buf), "%06ld", static_cast<long>(micros));
    std::string out = StrCat("[mori ", stamp, ".", micro_buf, " ", ::getpid(), ":",
                             static_cast<long>(::syscall(SYS_gettid)), " ", ModuleName(module), " ",
                             Upper(LevelName(level)), " ", base, ":", line, "] ", message, "\n");
    (void)!::write(STDERR_FILENO, out.data(), out.size());
  } catch (...) {
    // Logging never throws into the caller.
  }
}

}  // namespace mori::log
