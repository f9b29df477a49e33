// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// What the host class (intranode/cuda.cu) and the intra-node kernels (dispatch.cu,
// combine.cu) share: the kernels' parameter structs and the constants that fix their
// builds. Plain C++: the host side fills the structs and calls the launchers of
// common/launch_api.hpp; streams cross as integers.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/launch_shape.hpp"
#include "common/timeline.hpp"
#include "intranode/args.hpp"
#include "intranode/protocol.hpp"
#include "mori/shmem/context.hpp"

namespace mori::ep::intranode {

// Most warps per block of a launch (MORI's warp_per_block).
inline constexpr int kMaxWarpsPerBlock = 32;

inline constexpr int kW = kMaxCudaWorldSize;
inline constexpr int kMaxThreads = kMaxWarpsPerBlock * 32;
// Grids of up to 16 warps per block run a 512-thread build of each kernel, which
// may use 128 registers per thread (the 1024-thread build gets 64).
inline constexpr int kNarrowThreads = 512;
// A warp moves a row in segments of kSeg 16-byte words per lane (8 in the 512-thread
// build: 4 KiB; 4 in the 1024-thread one, which has half the registers): all loads
// of a segment are issued before its stores, so the copy costs one load latency per
// segment instead of one per word batch.
template <int kThreads>
inline constexpr int kSegWords = kThreads <= kNarrowThreads ? 8 : 4;  // combine; dispatch: kSeg
// 16-byte words per lane a combine reduction keeps in flight per pe (two pes at once).
template <int kThreads>
inline constexpr int kReduceWords = kThreads <= kNarrowThreads ? 4 : 1;
// 32-bit metadata words (weights, indices, scales, src_pos) a lane stages at once.
inline constexpr int kMetaWords = 4;
// The most resident blocks an SM takes (sm_90): bounds the dynamic dispatch's scratch.
inline constexpr int kMaxBlocksPerSm = 32;

struct Common {
  shmem::DeviceContext ctx;
  char* block;  // this pe's symmetric block
  EpBufferLayout layout;
  int world, me, top_k;
  int64_t max_tokens;  // M
  uint64_t timeout_ns;
  // combine: its words' bits below the epoch (CombineWord(0, the input's dtype tag, not
  // rejected, out_weights set)), computed on the host.
  uint32_t combine_bits = 0;
};

struct DispatchParams {
  Common c;
  int experts_per_rank, num_experts;
  int64_t hidden_bytes, row_bytes, scale_bytes;
  const char* tokens;
  const float* weights;
  const char* scales;
  const int32_t* indices;
  int64_t num_tokens;
  const uint32_t* rank_masks;  // a replay: each token's destination pes; null: from indices
  uint32_t row_tag;       // the rows' dtype code, posted with the counts (intranode/protocol.hpp)
  int64_t recv_capacity;  // rows of every pe's receive buffers (RecvCapacity)
  bool vec;               // token rows move as 16-byte words
  bool indices_vec;       // index rows load as int4 (K % 4 == 0, 16-byte aligned)
  bool meta_staged;       // metadata fits kMetaWords words per lane, 4-byte aligned
  uint64_t* stamps;       // MORI_EP_TIMELINE: [block][kStamps] globaltimer stamps, else null
};

struct CombineParams {
  Common c;
  int64_t hidden, combine_row_bytes, row_bytes;
  const char* input;
  int64_t input_row_stride, input_rows;
  CombineDtype dtype;  // of input and output
  bool fp8_cast;       // bf16 rows cross as fp8 e4m3 (MORI's fp8_direct_cast)
  // Rows, slots, input and output all move as 16-byte words; under kWireBlockwise
  // also: a scale block is block_lanes whole 16-byte words (combine_blockwise.cuh).
  bool vec;
  // kWireBlockwise (MORI's fp8_blockwise, common/numeric.hpp): scale blocks per row,
  // columns per block, where the scales start in a wire row, and (vec) the 16-byte
  // bf16 words per block, a power of two <= 32.
  int scale_dim;
  int64_t block_elems, scales_offset;
  int block_lanes;
  const float* weights;
  void* out;
  float* out_weights;
  int64_t num_tokens;
  // The routing combine reverses (RoutingSnapshot): the last dispatch's regions of
  // the block, or a routing handle's tensors.
  const int32_t* src_pos;
  const int32_t* group_row;
  const uint8_t* token_ranks;
  const int32_t* token_self_row;
  const int32_t* total_recv;
  const uint64_t* epoch;
  int steps;          // tiles per block the combine aims for (pipeline depth)
  bool split;         // half the warps return rows while the other half reduce
  int ret_seg_words;  // 16-byte words per lane of a returned row segment (SplitRow)
  int nseg_ret;       // segments per returned row
  int return_warps;   // streaming path: warps per block that return rows (1 .. nwarps - 1)
  int step_groups;    // streaming path: groups a block's return warps post at once
  uint64_t* stamps;   // MORI_EP_TIMELINE: [block][kStamps] globaltimer stamps, else null
};

// Scratch of the dynamic dispatch kernel: private device memory of the pe (not
// symmetric), zeroed once; words carry the epoch and the item counter is reset by the
// kernel's last block, so no launch clears them.
struct ScratchOffsets {
  size_t block_counts = 0, chunk_ready, token_rows, work, total;
  ScratchOffsets(int64_t blocks, int64_t max_tokens) {
    chunk_ready = AlignUp(blocks * kW * sizeof(uint64_t), 256);
    token_rows = chunk_ready + AlignUp(blocks * kW * sizeof(uint64_t), 256);
    work = token_rows + AlignUp(max_tokens * kW * sizeof(int32_t), 256);
    total = work + 256;
  }
};
struct DispatchScratch {
  uint64_t* block_counts;  // [block][kW] CountWord(epoch, tokens of the block's chunk to d)
  uint64_t* chunk_ready;   // [block * kW] epoch once the block's token_rows are written
  int32_t* token_rows;     // [M][kW] row of token t at pe d, -1 when not sent there
  uint32_t* work;          // (token, segment) items handed out; the last block resets it
};

// How combine rows cross to their sources (a kernel template parameter, so the
// bf16/fp32 kernels carry none of the fp8 code): kWireNative as the input dtype (bf16
// or fp32), kWireFp8 as fp8 e4m3 bytes (fp8 input, or bf16 input rounded to fp8 on the
// way: MORI's fp8_direct_cast), kWireBlockwise as MORI's fp8_blockwise rows (bf16
// input: fp8 e4m3 blocks with fp32 scales, BlockwiseRowBytes).
enum CombineWire : int { kWireNative = 0, kWireFp8 = 1, kWireBlockwise = 2 };
inline constexpr int kCombineWires = 3;

// Combine's paths; the host picks one per call (IntraNodeCuda::Combine). One kernel
// per path keeps each path's register allocation its own (both in one kernel spilled
// 248 B in the 512-thread build).
enum CombinePath : int { kTiledPath = 0, kOnePassPath = 1, kStreamPath = 2 };

// A warp moves a row of `nwords` 16-byte words in segments of at most kseg words per
// lane: as few segments as kseg allows, with the words spread evenly over them (a
// 14336-byte bf16 row at kseg 8: 4 segments of 7 words instead of 3 of 8 and one of
// 4), or, with even false, full kseg-word segments and a short last one.
inline void SplitRow(int64_t nwords, int kseg, bool even, int* seg_words, int* nseg) {
  const int64_t per_lane = std::max<int64_t>(1, (nwords + 31) / 32);
  const int64_t n = (per_lane + kseg - 1) / kseg;
  *nseg = static_cast<int>(n);
  *seg_words = even ? static_cast<int>((per_lane + n - 1) / n) : kseg;
}

}  // namespace mori::ep::intranode
