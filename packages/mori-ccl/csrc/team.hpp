// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// A communicator's ranks as a subset of the heap's pes: when a group spans hosts, each
// host's pes run the collectives among themselves (rank i = the host's i-th pe) and the
// Python layer moves data between hosts. The protocols address ranks only through a
// DeviceContext (peer_bases[rank], my_pe, n_pes), so a context whose table lists the
// team's pes in order makes them run on the team unchanged.

#include <string>
#include <vector>

#include "mori/core/error.hpp"
#include "mori/shmem/context.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ccl {

// `pes` empty: every pe of the heap (the heap's own context). Otherwise ascending,
// distinct pes of the heap, this process's among them, each load/store reachable;
// `bases` receives the team's peer bases (host addresses of the pes' heaps; for a CUDA
// heap the caller copies them to device memory and points peer_bases there).
inline shmem::DeviceContext TeamContext(const shmem::DeviceContext& heap,
                                        const std::vector<int>& pes, std::vector<char*>& bases) {
  shmem::DeviceContext ctx = heap;
  bases.clear();
  if (pes.empty()) return ctx;
  int me = -1;
  for (size_t i = 0; i < pes.size(); ++i) {
    const int pe = pes[i];
    MORI_CHECK_ARG(pe >= 0 && pe < heap.n_pes, "team pe ", pe, " out of range [0, ", heap.n_pes,
                   ")");
    MORI_CHECK_ARG(i == 0 || pe > pes[i - 1], "team pes must ascend, got ", pes[i - 1], " then ",
                   pe);
    char* base = static_cast<char*>(shmem::Ptr(heap.my_base, pe));
    if (base == nullptr) {
      MORI_THROW(NotSupportedError, "the collectives' team holds pe ", pe,
                 ", which is not load/store reachable from pe ", heap.my_pe);
    }
    bases.push_back(base);
    if (pe == heap.my_pe) me = static_cast<int>(i);
  }
  MORI_CHECK_ARG(me >= 0, "the team's pes do not include this pe ", heap.my_pe);
  ctx.peer_bases = bases.data();
  ctx.my_pe = me;
  ctx.n_pes = static_cast<int>(pes.size());
  return ctx;
}

}  // namespace mori::ccl
