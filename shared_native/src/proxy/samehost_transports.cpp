// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "samehost_transports.hpp"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "mori/core/error.hpp"
#include "mori/shmem/shmem.hpp"
#include "mori/transport/socket.hpp"

namespace mori::proxy::internal {

MappedTransport::MappedTransport(const HeapAccess* heap, TcpTransport* control)
    : heap_(heap), control_(control), bases_(heap->n_pes(), nullptr) {
  for (int pe = 0; pe < heap_->n_pes(); ++pe) {
    bases_[pe] = static_cast<char*>(shmem::Ptr(heap_->my_base(), pe));
  }
  // CUDA heaps: the TCP sender's lane (both are used by the proxy thread only).
  lane_ = control_->sender_lane();
}

void MappedTransport::PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) {
  if (nbytes == 0) return;
  if (lane_) {
    // Enqueued on the lane, waited for once per proxy round (Poll), before the source
    // may be reused; an add behind it, and a TCP write staged from its range, run
    // after it on the same stream.
    lane_->Copy(bases_[pe] + dst_offset, heap_->my_base() + src_offset, nbytes);
  } else {
    std::memmove(bases_[pe] + dst_offset, heap_->my_base() + src_offset, nbytes);
  }
}

void MappedTransport::PostAtomicAdd(int pe, uint64_t offset, uint64_t value) {
  if (lane_) {
    lane_->Add(reinterpret_cast<uint64_t*>(bases_[pe] + offset), value);
  } else {
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(bases_[pe] + offset), value, __ATOMIC_RELEASE);
  }
}

void MappedTransport::PostFence(int pe, uint64_t token) {
  // Host heaps: every write and add above completed before its call returned; CUDA
  // heaps: the adds enqueued on the lane complete here.
  if (lane_) lane_->Sync();
  acks_.push_back(Completion{Completion::Kind::kFenceAck, pe, token});
}

void MappedTransport::PostNotify(int pe, uint64_t value) {
  // A barrier's notify: what this pe posted to pe before it has landed.
  if (lane_) lane_->Sync();
  control_->PostNotify(pe, value);
}

void MappedTransport::Poll(std::vector<Completion>* out) {
  // The round's copies completed: their sources may be reused (transport.hpp). Adds
  // alone need no wait (a fence, notify or barrier waits for them); the TCP sender's
  // Flush may have waited already.
  if (lane_ && lane_->copied()) lane_->Sync();
  out->insert(out->end(), acks_.begin(), acks_.end());
  acks_.clear();
}

CmaTransport::CmaTransport(const HeapAccess* heap, TcpTransport* control)
    : heap_(heap), control_(control) {}

bool CmaTransport::Probe(const HeapAccess& heap, int pe, std::string* why) {
  const PeerInfo& p = heap.peers()[pe];
  uint64_t word = 0;
  iovec local{&word, sizeof(word)};
  iovec remote{reinterpret_cast<void*>(p.heap_base), sizeof(word)};
  if (::process_vm_readv(static_cast<pid_t>(p.pid), &local, 1, &remote, 1, 0) ==
      static_cast<ssize_t>(sizeof(word))) {
    return true;
  }
  *why = StrCat("process_vm_readv of pid ", p.pid, ": ", transport::ErrnoText(errno));
  return false;
}

void CmaTransport::PostWrite(int pe, uint64_t dst_offset, uint64_t src_offset, uint64_t nbytes) {
  const PeerInfo& p = heap_->peers()[pe];
  char* src = heap_->my_base() + src_offset;
  uint64_t remote_addr = p.heap_base + dst_offset;
  while (nbytes > 0) {
    iovec local{src, nbytes};
    iovec remote{reinterpret_cast<void*>(remote_addr), nbytes};
    ssize_t n = ::process_vm_writev(static_cast<pid_t>(p.pid), &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      MORI_THROW(TransportError, heap_->Self(), ": ", heap_->PeName(pe),
                 " lost while writing into its heap (process_vm_writev of pid ", p.pid, ", ",
                 nbytes, " bytes at offset ", dst_offset,
                 "): ", n == 0 ? std::string("nothing written") : transport::ErrnoText(err),
                 err == ESRCH ? " (the process exited)" : "");
    }
    src += n;
    remote_addr += static_cast<uint64_t>(n);
    dst_offset += static_cast<uint64_t>(n);
    nbytes -= static_cast<uint64_t>(n);
  }
}

void CmaTransport::PostAtomicAdd(int pe, uint64_t offset, uint64_t value) {
  control_->PostAtomicAdd(pe, offset, value);
}

void CmaTransport::PostFence(int pe, uint64_t token) { control_->PostFence(pe, token); }

void CmaTransport::PostNotify(int pe, uint64_t value) { control_->PostNotify(pe, value); }

}  // namespace mori::proxy::internal
