// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "control/connection.hpp"
#include "host/transport.hpp"
#include "samehost/liveness.hpp"
#include "samehost/shared_host.hpp"
#include "shm/cma_copy.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

class Reactor;
class SameHost;
class TransportHost;

// Same host, host memory on both sides: a plain memcpy into the target's region mapped
// here where it lies in the target's shared host memory, else CMA
// (process_vm_readv/writev) with a grant of the region cached per region (or asked per
// part, MORI_IO_CMA_CACHE=0). Either copy runs on the submitting thread, or for a
// transfer of at least MORI_IO_SHM_SPLIT_BYTES in shares copied at once by it and the
// reactors. Writes are announced to their target through the same-host services SHM
// shares with P2P (samehost/same_host.hpp), whose channel and inbound events SHM relays.
// Initiator side in shm_transport.cpp (routes, mappings, grants) and shm_copy.cpp (the
// copies), target side (grants) in shm_target.cpp.
class ShmTransport : public Transport {
 public:
  ShmTransport(TransportHost* host, SameHost* same_host);
  ~ShmTransport() override;
  BackendType type() const override { return BackendType::kShm; }
  TransportSlot slot() const override { return kShmSlot; }
  bool created() const override { return created_.load(std::memory_order_acquire); }
  // The local CMA probe's result (ProbeBackend(kShm)), at create_backend: it feeds the
  // rule's cma_ok.
  void SetSelfProbe(bool available, const std::string& reason);
  void MarkCreated() { created_.store(true, std::memory_order_release); }
  bool self_probe_ok() const { return self_ok_; }
  const std::string& self_probe_reason() const { return self_reason_; }

  bool CanHandle(const Peer& peer, MemoryLocationType local,
                 MemoryLocationType remote) const override;
  std::shared_ptr<TransferState> Submit(const TransferRequest& req) override;
  BackendChoice Explain(const std::shared_ptr<Peer>& peer, const RemoteRegion& remote,
                        BackendChoice choice) override;
  std::unique_ptr<PeerState> NewPeerState() override;
  void PeerConnecting(Peer& peer, PeerConnections& pc) override;
  void RemoteRegionRevoked(Peer& peer, uint64_t mem_id,
                           const std::shared_ptr<void>& released) override;
  void DrainInbound(const std::string* key) override;
  void ChannelStarting() override;
  void OnControlThread(bool starting) override;
  void ChannelStopped() override;

  // Test hooks. Remote host region `mem_id` of `remote_key`: -1 not asked yet, 0 not
  // shareable (CMA), 1 mapped here (memcpy).
  int MappingState(const std::string& remote_key, uint64_t mem_id);
  // 1: this engine holds a CMA grant of `remote_key`'s memory `mem_id`; 0: none.
  int CmaGrantState(const std::string& remote_key, uint64_t mem_id);
  // How same-host copies learn that `remote_key`'s engine is gone: "word" (its liveness
  // word, a load), "pidfd" (a poll per copy), "" (no grant of it yet).
  std::string Liveness(const std::string& remote_key);
  // Transfers copied in shares by several threads (MORI_IO_SHM_SPLIT_BYTES).
  uint64_t split_copies() const { return split_copies_.load(std::memory_order_relaxed); }
  bool KeepsInitiator(const std::string& key) override;  // it holds a notice ring
  SameHost& same_host() { return *same_host_; }

 private:
  // What this engine keeps of one same-host peer. `mu` guards the regions mapped or
  // granted here and the peer's liveness; the ring state has its own lock; the probe's
  // result is written before the peer's connections are published.
  struct PeerShm : PeerState {
    std::mutex mu;
    // Its host regions mapped here, by its memory id; nullptr: not shareable, CMA moves it.
    std::unordered_map<uint64_t, std::shared_ptr<ShmMapping>> maps;
    // Why each nullptr entry's region is not mapped (backend_for's reason).
    std::unordered_map<uint64_t, std::string> unmapped_why;
    // Its host regions this engine holds a CMA grant for, by its memory id; dropped on
    // its revoke.
    std::unordered_map<uint64_t, std::shared_ptr<CmaRemote>> cma_grants;
    // Regions whose map or CMA grant the target refused at its grant bounds
    // (kTooManyGrants), with when to ask again: meanwhile a grant per part, without a
    // side request per transfer.
    std::unordered_map<uint64_t, int64_t> map_retry_ns, cma_retry_ns;
    // Its liveness (liveness.hpp), opened from the first grant that carried it; every
    // mapping and CMA grant of it holds a reference.
    std::shared_ptr<const TargetLiveness> liveness;
    // The route of host memory when the peer's connections opened, after the CMA probe
    // (run where the rule named SHM then): SHM serves the peer only where it says SHM.
    BackendChoice host_choice{BackendType::kTcp, ""};
    bool probed = false;               // host_choice is SHM
    std::atomic<bool> refused{false};  // a CMA copy met EPERM: TCP from then on
  };
  struct CopyJob;
  // What one copy of a same-host transfer reads, owning nothing: whoever builds it keeps
  // the mapping or grant, the peer and the local region alive while the copy runs.
  struct CopyView {
    CopyView() = default;
    CopyView(const TransferRequest& req, ShmMapping* m, CmaRemote* c);
    ShmMapping* map = nullptr;  // the target's region mapped here (memcpy), or
    CmaRemote* cma = nullptr;   // its CMA grant
    Peer* peer = nullptr;
    char* local_base = nullptr;
    int pid = 0;  // the target's
    uint64_t remote_mem = 0;
    bool write = false;
    bool TargetAlive() const { return map ? map->owner->Alive() : cma->owner->Alive(); }
  };
  PeerShm& StateOf(Peer& peer);
  // Initiator side (shm_transport.cpp).
  // The CMA probe on `conn` (not served yet); "" or why it failed.
  std::string ProbePeer(Conn& conn, const Peer& peer);
  std::shared_ptr<ShmMapping> MappingFor(Peer& peer, const RemoteRegion& remote,
                                         std::string* why_not = nullptr);
  std::shared_ptr<const TargetLiveness> LivenessOf(Peer& peer, int pid, const LivenessGrant& live,
                                                   std::string* error);
  // The target's refusal, if it refused, into *status.
  std::shared_ptr<CmaRemote> CmaRemoteFor(Peer& peer, const RemoteRegion& remote,
                                          StatusDetail* code, std::string* error,
                                          wire::WireStatus* status);
  // The initiator's half of a per-part grant (MORI_IO_CMA_CACHE=0).
  bool OnGrant(Reactor& r, Conn& c, const Pending& p);
  void RegisterInitiatorHandlers();
  // The copies (shm_copy.cpp).
  std::shared_ptr<TransferState> SubmitMapped(const TransferRequest& req,
                                              std::shared_ptr<ShmMapping> remote);
  std::shared_ptr<TransferState> SubmitCma(const TransferRequest& req,
                                           std::shared_ptr<CmaRemote> remote);
  // How many threads copy a transfer of `bytes`: 1 below MORI_IO_SHM_SPLIT_BYTES, else
  // shares of at least half that, at most max_shares_.
  uint32_t SharesFor(uint64_t bytes) const;
  // A mapped (map) or CMA (cma) transfer split into about `shares` shares.
  std::shared_ptr<TransferState> SubmitInShares(const TransferRequest& req,
                                                std::shared_ptr<ShmMapping> map,
                                                std::shared_ptr<CmaRemote> cma, uint64_t bytes,
                                                uint32_t shares);
  void CopyShare(CopyJob& job, const CmaSpan* spans, size_t n);
  // Copies `spans` (memcpy or CMA); SUCCESS, or the failure with *error set.
  StatusDetail CopySpans(const CopyView& v, const CmaSpan* spans, size_t n, std::string* error);
  // A transfer of one share: copied on this thread before the call returns, so it takes
  // no ledger record (no other thread completes it) and its status is made final.
  // `map` or `cma` is the target's region, released before a write is announced.
  std::shared_ptr<TransferState> CopyNow(const TransferRequest& req,
                                         std::shared_ptr<ShmMapping> map,
                                         std::shared_ptr<CmaRemote> cma, uint64_t bytes);
  std::string CopyLost(const CopyView& v);
  std::string PeerGone(Peer& peer, int pid, uint64_t mem_id, bool write);
  // Target side (shm_target.cpp).
  void RegisterTargetHandlers();
  wire::WireStatus MapGrantFor(uint64_t mem_id, uint64_t capability,
                               const std::string& initiator_key, std::string* payload);
  wire::WireStatus CmaGrantFor(uint64_t mem_id, uint64_t capability,
                               const std::string& initiator_key, std::string* payload);

  TransportHost* host_;
  SameHost* same_host_;
  std::atomic<bool> created_{false};
  bool self_ok_ = false;     // the local CMA probe passed at create_backend
  std::string self_reason_;  // its reason
  // The probe's cookie: its address and value go to a peer that asks. Nonzero and
  // unpredictable: a peer that reads it back through CMA has reached this process, not
  // another one that happens to have our pid in its namespace.
  uint64_t cookie_ = 0;
  size_t conn_slot_ = 0;  // Conn::ext slot of the per-part grants a target holds
  // Threads that may copy one transfer at once: the submitting thread and each reactor,
  // no more than the CPUs this process may run on (set as the reactors start).
  std::atomic<uint32_t> max_shares_{1};
  std::atomic<uint64_t> split_copies_{0};
};

}  // namespace mori::io
