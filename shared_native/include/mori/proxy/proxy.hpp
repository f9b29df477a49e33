// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// A proxy thread per process (per GPU) that drains command queues and moves the
// bytes with a transport per peer pe. Producers are CPU threads (host heaps, the CPU
// implementations of the protocols) or kernels (CUDA heaps). docs/design.md
// ("Proxy") has the design; mori/proxy/command.hpp the command format and ordering.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mori/bootstrap/bootstrap.hpp"
#include "mori/core/macros.hpp"
#include "mori/proxy/command.hpp"
#include "mori/proxy/queue.hpp"

namespace mori::proxy {

// How commands to another pe travel.
enum class Path : int {
  kMapped = 0,  // the pe's heap is mapped here (same shmem local group, self included):
                // copies and atomics through the mapping
  kCma = 1,     // same host, another local group, host heaps: writes with
                // process_vm_writev, adds/fences/notifies over the pair's TCP stream
  kTcp = 2,     // everything over the pair's TCP stream (CUDA memory staged)
  kVerbs = 3,   // ibverbs RDMA over the pair's RC queue pair (writes by RDMA WRITE from
                // and into the registered heap; adds, fences and notifies as SENDs on
                // the same QP). Tested with a loopback double only: NOT run on a NIC.
};
MORI_API const char* PathName(Path path) noexcept;

enum class TransportChoice : int {
  kAuto = 0,   // kMapped within the local group; kCma for other groups on this host when
               // the kernel permits it (probed), else kTcp
  kTcp = 1,    // kTcp for every pe outside the local group (kMapped inside it)
  kVerbs = 2,  // kVerbs for every pe outside the local group (kMapped inside it); every
               // pe must choose it, and every pe must open an RDMA port, or construction
               // fails on all of them naming the pe and why
};

struct ProxyOptions {
  int num_queues = 1;
  // Slots per queue; 0 means MORI_PROXY_QUEUE_CAPACITY or 1024.
  uint64_t queue_capacity = 0;
  Producer producer = Producer::kHost;
  // kAuto means MORI_PROXY_TRANSPORT (auto|tcp|verbs) or auto.
  TransportChoice transport = TransportChoice::kAuto;
  // The address other hosts reach this process at; "" means MORI_PROXY_HOST, else
  // this host's name. Pes on the same host connect over 127.0.0.1.
  std::string advertise_host;
  // Bounds connection setup, every producer wait and the silence of a peer.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

struct ProxyStats {
  uint64_t commands = 0;                // popped, all queues
  std::vector<uint64_t> bytes_to_pe;    // write bytes posted, per destination pe
  std::vector<uint64_t> bytes_by_path;  // per Path
  uint64_t lane_waits = 0;              // CUDA heaps: waits for the proxy's own streams
};

// Collective over `bootstrap`, whose ranks must be mori::shmem's pes (shmem
// initialized on this process). Creates the queues, connects every pair of pes that
// needs a stream (all-gather of listen addresses; every wait bounded by
// options.timeout) and starts the proxy thread (and the TCP receiver thread).
//
// Errors: a peer whose connection closes or stays silent past the timeout, or that
// sends a bad command, fails the proxy: every queue's health becomes kFailed with a
// message naming the pe, its node and the stage, and every producer wait (Push on a
// full queue, Quiet, Barrier, CheckHealth) throws it (kernels trap with it).
class MORI_API Proxy {
 public:
  Proxy(std::shared_ptr<bootstrap::Bootstrap> bootstrap, const ProxyOptions& options);
  // Stops the threads. Without Close(), peers see this process's connections drop.
  // Destroy (or Close) a proxy before mori::shmem::Finalize: its threads use the heap.
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Collective: a proxy barrier over queue 0 (so every command pushed before it, on
  // every pe, has landed), then an orderly shutdown. Producers must have stopped.
  void Close();

  int num_queues() const;
  int my_pe() const;
  int n_pes() const;
  // For CPU producers (Producer::kHost).
  QueueView HostQueue(int queue) const;
  // For kernels (Producer::kCuda).
  QueueView DeviceQueue(int queue) const;
  // Host-side wait until the commands of `queue` with index < upto retired, for either
  // producer kind (a host thread waiting on what a kernel pushed).
  void WaitRetired(int queue, uint64_t upto) const;
  Path PathTo(int pe) const;
  // The node key of pe (hostname/boot_id, or "env:<MORI_SHMEM_NODE_ID>").
  std::string NodeOf(int pe) const;
  // Throws the proxy's error (TransportError, naming the lost pe and its node) if it
  // failed; pushing into a closed proxy's queues throws InvalidStateError.
  void CheckHealth() const;
  ProxyStats Stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mori::proxy
