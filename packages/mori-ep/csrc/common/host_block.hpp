// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstddef>

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

}  // namespace mori::ep
