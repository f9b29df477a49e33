// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The proxy's TCP transport: one stream per ordered pair of pes (the sender's proxy
// thread writes frames, the receiver's thread applies them in order and answers
// fences on the same socket), so everything posted to a pe lands in posting order.

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device_lane.hpp"
#include "heap_access.hpp"
#include "mori/bootstrap/bootstrap.hpp"
#include "mori/proxy/transport.hpp"

namespace mori::proxy::internal {

struct TcpOptions {
  int timeout_ms = 120000;  // connect/accept, each send/receive's progress
  uint64_t session = 0;     // drawn by pe 0: a hello of another job is refused
  size_t staging_bytes = 4 << 20;
};

class TcpTransport final : public Transport {
 public:
  // Opens the listener (its port goes into this pe's PeerInfo before the exchange).
  TcpTransport(const HeapAccess* heap, const TcpOptions& options);
  ~TcpTransport() override;

  uint16_t port() const { return port_; }
  // Collective: connects to every other pe (heap->peers() filled in), accepts every
  // other pe's stream, starts the receiver thread.
  void Connect(bootstrap::Bootstrap& bootstrap);

  const char* Name() const override { return "tcp"; }
  void PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) override;
  void PostAtomicAdd(int pe, uint64_t offset, uint64_t value) override;
  void PostFence(int pe, uint64_t token) override;
  void PostNotify(int pe, uint64_t value) override;
  void Poll(std::vector<Completion>* out) override;
  void Shutdown() override;
  // CUDA heaps: the proxy thread's lane (the sender's), which MappedTransport shares:
  // one stream, so a mapped write and a later staged write reading its range run in
  // posting order, and one wait per round covers both; nullptr on host heaps.
  DeviceLane* sender_lane() const { return send_lane_.get(); }
  // CUDA heaps: how often the proxy thread's and the receiver's lanes were waited for.
  uint64_t LaneWaits() const {
    return (send_lane_ ? send_lane_->waits() : 0) + (recv_lane_ ? recv_lane_->waits() : 0);
  }

 private:
  struct Frame;
  // Appends the frame (and a small payload) to pe's send buffer; a large payload is
  // sent at once after the buffer. Poll flushes every buffer, so frames leave in
  // batches (one send per peer per proxy round) and in posting order.
  void SendFrame(int pe, const Frame& f, const void* payload, uint64_t nbytes);
  void SendRaw(int pe, const char* data, uint64_t nbytes);
  // The send buffer and a payload in one sendmsg (the buffer is emptied).
  void SendWithPayload(int pe, const char* payload, uint64_t nbytes);
  // Sends the pieces in order (sendmsg, at most IOV_MAX at a time); modifies iov.
  void SendVec(int pe, iovec* iov, size_t count);
  // Sends pe's buffer; CUDA heaps: with its staged payloads, after one wait for the
  // sender lane's copies (a later Flush of another pe in the same round waits no more).
  void Flush(int pe);
  void FlushAll();
  void ReceiverLoop();
  // Reads and applies one frame from pe's inbound stream; false when the stream ended
  // or failed (the error is set).
  bool ApplyOne(int pe);
  bool ApplyFrame(int pe);
  // Inbound bytes are read in large pieces into a per-pe buffer and frames parsed from
  // it (one recv for many small frames); a large payload's rest is received straight
  // into its destination. Fill: one non-blocking recv into the buffer's free space
  // (bytes read, 0 when none is waiting, -1 at EOF or an error: errno kept).
  ssize_t Fill(int pe);
  // Waits (bounded) until the buffer holds `n` bytes (n <= its capacity).
  bool Need(int pe, size_t n, std::string* error);
  // The next `n` bytes of pe's stream into `dst`: the buffered ones first.
  bool ReadInto(int pe, char* dst, uint64_t n, std::string* error);
  size_t Buffered(int pe) const { return in_buf_[pe].tail - in_buf_[pe].head; }
  // CUDA heaps: waits until the writes and adds applied so far are in the heap (the
  // receiver's staging buffer is free again).
  void SettleInbound();
  // CUDA heaps: enqueues the receiver's pending copy (staging -> heap) on its lane.
  void IssueInbound();
  void ReadAcks(int pe, std::vector<Completion>* out);
  void SetError(const std::string& why);
  [[noreturn]] void ThrowError();
  std::string Lost(int pe, const std::string& stage, const std::string& detail) const;

  const HeapAccess* heap_;
  TcpOptions options_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::vector<int> out_fds_;  // per pe: this pe's stream to it
  std::vector<int> in_fds_;   // per pe: its stream to this pe
  int wake_fds_[2] = {-1, -1};
  std::thread receiver_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> failed_{false};
  std::vector<std::unique_ptr<std::atomic<bool>>> bye_from_;  // per pe
  std::mutex mu_;                                             // guards error_ and notices_
  std::string error_;
  std::vector<Completion> notices_;         // from the receiver thread
  std::vector<std::vector<char>> out_buf_;  // per pe: frames not sent yet
  struct InBuf {
    std::vector<char> data;
    size_t head = 0, tail = 0;  // unread bytes: [head, tail)
  };
  std::vector<InBuf> in_buf_;  // per pe, the receiver thread's only
  // CUDA heaps: the proxy thread stages outgoing payloads through send_lane_, the
  // receiver thread applies incoming writes and adds through recv_lane_ (each its own
  // non-blocking stream and pinned staging buffer: device_lane.hpp).
  std::unique_ptr<DeviceLane> send_lane_, recv_lane_;
  // Sender, CUDA heaps: a write's payload is copied (enqueued, not waited for) into its
  // own region of the sender's staging buffer and sent with pe's buffer at its Flush:
  // piece {buf_end, at, len} goes out after out_buf_[pe][0, buf_end) and before the
  // rest. Regions are handed out from send_used_ and reused only once every piece has
  // been sent (staged_count_ back at 0).
  struct StagedPiece {
    size_t buf_end, at, len;
  };
  std::vector<std::vector<StagedPiece>> staged_;  // per pe
  size_t staged_count_ = 0;
  size_t send_used_ = 0;
  std::vector<iovec> iov_;  // Flush's scratch
  // Receiver, CUDA heaps: payloads are read into successive regions of the receiver's
  // staging buffer (from recv_used_; reused after SettleInbound) and copied to the heap
  // asynchronously; consecutive writes contiguous in the heap become one copy (pending_).
  size_t recv_used_ = 0;
  struct PendingCopy {
    char* dst = nullptr;
    size_t at = 0, len = 0;
  } pending_;
  uint64_t fences_outstanding_ = 0;
  uint64_t polls_ = 0;
};

}  // namespace mori::proxy::internal
