// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/core/telemetry.hpp"

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>

#include "mori/core/env.hpp"
#include "mori/core/error.hpp"

namespace mori::telemetry {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

std::vector<TimerSite*>& Registry() {
  static std::vector<TimerSite*> sites;
  return sites;
}

void AtomicMin(std::atomic<uint64_t>& slot, uint64_t v) noexcept {
  uint64_t cur = slot.load(std::memory_order_relaxed);
  while (v < cur && !slot.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void AtomicMax(std::atomic<uint64_t>& slot, uint64_t v) noexcept {
  uint64_t cur = slot.load(std::memory_order_relaxed);
  while (v > cur && !slot.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

struct EnvTelemetry {
  EnvTelemetry() {
    const auto value = env::Get("MORI_TELEMETRY");
    if (!value) return;
    std::stringstream ss(*value);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty() || item == "0" || item == "off") continue;
      if (item == "all" || item == "1") {
        for (auto& e : g_enabled) e.store(true, std::memory_order_relaxed);
        continue;
      }
      try {
        Enable(log::ParseModule(item), true);
      } catch (const Error& e) {
        MORI_LOG_WARN(kCore, "ignoring MORI_TELEMETRY entry: ", e.what());
      }
    }
  }
};

}  // namespace

std::atomic<bool> g_enabled[log::kModuleCount] = {false, false, false, false, false};

static EnvTelemetry env_telemetry;

void Enable(log::Module module, bool on) noexcept {
  g_enabled[static_cast<int>(module)].store(on, std::memory_order_relaxed);
}

void Record(TimerSite& site, uint64_t elapsed_ns) noexcept {
  if (MORI_UNLIKELY(!site.registered.load(std::memory_order_acquire))) {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    if (!site.registered.load(std::memory_order_relaxed)) {
      try {
        Registry().push_back(&site);
      } catch (...) {
        return;  // out of memory: drop the sample rather than throw from a destructor
      }
      site.registered.store(true, std::memory_order_release);
    }
  }
  site.count.fetch_add(1, std::memory_order_relaxed);
  site.total_ns.fetch_add(elapsed_ns, std::memory_order_relaxed);
  AtomicMin(site.min_ns, elapsed_ns);
  AtomicMax(site.max_ns, elapsed_ns);
}

std::vector<TimerStats> Snapshot() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<TimerStats> out;
  out.reserve(Registry().size());
  for (TimerSite* s : Registry()) {
    uint64_t count = s->count.load(std::memory_order_relaxed);
    out.push_back(TimerStats{log::ModuleName(s->module), s->name, count,
                             s->total_ns.load(std::memory_order_relaxed),
                             count ? s->min_ns.load(std::memory_order_relaxed) : 0,
                             s->max_ns.load(std::memory_order_relaxed)});
  }
  return out;
}

void Reset() noexcept {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (TimerSite* s : Registry()) {
    s->count.store(0, std::memory_order_relaxed);
    s->total_ns.store(0, std::memory_order_relaxed);
    s->min_ns.store(UINT64_MAX, std::memory_order_relaxed);
    s->max_ns.store(0, std::memory_order_relaxed);
  }
}

}  // namespace mori::telemetry
