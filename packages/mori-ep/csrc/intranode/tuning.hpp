// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The CUDA intra-node kernels' measurement switches, read from the environment once
// per op (IntraNodeCuda's constructor). Defaults are the measured best
// (BENCHMARKS.md); the README's "Measurement switches" lists them.

namespace mori::ep {

struct IntraNodeTuning {
  int combine_steps = 4;               // MORI_EP_COMBINE_STEPS: tiles per block (tiled path)
  int dispatch_seg = 8;                // MORI_EP_DISPATCH_SEG: 16-byte words per lane of a
                                       // dispatch segment (4 or 8)
  bool combine_split = false;          // MORI_EP_COMBINE_SPLIT: the tiled path splits each
                                       // block's warps between returning and reducing
  int combine_onepass_rows = 16;       // MORI_EP_COMBINE_ONEPASS_ROWS: rows per block up to which
                                       // combine takes the one-pass path (0: never)
  bool combine_stream = true;          // MORI_EP_COMBINE_STREAM (0: the tiled path)
  int combine_return_warps = 0;        // MORI_EP_COMBINE_RETURN_WARPS (0: half the block)
  int combine_step_groups = 0;         // MORI_EP_COMBINE_STEP_GROUPS (0: about 6 items per warp)
  bool even_segments = true;           // MORI_EP_EVEN_SEG: combine's returned segments spread a
                                       // row's words evenly (0: full segments, a short last one)
  int dispatch_dynamic = -1;           // MORI_EP_DISPATCH_DYNAMIC (1 / 0: always / never; -1:
                                       // from dispatch_dynamic_tokens tokens up)
  int dispatch_dynamic_tokens = 1024;  // MORI_EP_DISPATCH_DYNAMIC_TOKENS
  bool timeline = false;               // MORI_EP_TIMELINE: per-phase stamps (Timeline())

  // The defaults above, overridden by whichever variables are set (mori::env's syntax:
  // a bad or out-of-range value is an InvalidArgumentError naming it).
  static IntraNodeTuning FromEnv();
};

}  // namespace mori::ep
