// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// One NIC port as the proxy's verbs transport drives it: register memory, create RC
// queue pairs, post sends (RDMA WRITE, SEND) and receives, poll one completion queue.
// Two implementations:
//  - OpenRdmaPort: libibverbs (dlopen'ed, verbs_objects.hpp). Compiled and built, but
//    it has NOT run against a NIC: no machine of the project has one.
//  - the loopback test double (src/transport/verbs/loopback_port.hpp), compiled only
//    into the C++ unit tests: QPs of ports in one process, bytes moved by memcpy.
// No <infiniband/verbs.h> here: the values below carry the ibverbs ABI numbers
// (work_request_plan.hpp's WrOpcode, its kWc* statuses).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mori/core/macros.hpp"
#include "mori/transport/verbs/qp_attributes.hpp"
#include "mori/transport/verbs/work_request_plan.hpp"

namespace mori::transport::verbs {

struct MemoryKeys {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// One work request of a send queue: an RDMA WRITE of [local_addr, +length) to
// remote_addr (rkey), or a SEND of it into the peer's next posted receive.
struct SendOp {
  WrOpcode opcode = WrOpcode::kWrite;  // kWrite or kSend
  bool signaled = false;               // produces a completion (else retired by a later one)
  uint64_t wr_id = 0;
  uint64_t local_addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;  // kWrite only
  uint32_t rkey = 0;         // kWrite only
};

// A receive buffer for one SEND.
struct RecvOp {
  uint64_t wr_id = 0;
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

struct WorkCompletion {
  uint64_t wr_id = 0;
  int status = kWcSuccess;  // enum ibv_wc_status
  bool recv = false;        // a receive (a SEND arrived) rather than a send-queue WR
  uint32_t byte_len = 0;    // receives: bytes the SEND carried
};

// A reliable-connected queue pair. Posting is not thread-safe (one thread posts).
class MORI_API RdmaQueuePair {
 public:
  virtual ~RdmaQueuePair();
  // What the peer needs to connect to this QP (exchanged by the caller).
  virtual EndpointInfo LocalEndpoint() const = 0;
  // RESET -> INIT -> RTR -> RTS towards `remote`; throws TransportError or
  // InvalidArgumentError (a bad endpoint) naming the value.
  virtual void Connect(const QpConfig& config, const EndpointInfo& remote) = 0;
  // Posts ops[0, n) in order; returns 0 or the errno of the post (nothing of a failed
  // call may be assumed posted).
  virtual int PostSend(const SendOp* ops, size_t n) = 0;
  virtual int PostRecv(const RecvOp* ops, size_t n) = 0;
  virtual uint32_t send_depth() const = 0;
  virtual uint32_t recv_depth() const = 0;
};

class MORI_API RdmaPort {
 public:
  virtual ~RdmaPort();
  virtual std::string Describe() const = 0;
  // The longest message one WRITE may carry.
  virtual uint64_t max_message_bytes() const = 0;
  // Entries of the completion queue (completions not yet polled beyond this overrun
  // it, which breaks the port): RdmaPortOptions::cq_depth bounded by the device.
  virtual int cq_depth() const = 0;
  // Registers [addr, +length) (host memory, or CUDA memory where the NIC reaches it by
  // GPUDirect) for local access and remote WRITE; kept until the port is destroyed.
  // Throws TransportError naming the range and errno.
  virtual MemoryKeys Register(void* addr, uint64_t length) = 0;
  // An RC QP whose sends and receives complete on the port's one completion queue.
  virtual std::unique_ptr<RdmaQueuePair> CreateQp(uint32_t send_depth, uint32_t recv_depth) = 0;
  // Appends up to `max` completions to out; returns how many (throws TransportError
  // when the completion queue itself fails).
  virtual int Poll(WorkCompletion* out, int max) = 0;
};

struct RdmaPortOptions {
  std::string device;  // "" = nearest to gpu_index (or any); "mlx5_0" or "mlx5_0:1"
  int gid_index = -1;  // -1 = automatic (RoCE v2 IPv4-mapped first)
  int gpu_index = -1;  // locality hint for the automatic choice
  int cq_depth = 4096;
};

// Opens a port through libibverbs. Throws NotSupportedError saying why when it cannot
// (libmori_core built without the verbs headers, no libibverbs, no device, no ACTIVE
// port). Has not run against a NIC.
MORI_API std::unique_ptr<RdmaPort> OpenRdmaPort(const RdmaPortOptions& options);

}  // namespace mori::transport::verbs
