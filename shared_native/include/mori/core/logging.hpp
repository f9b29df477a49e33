// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <string>

#include "mori/core/macros.hpp"
#include "mori/core/str.hpp"

namespace mori::log {

// One logger per mori component. Levels come from MORI_LOG_LEVEL (all modules) and
// MORI_LOG_LEVEL_<MODULE> (one module, wins over the former), read when
// libmori_core is loaded, and can be changed at run time (SetLevel, or
// mori.core.set_log_level from Python).
enum class Module : int { kCore = 0, kShmem, kIo, kEp, kCcl };
inline constexpr int kModuleCount = 5;

enum class Level : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// Threshold per module; a message is written when its level >= the threshold.
MORI_API extern std::atomic<int> g_thresholds[kModuleCount];

inline bool Enabled(Module module, Level level) noexcept {
  return static_cast<int>(level) >=
         g_thresholds[static_cast<int>(module)].load(std::memory_order_relaxed);
}

MORI_API void SetLevel(Module module, Level level) noexcept;
MORI_API Level GetLevel(Module module) noexcept;

MORI_API const char* ModuleName(Module module) noexcept;
MORI_API const char* LevelName(Level level) noexcept;
// Parse "core"/"io"/..., "trace"/"debug"/...; throw InvalidArgumentError naming the
// value and the accepted spellings.
MORI_API Module ParseModule(const std::string& name);
MORI_API Level ParseLevel(const std::string& name);

// Formats one line (time, pid, tid, module, level, file:line, message) and writes
// it to stderr with a single write(2), so lines of concurrent threads never
// interleave.
MORI_API void Write(Module module, Level level, const char* file, int line,
                    const std::string& message) noexcept;

}  // namespace mori::log

// MORI_LOG(kIo, kInfo, "connected to ", peer, " in ", ms, " ms");
// A statement in all contexts (do/while(0)), declares no names in the caller's
// scope, and evaluates its arguments only when the level is enabled.
#define MORI_LOG(module, level, ...)                                                         \
  do {                                                                                       \
    if (MORI_UNLIKELY(                                                                       \
            ::mori::log::Enabled(::mori::log::Module::module, ::mori::log::Level::level))) { \
      ::mori::log::Write(::mori::log::Module::module, ::mori::log::Level::level, __FILE__,   \
                         __LINE__, ::mori::StrCat(__VA_ARGS__));                             \
    }                                                                                        \
  } while (0)

#define MORI_LOG_TRACE(module, ...) MORI_LOG(module, kTrace, __VA_ARGS__)
#define MORI_LOG_DEBUG(module, ...) MORI_LOG(module, kDebug, __VA_ARGS__)
#define MORI_LOG_INFO(module, ...) MORI_LOG(module, kInfo, __VA_ARGS__)
#define MORI_LOG_WARN(module, ...) MORI_LOG(module, kWarn, __VA_ARGS__)
#define MORI_LOG_ERROR(module, ...) MORI_LOG(module, kError, __VA_ARGS__)
