// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/peer_wait.hpp"
#include "common/shape.hpp"
#include "mori/core/error.hpp"
#include "mori/shmem/host_ops.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

// What every mode's CPU implementation checks of its op's block on a host heap: the heap
// is this op's world (same size, same rank), the block is symmetric, and every pe's copy
// is load/store reachable from here (all pes on this node). `mode` names the mode in
// the error.
inline void CheckHostBlock(const EpShape& shape, const shmem::DeviceContext& ctx, void* block,
                           size_t bytes, const char* mode) {
  MORI_CHECK_ARG(ctx.n_pes == shape.world_size, "world_size ", shape.world_size,
                 " differs from the heap's n_pes ", ctx.n_pes);
  MORI_CHECK_ARG(ctx.my_pe == shape.rank, "rank ", shape.rank, " differs from the heap's my_pe ",
                 ctx.my_pe);
  MORI_CHECK_ARG(shmem::IsSymmetric(block, bytes), "the op's buffer is not a symmetric block of ",
                 bytes, " bytes");
  for (int pe = 0; pe < ctx.n_pes; ++pe) {
    if (shmem::host::Ptr(ctx, static_cast<char*>(block), pe) == nullptr) {
      MORI_THROW(NotSupportedError, mode, " dispatch/combine needs every pe on this node, ",
                 "but pe ", pe, " is not load/store reachable from pe ", ctx.my_pe);
    }
  }
}

// Waits (acquire) until pe `peer`'s word `*word` (this pe's copy) >= `floor`; after
// `timeout` throws TimeoutError naming the rank and the stage (MORI_EP_LOST_RANK_FORMAT,
// the kernels' words).
inline uint64_t WaitPeerWord(const uint64_t* word, uint64_t floor, std::chrono::nanoseconds timeout,
                             int me, int peer, const PeerStage& at) {
  try {
    return shmem::host::WaitUntil(word, shmem::Cmp::kGe, floor, timeout);
  } catch (const TimeoutError&) {
    const uint64_t last = __atomic_load_n(word, __ATOMIC_ACQUIRE) >> at.call_shift;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
    char text[512];
    std::snprintf(text, sizeof(text), MORI_EP_LOST_RANK_FORMAT, at.op,
                  static_cast<unsigned long long>(at.call), me, peer, at.stage,
                  static_cast<unsigned long long>(ms), static_cast<unsigned long long>(last));
    throw TimeoutError(std::string(text));
  }
}

}  // namespace mori::ep
