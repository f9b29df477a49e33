// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "intranode/tuning.hpp"

#include "mori/core/env.hpp"
#include "mori/core/error.hpp"

namespace mori::ep {

IntraNodeTuning IntraNodeTuning::FromEnv() {
  IntraNodeTuning t;
  constexpr int64_t kMany = int64_t{1} << 20;
  t.combine_steps = static_cast<int>(env::Int("MORI_EP_COMBINE_STEPS", t.combine_steps, 1, kMany));
  t.dispatch_seg = static_cast<int>(env::Int("MORI_EP_DISPATCH_SEG", t.dispatch_seg, 4, 8));
  if (t.dispatch_seg != 4 && t.dispatch_seg != 8) {
    MORI_THROW(InvalidArgumentError, "MORI_EP_DISPATCH_SEG='", t.dispatch_seg,
               "': expected 4 or 8 (16-byte words per lane)");
  }
  t.combine_split = env::Bool("MORI_EP_COMBINE_SPLIT", t.combine_split);
  t.combine_onepass_rows =
      static_cast<int>(env::Int("MORI_EP_COMBINE_ONEPASS_ROWS", t.combine_onepass_rows, 0, kMany));
  t.combine_stream = env::Bool("MORI_EP_COMBINE_STREAM", t.combine_stream);
  t.combine_return_warps =
      static_cast<int>(env::Int("MORI_EP_COMBINE_RETURN_WARPS", t.combine_return_warps, 0, 32));
  t.combine_step_groups =
      static_cast<int>(env::Int("MORI_EP_COMBINE_STEP_GROUPS", t.combine_step_groups, 0, kMany));
  t.even_segments = env::Bool("MORI_EP_EVEN_SEG", t.even_segments);
  if (const auto dynamic = env::Get("MORI_EP_DISPATCH_DYNAMIC")) {
    t.dispatch_dynamic = env::ParseBool("MORI_EP_DISPATCH_DYNAMIC", *dynamic) ? 1 : 0;
  }
  t.dispatch_dynamic_tokens = static_cast<int>(
      env::Int("MORI_EP_DISPATCH_DYNAMIC_TOKENS", t.dispatch_dynamic_tokens, 0, int64_t{1} << 30));
  t.timeline = env::Bool("MORI_EP_TIMELINE", t.timeline);
  return t;
}

}  // namespace mori::ep
