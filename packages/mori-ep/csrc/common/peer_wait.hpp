// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// What a wait for a peer's signal word says when the word does not come: every mode's
// CPU implementation (WaitPeerWord, common/host_block.hpp) and kernels (WaitPeerWord,
// common/peer_wait.cuh) say, in the same words, which op and call, on which rank,
// which rank did not arrive at which stage within the op's timeout, and the last call
// that rank's word carries (as mori.ccl's collectives do). A signal word carries its
// call number in its bits from `call_shift` up (kCountBits for count words and the
// low-latency flags, 0 for the intra-node dispatch_done words, kCombineEpochShift for
// its combine words).

#include <cstdint>

namespace mori::ep {

// The message, as a printf format: op, call, this rank, the peer, the stage, the
// timeout in ms and the peer's last call.
#define MORI_EP_LOST_RANK_FORMAT                                           \
  "%s (call %llu) on rank %d: rank %d did not arrive (%s) within %llu ms " \
  "(its last signal is from call %llu)"

// Where a wait stands: the op ("dispatch", "low-latency combine", ...), its call and
// the stage the peer's word marks ("count words", "dispatch flag", ...).
struct PeerStage {
  const char* op;
  uint64_t call;
  const char* stage;
  int call_shift;
};

}  // namespace mori::ep
