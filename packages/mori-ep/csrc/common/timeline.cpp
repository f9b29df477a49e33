// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "common/timeline.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"

namespace mori::ep {

namespace {
constexpr size_t kPartWords = static_cast<size_t>(kTimelineBlocks) * kTimelineStamps;
}

KernelTimeline::KernelTimeline(int device, std::vector<TimelinePart> parts, bool on)
    : device_(device), parts_(std::move(parts)), blocks_(parts_.size(), 0) {
  if (!on) return;
  mori::cuda::ScopedDevice guard(device_);
  const size_t bytes = parts_.size() * kPartWords * sizeof(uint64_t);
  MORI_CUDA_CHECK(cudaMalloc(&stamps_, bytes));
  MORI_CUDA_CHECK(cudaMemset(stamps_, 0, bytes));
}

KernelTimeline::~KernelTimeline() {
  if (stamps_ == nullptr) return;
  mori::cuda::ScopedDevice guard(device_);
  cudaFree(stamps_);  // never throws from a destructor; a failure leaks the buffer
}

uint64_t* KernelTimeline::Begin(int part, int blocks, uintptr_t stream) {
  if (stamps_ == nullptr) return nullptr;
  MORI_CHECK(part >= 0 && part < static_cast<int>(parts_.size()), "timeline part ", part,
             " out of range");
  uint64_t* slot = stamps_ + static_cast<size_t>(part) * kPartWords;
  MORI_CUDA_CHECK(cudaMemsetAsync(slot, 0, kPartWords * sizeof(uint64_t),
                                  reinterpret_cast<cudaStream_t>(stream)));
  blocks_[part] = std::min(blocks, kTimelineBlocks);
  return slot;
}

std::string KernelTimeline::Format() {
  if (stamps_ == nullptr) return "";
  mori::cuda::ScopedDevice guard(device_);
  std::vector<uint64_t> h(parts_.size() * kPartWords);
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  MORI_CUDA_CHECK(
      cudaMemcpy(h.data(), stamps_, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  std::string text;
  uint64_t prev_end = 0;
  const char* prev = nullptr;
  for (size_t k = 0; k < parts_.size(); ++k) {
    const uint64_t* base = h.data() + k * kPartWords;
    const int blocks = blocks_[k];
    uint64_t t0 = ~uint64_t{0}, end = 0;
    for (int b = 0; b < blocks; ++b) {
      if (base[b * kTimelineStamps] != 0) t0 = std::min(t0, base[b * kTimelineStamps]);
      for (int j = 0; j < kTimelineStamps; ++j) end = std::max(end, base[b * kTimelineStamps + j]);
    }
    if (blocks == 0 || t0 == ~uint64_t{0}) continue;
    text += StrCat(parts_[k].name, " (", blocks,
                   " blocks; us from the first block's start: ", "min/median/max over blocks)");
    if (prev != nullptr) {
      const bool after = t0 >= prev_end;
      text += StrCat(" starts ", (after ? t0 - prev_end : prev_end - t0) / 1e3, " us ",
                     after ? "after" : "before", " the ", prev, "'s last stamp");
    }
    text += "\n";
    for (int j = 0; j < kTimelineStamps; ++j) {
      std::vector<double> v;
      for (int b = 0; b < blocks; ++b) {
        const uint64_t x = base[b * kTimelineStamps + j];
        if (x != 0) v.push_back((x - t0) / 1e3);
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      char line[160];
      std::snprintf(line, sizeof(line), "  %-13s %4zu blocks %8.1f %8.1f %8.1f\n",
                    parts_[k].stamps[j] != nullptr ? parts_[k].stamps[j] : "?", v.size(), v.front(),
                    v[v.size() / 2], v.back());
      text += line;
    }
    prev_end = end;
    prev = parts_[k].name;
  }
  return text;
}

}  // namespace mori::ep
