// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mori/core/macros.hpp"

namespace mori::bootstrap {

// Collective exchange of byte blobs among the processes of a group. It carries
// control data only (handles, addresses, sizes), so it favours simplicity over
// bandwidth. Every rank of the group must make the same sequence of calls.
// Implementations: TcpBootstrap (native, torchrun's environment or explicit
// address) and, in Python, one over a torch.distributed ProcessGroup.
class MORI_API Bootstrap {
 public:
  virtual ~Bootstrap();

  virtual int Rank() const = 0;
  virtual int WorldSize() const = 0;

  // Gathers `nbytes` from every rank into `recv` (WorldSize() * nbytes bytes,
  // rank r's block at offset r * nbytes). Every rank passes the same nbytes.
  virtual void AllGather(const void* send, size_t nbytes, void* recv) = 0;

  // Copies root's `nbytes` at `buf` into `buf` on every other rank.
  virtual void Broadcast(void* buf, size_t nbytes, int root) = 0;

  // Returns once every rank has entered it.
  virtual void Barrier() = 0;
};

// All-gather of blobs whose sizes differ between ranks: one AllGather of the
// sizes, one of the blobs padded to the largest. Element r is rank r's blob.
MORI_API std::vector<std::vector<uint8_t>> AllGatherBytes(Bootstrap& bootstrap,
                                                          const std::vector<uint8_t>& mine);

// Broadcast of a blob whose size only root knows. Non-root ranks pass anything.
MORI_API std::vector<uint8_t> BroadcastBytes(Bootstrap& bootstrap, const std::vector<uint8_t>& blob,
                                             int root);

struct TcpBootstrapOptions {
  int rank = 0;
  int world_size = 1;
  // Address and port that rank 0 listens on and the other ranks connect to.
  std::string host = "127.0.0.1";
  int port = 0;
  // Bounds every wait: connect, accept, each collective.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// Star-shaped rendezvous over TCP through rank 0. Rank 0 must be constructed
// with a listening address that the others can reach; with port 0 it binds an
// ephemeral port, which Port() reports (it is then the caller's job to pass it on).
class MORI_API TcpBootstrap final : public Bootstrap {
 public:
  explicit TcpBootstrap(const TcpBootstrapOptions& options);
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  // Reads torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. The port is
  // MORI_BOOTSTRAP_PORT when set, else MASTER_PORT + 1 (MASTER_PORT itself is
  // torch's TCPStore). MORI_BOOTSTRAP_TIMEOUT_S overrides the timeout.
  static TcpBootstrapOptions OptionsFromEnv();

  int Rank() const override;
  int WorldSize() const override;
  int Port() const;
  void AllGather(const void* send, size_t nbytes, void* recv) override;
  void Broadcast(void* buf, size_t nbytes, int root) override;
  void Barrier() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mori::bootstrap
