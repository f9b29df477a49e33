// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "intranode/tuning.hpp"

#include <algorithm>
#include <cstdlib>

namespace mori::ep {

IntraNodeTuning IntraNodeTuning::FromEnv() {
  IntraNodeTuning t;
  auto read = [](const char* name, auto apply) {
    if (const char* v = std::getenv(name)) apply(std::atoi(v));
  };
  read("MORI_EP_COMBINE_STEPS", [&](int v) { t.combine_steps = std::max(1, v); });
  read("MORI_EP_DISPATCH_SEG", [&](int v) { t.dispatch_seg = v == 4 ? 4 : 8; });
  read("MORI_EP_COMBINE_SPLIT", [&](int v) { t.combine_split = v != 0; });
  read("MORI_EP_COMBINE_ONEPASS_ROWS", [&](int v) { t.combine_onepass_rows = std::max(0, v); });
  read("MORI_EP_COMBINE_STREAM", [&](int v) { t.combine_stream = v != 0; });
  read("MORI_EP_COMBINE_RETURN_WARPS", [&](int v) { t.combine_return_warps = std::max(0, v); });
  read("MORI_EP_COMBINE_STEP_GROUPS", [&](int v) { t.combine_step_groups = std::max(0, v); });
  read("MORI_EP_EVEN_SEG", [&](int v) { t.even_segments = v != 0; });
  read("MORI_EP_DISPATCH_DYNAMIC", [&](int v) { t.dispatch_dynamic = v != 0 ? 1 : 0; });
  read("MORI_EP_DISPATCH_DYNAMIC_TOKENS",
       [&](int v) { t.dispatch_dynamic_tokens = std::max(0, v); });
  read("MORI_EP_TIMELINE", [&](int v) { t.timeline = v != 0; });
  return t;
}

}  // namespace mori::ep
