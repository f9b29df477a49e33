// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include "mori/core/env.hpp"

namespace mori::ep {

// The low-latency kernel types' switches, read from the environment once per op, when it
// is built (docs/configuration.md). Every rank of an op must see the same values of the
// first two: ranks that disagree fail their calls by wire tag, naming both sides.
struct LowLatencyOptions {
  bool pre_reduce = true;    // MORI_EP_LL_PRE_REDUCE: combine_standard_moe may pre-reduce per
                             // rank (LlPreReduce says where it does)
  bool copy_engine = false;  // MORI_EP_LL_COPY_ENGINE: CUDA ops move the rows for other
                             // ranks with copy-engine copies
  bool timeline = false;     // MORI_EP_TIMELINE: per-phase stamps (LowLatencyCuda::Timeline);
                             // this rank's measurement aid, no wire effect

  static LowLatencyOptions FromEnv() {
    LowLatencyOptions o;
    o.pre_reduce = env::Bool("MORI_EP_LL_PRE_REDUCE", o.pre_reduce);
    o.copy_engine = env::Bool("MORI_EP_LL_COPY_ENGINE", o.copy_engine);
    o.timeline = env::Bool("MORI_EP_TIMELINE", o.timeline);
    return o;
  }
};

}  // namespace mori::ep
