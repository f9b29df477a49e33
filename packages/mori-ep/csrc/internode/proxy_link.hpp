// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The inter-node leg through mori-core's proxy (mori/proxy/proxy.hpp): every write and
// signal becomes a command in this op's proxy queue; the proxy thread moves it with the
// transport of the destination's path (mapped / CMA for nodes emulated on one host,
// TCP between hosts) and applies a signal only after the writes before it to that pe.
//
// One proxy per process and heap (built by the first inter-node op, collectively, and
// closed collectively when the heap is finalized): an op that goes away must not close
// connections its peers' ops may still be using (a proxy treats a dropped connection
// as a lost peer). Each op stages in its own ring.
//
// A proxy write copies from this pe's heap, so the link stages each payload in a send
// ring inside the op's block (`ring_offset`, `ring_bytes`): bytes are copied there and
// a ring range is reused only after the command that read it has retired. Writes that
// continue one another at the destination are gathered into runs (a ring segment per
// run, a few runs open at once: the protocol writes a row's fields to separate arrays)
// and a run becomes one proxy command when it is full, when a signal or Quiet needs it
// or when the ring needs its room: fewer, larger commands and TCP frames. A write lands
// after every earlier write to its pe (runs to a pe are pushed in the order they were
// opened, and a write extends a run only when no later run to that pe overlaps it), and
// a signal after every earlier write to its pe. Signals are
// the protocol's 64-bit "set" words; the proxy adds, so the link adds the difference
// to the value it last set at that word (each word the link writes has one writer,
// this pe, and starts at zero).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "internode/link.hpp"
#include "mori/proxy/proxy.hpp"

namespace mori::ep {

class ProxyLink final : public CrossNodeLink {
 public:
  // Collective over the heap's pes when it builds the process's proxy (the first
  // inter-node op on this heap; over the heap's bootstrap, `timeout` bounding it).
  ProxyLink(char* block, size_t ring_offset, size_t ring_bytes, std::chrono::milliseconds timeout);
  ~ProxyLink() override;
  const char* name() const override;
  void Write(int pe, size_t offset, const void* src, size_t bytes) override;
  void Signal(int pe, size_t offset, uint64_t value) override;
  void Quiet() override;
  uint64_t moved_bytes() const override;
  void CheckHealth() const override;

 private:
  std::shared_ptr<proxy::Proxy> proxy_;
  proxy::QueueView queue_{};
  char* block_;
  uint64_t block_offset_;  // of the op's block in the heap
  size_t ring_offset_, ring_bytes_;
  uint64_t ring_head_ = 0;  // bytes ever reserved (position: ring_head_ % ring_bytes_)
  // Ring ranges still read by a command: start in ring_head_'s count -> command index.
  // Ordered by start, not by command: a run opened early may be pushed late.
  std::map<uint64_t, uint64_t> in_flight_;
  std::map<std::pair<int, size_t>, uint64_t> last_set_;
  // Open runs, oldest first: destination [dst, dst + used) of pe, staged at ring
  // position pos (reserved `room` bytes from ring count `start`).
  struct Run {
    int pe;
    size_t dst;
    uint64_t start, pos, room, used;
  };
  std::vector<Run> runs_;
  // Reserves `bytes` contiguous ring bytes; returns the ring position.
  uint64_t Reserve(uint64_t bytes, uint64_t* start);
  // Pushes open run i, after the older open runs to its pe.
  void PushRun(size_t i);
  void PushRunsTo(int pe);  // every open run to pe (pe < 0: every open run)
  std::string name_;
};

}  // namespace mori::ep
