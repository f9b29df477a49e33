// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// Cost of MORI_SCOPED_TIMER per scope: telemetry off (the price every hot path pays
// in production) and on, against the same loop without a timer. Prints a table and
// one JSON line. Usage: bench_telemetry [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "mori/core/telemetry.hpp"

namespace {

// The empty asm keeps the loop from being folded away; it costs no instructions.
__attribute__((noinline)) void Baseline(long n) {
  for (long i = 0; i < n; ++i) asm volatile("" ::: "memory");
}

__attribute__((noinline)) void Timed(long n) {
  for (long i = 0; i < n; ++i) {
    MORI_SCOPED_TIMER(kIo, "bench.timed_scope");
    asm volatile("" ::: "memory");
  }
}

double NsPerIter(void (*fn)(long), long n) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    fn(n);
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
    if (ns < best) best = ns;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 50'000'000L;
  using mori::log::Module;
  mori::telemetry::Enable(Module::kIo, false);
  const double base = NsPerIter(Baseline, n);
  const double off = NsPerIter(Timed, n);
  mori::telemetry::Enable(Module::kIo, true);
  const double on = NsPerIter(Timed, n / 10);
  mori::telemetry::Enable(Module::kIo, false);
  std::printf("scoped timer cost, best of 5 runs (%ld iterations; 'on' uses %ld)\n", n, n / 10);
  std::printf("| variant              | ns/iter | ns over baseline |\n");
  std::printf("|----------------------|--------:|-----------------:|\n");
  std::printf("| no timer             | %7.3f | %16s |\n", base, "-");
  std::printf("| timer, telemetry off | %7.3f | %16.3f |\n", off, off - base);
  std::printf("| timer, telemetry on  | %7.3f | %16.3f |\n", on, on - base);
  std::printf(
      "{\"bench\": \"telemetry_timer\", \"iterations\": %ld, \"baseline_ns\": %.4f, "
      "\"off_ns\": %.4f, \"on_ns\": %.4f}\n",
      n, base, off, on);
  return 0;
}
