// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// MORI_EP_TIMELINE=1 (a measurement aid): the CUDA kernels record, per block, when they
// reach each phase (globaltimer ns) of the last launch of each of a mode's kernel parts,
// so that every microsecond of a call is attributed. A mode names its parts (a kernel, or
// one phase of a kernel that runs several) and their stamps; the kernels write them with
// Stamp() (common/timeline.cuh). Plain C++: streams cross as integers.

#include <cstdint>
#include <string>
#include <vector>

namespace mori::ep {

// Stamps per block and part, for the first kTimelineBlocks blocks of a launch.
inline constexpr int kTimelineStamps = 8;
inline constexpr int kTimelineBlocks = 1024;

struct TimelinePart {
  const char* name;                     // e.g. "dispatch", "combine recv"
  const char* stamps[kTimelineStamps];  // the stamps' names in phase order ("" unused)
};

class KernelTimeline {
 public:
  // Allocates the stamps of every part on `device` when `on`; otherwise holds nothing
  // and Begin() returns nullptr (the kernels then skip every stamp).
  KernelTimeline(int device, std::vector<TimelinePart> parts, bool on);
  ~KernelTimeline();
  KernelTimeline(const KernelTimeline&) = delete;
  KernelTimeline& operator=(const KernelTimeline&) = delete;

  bool on() const { return stamps_ != nullptr; }
  // Before a launch of `blocks` blocks that records part `part`: clears its stamps on
  // `stream` (so a CUDA graph clears them at each replay) and returns them
  // ([kTimelineBlocks][kTimelineStamps]), or nullptr when off.
  uint64_t* Begin(int part, int blocks, uintptr_t stream);
  // The stamps of each part's last launch as text, synchronising the device: per stamp
  // min/median/max over blocks in us from the part's first block start, and where the
  // part started relative to the end of the part before it. "" when off.
  std::string Format();

 private:
  int device_;
  std::vector<TimelinePart> parts_;
  std::vector<int> blocks_;
  uint64_t* stamps_ = nullptr;
};

}  // namespace mori::ep
