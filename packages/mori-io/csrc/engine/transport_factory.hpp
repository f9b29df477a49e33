// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <array>
#include <functional>
#include <memory>

#include "host/transport.hpp"

namespace mori::io {

class P2pTransport;
class RdmaTransport;
class SameHost;
class ShmTransport;
class TcpTransport;
class TransportHost;
struct P2pBackendConfig;
namespace rdma {
struct RdmaBackendConfig;
}

// The engine's transports, the one place that names every one of them: each is built
// at engine construction (not yet created: the rule names none), registers its control
// messages then, and is created by create_backend through the steps below. SHM and P2P
// share the same-host services (SameHost), built here and handed to both.
class Transports {
 public:
  // `ensure_channel` starts the control channel (with the default TCP config) when it
  // does not run yet: SHM, P2P and RDMA messages ride on it.
  Transports(TransportHost* host, std::function<void()> ensure_channel);
  ~Transports();
  Transports(const Transports&) = delete;
  Transports& operator=(const Transports&) = delete;

  const std::array<Transport*, kTransportSlots>& by_slot() const { return by_slot_; }

  // create_backend's steps past the engine's checks (the transport is not created yet).
  // The local CMA probe, the channel, then SHM may be named by the rule.
  void CreateShm();
  // Throws NotSupportedError where CUDA or a device is missing.
  void CreateP2p(const P2pBackendConfig& config);
  // MORI_IO_RDMA_LOOPBACK=1 substitutes the in-process test double.
  void CreateRdma(const rdma::RdmaBackendConfig& config);

  // For the engine's test hooks.
  ShmTransport& shm() { return *shm_; }
  P2pTransport& p2p() { return *p2p_; }
  SameHost& same_host() { return *same_host_; }

 private:
  TransportHost* host_;
  std::function<void()> ensure_channel_;
  // First: SHM and P2P use it until they are destroyed.
  std::unique_ptr<SameHost> same_host_;
  std::unique_ptr<TcpTransport> tcp_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<P2pTransport> p2p_;
  std::unique_ptr<RdmaTransport> rdma_;
  std::array<Transport*, kTransportSlots> by_slot_{};
};

}  // namespace mori::io
