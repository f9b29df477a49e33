// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "internode/proxy_link.hpp"

#include <algorithm>
#include <cstring>

#include "mori/core/error.hpp"
#include "mori/proxy/queue.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ep {

namespace {

// The process's proxy for the current heap: built by the first inter-node op, closed
// (collectively, in an orderly way) when the heap is finalized, so peers see goodbyes
// rather than dropped connections; a process that exits without finalizing drops them.
std::shared_ptr<proxy::Proxy>& CurrentProxy() {
  static auto* proxy = new std::shared_ptr<proxy::Proxy>();  // never destroyed at exit
  return *proxy;
}

std::shared_ptr<proxy::Proxy> SharedProxy(std::chrono::milliseconds timeout) {
  std::shared_ptr<proxy::Proxy>& current = CurrentProxy();
  if (!current) {
    proxy::ProxyOptions o;
    o.num_queues = 1;
    o.producer = proxy::Producer::kHost;
    o.timeout = timeout;
    current = std::make_shared<proxy::Proxy>(shmem::GetBootstrap(), o);
    shmem::AtFinalize([] {
      std::shared_ptr<proxy::Proxy> p = std::move(CurrentProxy());
      CurrentProxy().reset();
      if (p) p->Close();
    });
  }
  return current;
}

}  // namespace

ProxyLink::ProxyLink(char* block, size_t ring_offset, size_t ring_bytes,
                     std::chrono::milliseconds timeout)
    : block_(block), ring_offset_(ring_offset), ring_bytes_(ring_bytes) {
  const shmem::DeviceContext ctx = shmem::GetDeviceContext();
  block_offset_ = static_cast<uint64_t>(block - static_cast<char*>(ctx.my_base));
  proxy_ = SharedProxy(timeout);
  queue_ = proxy_->HostQueue(0);
  // The paths this pe's commands take, named once (e.g. "proxy (tcp)").
  bool paths[3] = {false, false, false};
  for (int pe = 0; pe < proxy_->n_pes(); ++pe) {
    if (pe != proxy_->my_pe()) paths[static_cast<int>(proxy_->PathTo(pe))] = true;
  }
  name_ = "proxy (";
  const char* sep = "";
  for (int p = 0; p < 3; ++p) {
    if (paths[p]) {
      name_ += sep;
      name_ += proxy::PathName(static_cast<proxy::Path>(p));
      sep = ", ";
    }
  }
  name_ += ")";
}

ProxyLink::~ProxyLink() = default;

const char* ProxyLink::name() const { return name_.c_str(); }

namespace {
// Open runs at once, and a run's ring segment: room for 32 payloads of the write that
// opens it, at most 1/8 of the ring.
constexpr size_t kMaxRuns = 8;
constexpr uint64_t kRunPayloads = 32;
}  // namespace

uint64_t ProxyLink::Reserve(uint64_t bytes, uint64_t* start) {
  // Contiguous in the ring: skip the tail when the payload does not fit before the end.
  uint64_t pos = ring_head_ % ring_bytes_;
  if (pos + bytes > ring_bytes_) ring_head_ += ring_bytes_ - pos, pos = 0;
  *start = ring_head_;
  ring_head_ += (bytes + 7) / 8 * 8;
  // Open runs whose segments this range reaches are pushed first (oldest first)...
  for (size_t i = 0; i < runs_.size();) {
    if (runs_[i].start + ring_bytes_ < ring_head_) {
      PushRun(i);
      i = 0;
    } else {
      ++i;
    }
  }
  // ...and commands still reading what this range overwrites (their ranges start less
  // than one ring behind this one's end) must retire first.
  uint64_t need = 0;
  while (!in_flight_.empty() && in_flight_.begin()->first + ring_bytes_ < ring_head_) {
    need = std::max(need, in_flight_.begin()->second + 1);
    in_flight_.erase(in_flight_.begin());
  }
  if (need > 0) proxy::WaitRetired(queue_, need);
  return pos;
}

void ProxyLink::PushRun(size_t i) {
  const int pe = runs_[i].pe;
  for (size_t j = 0; j < i;) {
    if (runs_[j].pe == pe) {
      PushRun(j);  // erases j: i moves down by one
      --i;
    } else {
      ++j;
    }
  }
  const Run r = runs_[i];
  runs_.erase(runs_.begin() + static_cast<std::ptrdiff_t>(i));
  const uint64_t idx = proxy::PushWrite(queue_, r.pe, block_offset_ + r.dst,
                                        block_offset_ + ring_offset_ + r.pos, r.used);
  in_flight_.emplace(r.start, idx);
}

void ProxyLink::PushRunsTo(int pe) {
  for (;;) {
    size_t last = runs_.size();
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (pe < 0 || runs_[i].pe == pe) last = i;
    }
    if (last == runs_.size()) return;
    PushRun(last);  // with the older ones to its pe
  }
}

void ProxyLink::Write(int pe, size_t offset, const void* src, size_t bytes) {
  MORI_CHECK(bytes <= ring_bytes_, "a link write of ", bytes, " bytes exceeds the send ring's ",
             ring_bytes_);
  if (bytes == 0) return;
  // Extend an open run that ends where this write starts, unless a later run to pe
  // overlaps the write (it must land after that one).
  for (size_t i = 0; i < runs_.size(); ++i) {
    Run& r = runs_[i];
    if (r.pe != pe || r.dst + r.used != offset) continue;
    if (r.used + bytes > r.room) {
      PushRun(i);  // full: on its way now, the write opens the next run
      break;
    }
    bool later_overlaps = false;
    for (size_t j = i + 1; j < runs_.size(); ++j) {
      const Run& o = runs_[j];
      later_overlaps |= o.pe == pe && o.dst < offset + bytes && offset < o.dst + o.used;
    }
    if (later_overlaps) break;
    std::memcpy(block_ + ring_offset_ + r.pos + r.used, src, bytes);
    r.used += bytes;
    if (r.used == r.room) PushRun(i);
    return;
  }
  if (runs_.size() >= kMaxRuns) PushRun(0);
  const uint64_t room =
      std::max<uint64_t>(bytes, std::min<uint64_t>(bytes * kRunPayloads, ring_bytes_ / 8));
  uint64_t start = 0;
  const uint64_t pos = Reserve(room, &start);
  std::memcpy(block_ + ring_offset_ + pos, src, bytes);
  runs_.push_back(Run{pe, offset, start, pos, room, bytes});
  if (bytes == room) PushRun(runs_.size() - 1);
}

void ProxyLink::Signal(int pe, size_t offset, uint64_t value) {
  uint64_t& last = last_set_[{pe, offset}];
  const uint64_t delta = value - last;  // modulo 2^64: the word ends at `value`
  last = value;
  PushRunsTo(pe);  // the writes before it, first
  proxy::PushAtomicAdd(queue_, pe, block_offset_ + offset, delta);
}

void ProxyLink::Quiet() {
  PushRunsTo(-1);
  proxy::Quiet(queue_);
}

uint64_t ProxyLink::moved_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : proxy_->Stats().bytes_by_path) total += b;
  return total;
}

void ProxyLink::CheckHealth() const { proxy_->CheckHealth(); }

}  // namespace mori::ep
