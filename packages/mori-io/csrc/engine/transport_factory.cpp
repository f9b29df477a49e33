// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "engine/transport_factory.hpp"

#include "engine/backend_probe.hpp"
#include "host/transport_host.hpp"
#include "p2p/p2p_backend.hpp"
#include "p2p/p2p_transport.hpp"
#include "rdma/rdma_backend.hpp"
#include "rdma/rdma_transport.hpp"
#include "samehost/same_host.hpp"
#include "shm/shm_transport.hpp"
#include "tcp/tcp_transport.hpp"

namespace mori::io {

Transports::Transports(TransportHost* host, std::function<void()> ensure_channel)
    : host_(host), ensure_channel_(std::move(ensure_channel)) {
  same_host_ = std::make_unique<SameHost>(host);
  tcp_ = std::make_unique<TcpTransport>(host);
  shm_ = std::make_unique<ShmTransport>(host, same_host_.get());
  p2p_ = std::make_unique<P2pTransport>(host, same_host_.get());
  rdma_ = std::make_unique<RdmaTransport>(host);
  by_slot_ = {tcp_.get(), shm_.get(), p2p_.get(), rdma_.get()};
}

Transports::~Transports() = default;

void Transports::CreateShm() {
  BackendAvailability a = ProbeBackend(BackendType::kShm);
  shm_->SetSelfProbe(a.available, a.reason);
  ensure_channel_();
  shm_->MarkCreated();
}

void Transports::CreateP2p(const P2pBackendConfig& config) {
  auto backend = std::make_unique<P2pBackend>(config);  // throws where CUDA is missing
  ensure_channel_();
  p2p_->Adopt(std::move(backend));
}

void Transports::CreateRdma(const rdma::RdmaBackendConfig& config) {
  // NotSupportedError where RDMA cannot run (a test build may substitute its double).
  std::unique_ptr<rdma::RdmaBackend> backend = rdma::RdmaBackend::Create(config);
  ensure_channel_();
  rdma_->Adopt(std::move(backend));
}

}  // namespace mori::io
