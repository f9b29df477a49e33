// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "control/log_throttle.hpp"
#include "registry/peer_registry.hpp"
#include "samehost/liveness.hpp"
#include "samehost/shared_host.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

struct Conn;
class TransportHost;

// What the same-host transports (SHM and P2P) share, built once per engine by the
// transport factory and handed to both: the liveness page whose word a same-host
// initiator loads to learn that this engine is gone (liveness.hpp), and the notice
// rings through which same-host writes, which move no message the target would see,
// are announced to their target (notice_ring.hpp), else sent as a kP2pWriteDone.
class SameHost {
 public:
  explicit SameHost(TransportHost* host);
  ~SameHost();
  SameHost(const SameHost&) = delete;
  SameHost& operator=(const SameHost&) = delete;

  // The control channel's reactors are about to start; the first one's thread started
  // (`starting`) or is about to end; they were all stopped and joined.
  void ChannelStarting();
  void OnControlThread(bool starting);
  void ChannelStopped();

  // Target side. The liveness page's grant for a same-host initiator, or an empty grant
  // when this engine has none (its initiators poll its pidfd instead).
  void GrantLiveness(LivenessGrant* live) const;
  // Announcements kept in the rings granted (from `key`, or all when null) are recorded
  // in the inbound statuses now.
  void DrainInbound(const std::string* key);
  // Initiator `key` holds a ring of ours (its connections are not closed as idle).
  bool KeepsInitiator(const std::string& key);
  // Rings this engine granted (one per initiator engine).
  size_t notice_rings_granted();

  // Initiator side. Announces a completed same-host write (SHM or P2P) to its target:
  // through the ring the target granted for this engine's announcements when it has
  // room, else as a kP2pWriteDone on `conn` (sent by its reactor). Dropped if the
  // connection is gone, as the transfer itself already succeeded.
  void AnnounceWrite(Peer& peer, const std::shared_ptr<Conn>& conn, uint64_t uid, uint64_t mem_id,
                     uint64_t bytes);
  // The same, choosing a connection of `conns` only when the ring has no room.
  void AnnounceWrite(Peer& peer, const PeerConnections& conns, uint64_t uid, uint64_t mem_id,
                     uint64_t bytes);
  // The ring `peer` granted for our announcements, asked for once; null: over TCP. The
  // reference stays valid while `peer` lives (decided once, never replaced).
  const std::shared_ptr<ShmMapping>& NoticeRingOf(Peer& peer);
  // Test hook. 1: announcements to `remote_key` go through its ring; 0: not asked yet;
  // -1: TCP.
  int NoticeRingState(const std::string& remote_key);

 private:
  struct GrantedRing {
    uintptr_t addr = 0;  // AllocateSharedHost'd
    uint32_t capacity = 0;
    uint64_t head = 0;  // the consumer's position: ours, not in shared memory
  };
  void RegisterHandlers();
  // An announcement into `peer`'s ring; false when there is none or it has no room.
  bool PushNotice(Peer& peer, uint64_t uid, uint64_t mem_id, uint64_t bytes);
  static void PostNotice(Conn& conn, uint64_t uid, uint64_t mem_id, uint64_t bytes);
  wire::WireStatus NoticeRingFor(const std::string& initiator_key, std::string* payload);
  void RefuseAnnouncements(const std::string& key, uint64_t mem_id, size_t n);
  void DrainNoticesLocked(const std::string& key, GrantedRing& ring);  // notice_mu_ held
  void FreeNoticeRings();

  TransportHost* host_;
  // Held by the first reactor while it runs; freed after the reactors are joined.
  std::unique_ptr<LivenessPage> liveness_;
  // Rings granted to same-host initiators for their write announcements, by their key;
  // drained into the inbound statuses when the application asks for them.
  std::mutex notice_mu_;
  std::unordered_map<std::string, GrantedRing> notice_rings_;
  // A ring refused is a warning an initiator can repeat per request: one a second per
  // cause, with the count of the rest.
  LogThrottle ring_alloc_failed_log_;
  LogThrottle ring_cap_log_;
};

}  // namespace mori::io
