// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstddef>
#include <cstdint>

namespace mori::io::wire {

// Every message on an engine-to-engine TCP connection starts with this header, in the
// host byte order of both ends (mori-io peers are little-endian: x86-64, aarch64).
// Requests flow initiator -> target on a connection the initiator opened; the target
// answers each request on the same connection, in order, so the initiator matches a
// response to the oldest request it still waits for and never trusts an address the
// peer sends.
enum class MsgType : uint8_t {
  kHello = 1,     // payload: the target's secret (kSecretBytes, from its EngineDesc),
                  // then the initiator's engine key (num_parts: its length), then the
                  // initiator's credential (kSecretBytes, secret.hpp); a wrong secret, or
                  // a credential that does not prove the key, closes the connection.
                  // num_parts 0: no credential (refused for keys registered there)
  kWrite = 2,     // payload: length bytes to place at (mem_id, offset) of the target
  kRead = 3,      // no payload; the target answers kReadData
  kWriteAck = 4,  // no payload; status says whether the bytes are in place
  kReadData = 5,  // payload: length bytes when status is kOk, none otherwise
  // SHM (same host, CMA): the control messages travel here, the bytes do not. The
  // target checks each request against its registry and grants the address; the
  // initiator copies with process_vm_readv/writev into or out of the target.
  kShmProbe = 6,       // no payload; answered kShmProbeAck
  kShmProbeAck = 7,    // mem_id: the target's pid, offset: address of a cookie whose
                       // value is uid (the initiator reads it to prove CMA reaches it)
  kShmWriteReq = 8,    // like kWrite without payload; answered kShmGrant
  kShmReadReq = 9,     // like kRead; answered kShmGrant
  kShmGrant = 10,      // status; offset: absolute address of the granted range
  kShmWriteDone = 11,  // the initiator copied a granted write (status kOk) or failed to
                       // (kCopyFailed); the target accounts the part, answers kShmDoneAck
  kShmDoneAck = 12,
  // P2P (same host, GPU memory, CUDA IPC): the initiator asks once per remote region,
  // on a short-lived connection, for the region's export and maps it; its GPU then
  // copies with no message per transfer. A completed write is announced afterwards.
  kP2pOpenReq = 13,    // mem_id; answered kP2pGrant
  kP2pGrant = 14,      // status; payload: the packed P2pExport (kOk) or the refusal's text
  kP2pWriteDone = 15,  // the bytes of transfer uid are in place in mem_id (P2P and mapped
                       // SHM writes); not answered: the target records the inbound status
  kP2pDoneAck = 16,    // unused since version 4 (kP2pWriteDone was answered before)
  // RDMA: connecting QPs and learning a region's rkey, on a short-lived connection
  // (like kP2pOpenReq); the bytes then move by one-sided verbs, the notifications by
  // WRITE_WITH_IMM.
  kRdmaConnect = 17,     // payload: the initiator's endpoints; answered kRdmaConnectAck
  kRdmaConnectAck = 18,  // status; payload: the target's endpoints (kOk) or the refusal
  kRdmaRegionReq = 19,   // mem_id; answered kRdmaRegionKey
  kRdmaRegionKey = 20,   // status; payload: the region's key blob (kOk) or the refusal
  // P2P deregistration: the target asks each initiator it granted the region to let go
  // of its mapping, on that initiator's connection (target -> initiator, the one
  // message in that direction that answers no request); the initiator answers
  // kP2pRevokeAck (not answered) once its last copy using the mapping ended and it is
  // unmapped.
  kP2pRevoke = 21,     // mem_id
  kP2pRevokeAck = 22,  // mem_id
  kShmReadDone = 23,   // the initiator's CMA read of its oldest granted read ended (copied
                       // or failed); not answered. The target held the region until then.
  // SHM over shared host memory: a region inside a memfd allocation of the target
  // (allocate_shared_host_memory) is mapped by the initiator once, on a short-lived
  // connection like kP2pOpenReq, and copied with memcpy; revoked like P2P grants.
  kShmMapReq = 24,    // mem_id; answered kShmMapGrant
  kShmMapGrant = 25,  // status (kNotShareable: use CMA); payload: ShmMapGrant (48 bytes)
  // Write announcements through shared memory (notice_ring.hpp): the initiator asks once
  // per target engine of its host, on a short-lived connection; the target allocates a
  // ring for it in shared host memory and grants it like a region. kP2pWriteDone stays
  // the fallback (ring full, or not granted).
  kNoticeRingReq = 26,    // answered kNoticeRingGrant
  kNoticeRingGrant = 27,  // status (kNotShareable: none); payload: ShmMapGrant of the ring
  // A transfer of more than one part is checked whole before any of its bytes move: on
  // each connection that carries parts of it, this precedes the first of them (the parts
  // of one transfer are contiguous on a connection). The target checks [offset,
  // offset+length) of mem_id against its registry; if it is refused, every part of uid
  // on this connection is refused with that status and none lands. A part of a
  // multi-part transfer without it is a protocol violation. Not answered.
  kTransferExtent = 28,  // uid, num_parts, mem_id; offset/length: the lowest offset and
                         // the span up to the highest end of all the transfer's spans
  // SHM over CMA with a cached grant: the initiator asks once per region, on a
  // short-lived connection like kShmMapReq, for the region's absolute address and size
  // (checked against the registry here); it then checks every transfer against that
  // grant and calls process_vm_writev/readv itself, announcing writes like mapped ones.
  // Revoked like P2P grants (kP2pRevoke) when the region is deregistered.
  kShmCmaReq = 29,    // mem_id; answered kShmCmaGrant
  kShmCmaGrant = 30,  // status; payload: CmaGrant (40 bytes)
  // The target is about to close this connection: it carried nothing for idle_timeout_ms,
  // or its hello held the target's secret but may not speak for its key now (another
  // credential holds it, or the key is registered there with another EngineDesc)
  // (target -> initiator, answers nothing). The initiator connects again on its next
  // transfer instead of taking the close for a lost peer.
  kIdleClose = 31,
};

enum class WireStatus : uint8_t {
  kOk = 0,
  kUnknownMemory = 1,  // mem_id not registered with the target (or deregistered)
  kOutOfBounds = 2,    // [offset, offset+length) not inside the registered region
  kNotHostMemory = 3,  // GPU memory this path cannot move: SHM (CMA, shared mappings) moves
                       // host memory only; TCP stages GPU memory through pinned buffers
                       // (gpu_staging.hpp) but refuses where this build has no CUDA or no
                       // visible GPU, or a part exceeds kMaxStagedPart
  kNoShm = 4,          // an SHM request to an engine without the SHM backend
  kCopyFailed = 5,     // kShmWriteDone: the initiator's CMA copy failed
  kNoP2p = 6,          // a P2P request to an engine without the P2P backend
  kNotGpuMemory = 7,   // kP2pOpenReq for host memory
  kExportFailed = 8,   // the region could not be exported (the payload says why)
  kNoRdma = 9,         // an RDMA request to an engine without the RDMA backend
  kNotShareable = 10,  // kShmMapReq for a region outside shared host memory (use CMA)
  // A region grant past the target's bounds (MORI_IO_MAX_GRANT_HOLDERS, MORI_IO_MAX_GRANTS);
  // a peer that predates it reads "unknown status".
  kTooManyGrants = 11,
};

inline constexpr uint16_t kVersion = 10;  // 2: kShm*; 3: kP2p*, kRdma*; 4: kP2pWriteDone
                                          // unanswered; 5: kNoticeRing*; 6: kTransferExtent;
                                          // 7: the hello carries the target's secret;
                                          // 8: grants carry the liveness page, kShmCma*;
                                          // 9: the hello carries the initiator credential;
                                          // 10: the header carries the region capability,
                                          // kIdleClose

// The per-engine secret an initiator learns from the target's EngineDesc and presents
// in its hello: whoever connects without having been given the descriptor is refused.
inline constexpr size_t kSecretBytes = 16;

struct Header {
  uint8_t type;
  uint8_t status;
  uint16_t version;
  uint32_t num_parts;  // parts of the whole transfer (target counts them per uid)
  uint64_t uid;        // the initiator's transfer uid
  uint64_t mem_id;     // the target's memory id
  uint64_t offset;     // into that memory
  uint64_t length;     // bytes
  // The capability of mem_id (its MemoryDesc's, drawn at registration): every request
  // that names a region (kWrite, kRead, kTransferExtent, kShm*Req, kP2pOpenReq,
  // kRdmaRegionReq) must carry it, or the target answers kUnknownMemory as for an id it
  // never registered. 0 in messages that name no region.
  uint64_t capability;
};
static_assert(sizeof(Header) == 48, "wire header layout");

}  // namespace mori::io::wire
