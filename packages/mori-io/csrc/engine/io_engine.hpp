// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/backend_select.hpp"
#include "engine/submission_ledger.hpp"
#include "engine/transfer_state.hpp"
#include "p2p/p2p_backend.hpp"
#include "rdma/rdma_backend.hpp"
#include "shm/cma_copy.hpp"
#include "shm/liveness.hpp"
#include "shm/shared_host.hpp"
#include "wire/wire_protocol.hpp"

namespace mori::io {

struct TcpBackendConfig {
  int num_worker_threads = 1;  // epoll reactors
  int qp_per_transfer = 2;     // TCP connections per remote engine
  bool enable_chunking = true;
  uint64_t chunk_size = 1 << 20;  // bytes per part when chunking
  int peer_timeout_ms = 5000;     // connect timeout and TCP_USER_TIMEOUT
  // SO_SNDBUF/SO_RCVBUF; 0 leaves the kernel's autotuning (setting them switches it
  // off; 4 MiB measured within the noise of autotuning on loopback, BENCHMARKS.md).
  int sock_buf_bytes = 0;
  // A connection with requests outstanding that neither sends nor receives a byte for
  // this long is declared stuck (a live but hung peer): it is closed, its transfers
  // fail with ERR_TIMEOUT and the peer stays failed until registered again.
  int transfer_timeout_ms = 5000;
  // Inbound statuses kept for pop_inbound_transfer_status; beyond it the oldest is
  // dropped (debug log), so a target whose application never pops stays bounded.
  uint64_t max_inbound_statuses = 1 << 16;
  // MORI's switch: false keeps no inbound statuses at all (pop_inbound_transfer_status
  // finds none), for targets that learn of completion another way.
  bool enable_notification = true;
};

// Who still uses a registered region. Deregistration sets `withdrawn` and then reads
// `inflight`; a user adds to `inflight` and then reads `withdrawn` (both seq_cst), so
// either deregistration sees the use and refuses, or the user sees the withdrawal and
// backs off: no byte moves into or out of a region after its deregistration returned.
struct RegionUse {
  std::atomic<uint64_t> inflight{0};  // local transfers + inbound writes mid-payload
  std::atomic<bool> withdrawn{false};
  // True if the caller may touch the region (and must call Leave after).
  bool Enter() noexcept {
    inflight.fetch_add(1, std::memory_order_seq_cst);
    if (!withdrawn.load(std::memory_order_seq_cst)) return true;
    inflight.fetch_sub(1, std::memory_order_release);
    return false;
  }
  void Leave() noexcept { inflight.fetch_sub(1, std::memory_order_release); }
};

struct MemoryRegion {
  uint64_t id;
  uintptr_t addr;
  uint64_t size;
  int device_id;
  MemoryLocationType loc;
  // Shared by the registry and every copy of the region (sessions, reactor caches);
  // the registry drops its reference only once no transfer uses the region.
  std::shared_ptr<RegionUse> use;
};

// Ablation switches, read once per engine from the environment.
struct HotPathOptions {
  bool lockfree_endpoint = true;      // MORI_IO_LOCKFREE_ENDPOINT=0: connections under a mutex
  bool epoch_snapshot = true;         // MORI_IO_EPOCH_SNAPSHOT=0: sessions look the peer up per op
  bool ledger_ring = true;            // MORI_IO_LEDGER=map: hash map records
  bool shm_map = true;                // MORI_IO_SHM_MAP=0: SHM always copies with CMA, even for
                                      // regions in the target's shared host memory
  bool target_batching = true;        // MORI_IO_TARGET_BATCHING=0: the target looks the region
                                      // up and records inbound parts under a lock per part
  bool notice_ring = true;            // MORI_IO_NOTICE_RING=0: same-host write announcements
                                      // go over TCP instead of a shared-memory ring
  uint32_t notice_ring_slots = 4096;  // MORI_IO_NOTICE_RING_SLOTS: slots of the rings this
                                      // engine grants (a power of two; 0: grants none)
  uint32_t max_notice_rings = 256;    // MORI_IO_MAX_NOTICE_RINGS: rings this engine grants at
                                      // most at a time (beyond: announcements over TCP)
  bool cma_cache = true;              // MORI_IO_CMA_CACHE=0: every CMA part asks the target
                                      // for a grant (two round trips per write)
  bool liveness_word = true;          // MORI_IO_SHM_LIVENESS_WORD=0: same-host copies poll the
                                      // target's pidfd (a syscall) instead of its liveness word
  static HotPathOptions FromEnv();
};

class Worker;
struct Conn;

// The connections to one remote engine. Built once, then published with a release
// store; submitters read it with an acquire load and take no lock.
struct PeerConnections {
  std::vector<std::shared_ptr<Conn>> conns;
  // The backend for host memory on both sides, decided once at connect (with the CMA
  // probe); other memory pairs are decided per transfer.
  BackendChoice host_choice{BackendType::kTcp, ""};
};

struct Peer {
  std::string key;
  std::string host;
  uint16_t port = 0;
  std::string secret;       // the remote EngineDesc's secret, presented in our hellos
  std::string host_id;      // the remote EngineDesc's host identity
  int pid = 0;              // its process id (SHM copies into/out of it)
  bool remote_shm = false;  // its EngineDesc lists SHM
  uint64_t generation = 0;  // registration number: a re-registered peer is a new Peer
  std::atomic<PeerConnections*> published{nullptr};
  std::unique_ptr<PeerConnections> owned;
  std::mutex connect_mu;  // serializes connecting; also guards `owned` when the
                          // lock-free endpoint read is switched off
  std::atomic<bool> failed{false};
  std::atomic<bool> shm_refused{false};  // a CMA copy met EPERM: TCP from then on
  std::string fail_reason;               // written once before `failed` is set
  std::mutex fail_mu;
  std::atomic<uint32_t> next_conn{0};
  bool remote_p2p = false;  // its EngineDesc lists P2P
  // Its GPU regions mapped here (P2P), by (its memory id, the local GPU copying); opened
  // on first use by each local GPU.
  std::mutex p2p_mu;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<P2pMapping>> p2p_maps;
  // Its host regions mapped here (SHM over shared host memory), by its memory id;
  // nullptr: the region is not shareable, CMA moves it (under p2p_mu).
  std::unordered_map<uint64_t, std::shared_ptr<ShmMapping>> shm_maps;
  // Why each nullptr entry's region is not mapped (backend_for's reason).
  std::unordered_map<uint64_t, std::string> shm_unmapped_why;
  // Its host regions this engine holds a CMA grant for (SHM over CMA), by its memory id
  // (under p2p_mu); dropped on its revoke.
  std::unordered_map<uint64_t, std::shared_ptr<CmaRemote>> cma_grants;
  // Its liveness (liveness.hpp), opened from the first grant that carried it (under
  // p2p_mu); every mapping and CMA grant of it holds a reference.
  std::shared_ptr<const TargetLiveness> liveness;
  bool remote_rdma = false;  // its EngineDesc lists RDMA
  // UseRdma's decisions: bit p (0..3) = pair p decided, bit 4 + p = RDMA, bits 8+ = the
  // override they were decided under + 1 (a different override decides again).
  mutable std::atomic<uint32_t> rdma_cache{0};
  // RDMA: QPs connected (under rdma_mu), and the keys of its regions used so far.
  std::mutex rdma_mu;
  bool rdma_connected = false;
  std::unordered_map<uint64_t, rdma::RegionKey> rdma_keys;
  // The ring it granted for this engine's write announcements, mapped here. Decided once
  // under p2p_mu: notice_ring is set before notice_state leaves 0 (release) and never
  // changes after, so writers read both without the lock. 0: not asked yet, 1: mapped,
  // -1: none (TCP announcements).
  std::shared_ptr<ShmMapping> notice_ring;
  std::atomic<int> notice_state{0};

  void MarkFailed(const std::string& reason);
  std::string FailReason();
};

enum class Op { kRead, kWrite };

struct TransferSpan {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t size;
};

class IoEngine;

// A bound (local memory, remote memory) pair; caches the peer and revalidates it only
// when the engine's peer epoch moves.
class Session {
 public:
  Session(IoEngine* engine, MemoryRegion local, std::string remote_key, uint64_t remote_mem,
          uint64_t remote_size, MemoryLocationType remote_loc);
  std::shared_ptr<TransferState> Transfer(Op op, const TransferSpan* spans, size_t n, uint64_t uid);
  bool Alive();
  BackendChoice Backend();

 private:
  std::shared_ptr<Peer> CurrentPeer();
  IoEngine* engine_;
  MemoryRegion local_;
  std::string remote_key_;
  uint64_t remote_mem_;
  uint64_t remote_size_;
  MemoryLocationType remote_loc_;
  uint64_t epoch_ = ~uint64_t{0};
  std::shared_ptr<Peer> peer_;
  std::mutex mu_;
};

// One part a target received (write) or served (read), accounted per read pass.
struct InboundPart {
  uint64_t uid;
  uint32_t num_parts;
  wire::WireStatus status;
  uint64_t mem_id;
  uint64_t offset;
  uint64_t length;
};

struct InboundEntry {
  uint64_t seq = 0;  // insertion number, for evicting the oldest
  uint32_t seen = 0;
  uint32_t total = 0;
  bool failed = false;
  std::string message;
};

class IoEngine {
 public:
  IoEngine(std::string key, std::string host, uint16_t port);
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  const std::string& key() const { return key_; }
  // The secret a connecting initiator must present (wire::kSecretBytes, in the
  // EngineDesc): getrandom bytes drawn at construction.
  const std::string& secret() const { return secret_; }
  // Whether a hello's secret is ours (constant time).
  bool SecretMatches(const char* data, size_t n) const;
  // Whether a hello that presented our secret may speak for initiator `key` with
  // `credential` (secret.hpp InitiatorCredential): if `key` is registered here, the
  // credential must be the one its EngineDesc's secret gives; otherwise it must match the
  // credential of the key's connections still open here (the first one binds it).
  bool InitiatorAccepted(const std::string& key, const std::string& credential,
                         std::string* why_not);
  // Inbound connections closed because their hello lacked our secret.
  uint64_t hellos_refused() const { return hellos_refused_.load(std::memory_order_relaxed); }
  void CountRefusedHello() { hellos_refused_.fetch_add(1, std::memory_order_relaxed); }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  const HotPathOptions& options() const { return options_; }

  void CreateTcpBackend(const TcpBackendConfig& config);
  bool HasTcpBackend() const { return !workers_.empty(); }
  const TcpBackendConfig& tcp_config() const { return tcp_config_; }

  // SHM rides on the TCP control connections (requests, grants, acks) and moves bytes
  // with CMA; without a TCP backend it starts the reactors with the default config.
  void CreateShmBackend();
  bool HasShmBackend() const { return shm_created_; }
  // P2P moves GPU memory between engines of one host through CUDA IPC; its control
  // messages ride on the TCP connections (started with defaults if TCP was not).
  // Throws NotSupportedError where CUDA or a device is missing.
  void CreateP2pBackend(const P2pBackendConfig& config);
  bool HasP2pBackend() const { return p2p_ != nullptr; }
  // Target side of kP2pOpenReq: the packed export of registered GPU region `mem_id`
  // into *payload, or a refusal (with its text in *payload).
  wire::WireStatus P2pGrant(uint64_t mem_id, const std::string& initiator_key,
                            std::string* payload);
  // Initiator side of kP2pRevoke from `target_key`'s connection `conn`: drops the
  // mapping and acknowledges once no copy uses it (at once if none).
  void OnP2pRevoke(const std::string& target_key, uint64_t mem_id, std::weak_ptr<Conn> conn);
  void OnP2pRevokeAck(const std::string& initiator_key, uint64_t mem_id);
  // Reactors note each inbound connection once its hello named the initiator.
  void NoteInbound(const std::string& initiator_key, std::weak_ptr<Conn> conn);
  // RDMA: one-sided verbs between engines with an RDMA NIC each (never run on a NIC
  // here); connection and rkeys over the TCP control path. MORI_IO_RDMA_LOOPBACK=1
  // substitutes the in-process test double (rdma/loopback_backend.hpp).
  void CreateRdmaBackend(const rdma::RdmaBackendConfig& config);
  bool HasRdmaBackend() const { return rdma_ != nullptr; }
  // Target side of kRdmaConnect / kRdmaRegionReq: the answer payload, or a refusal
  // with its text in *answer.
  wire::WireStatus RdmaAccept(const std::string& initiator_key, const std::string& request,
                              std::string* answer);
  wire::WireStatus RdmaRegionKey(uint64_t mem_id, std::string* answer);
  // Target side of kShmCmaReq: the absolute range of registered host region `mem_id`.
  wire::WireStatus ShmCmaGrantFor(uint64_t mem_id, const std::string& initiator_key,
                                  std::string* payload);
  // The page reactor 0 holds while it runs (nullptr if it could not be made).
  LivenessPage* liveness_page() { return liveness_.get(); }
  // Target side of kShmMapReq.
  wire::WireStatus ShmMapGrantFor(uint64_t mem_id, const std::string& initiator_key,
                                  std::string* payload);
  // Target side of kNoticeRingReq: a fresh ring for `initiator_key` (an older one of
  // that key is drained, then dropped).
  wire::WireStatus NoticeRingFor(const std::string& initiator_key, std::string* payload);
  // Records what the notice ring granted to `key` holds (every ring: nullptr) as
  // inbound statuses.
  void DrainNotices(const std::string* key);
  // Initiator side: the ring `peer` granted for our announcements, asked for once;
  // nullptr: announce over TCP.
  std::shared_ptr<ShmMapping> NoticeRingOf(const std::shared_ptr<Peer>& peer);
  // 1: announcements to `remote_key` go through its ring; 0: not asked yet; -1: TCP.
  int NoticeRingState(const std::string& remote_key);
  // Rings this engine granted (one per initiator engine).
  size_t notice_rings_granted();
  // How remote region `mem_id` of `remote_key` is mapped here: -1 not (yet), 0 directly
  // (same process), else the P2pExport::Kind it was imported from.
  int P2pMappingKind(const std::string& remote_key, uint64_t mem_id);
  // Remote host region `mem_id` of `remote_key`: -1 not asked yet, 0 not shareable (CMA),
  // 1 mapped here (memcpy).
  int ShmMappingState(const std::string& remote_key, uint64_t mem_id);
  // 1: this engine holds a CMA grant of `remote_key`'s memory `mem_id`; 0: none.
  int ShmCmaGrantState(const std::string& remote_key, uint64_t mem_id);
  // How same-host copies learn that `remote_key`'s engine is gone: "word" (its liveness
  // word, a load), "pidfd" (a poll per copy), "" (no grant of it yet).
  std::string ShmLiveness(const std::string& remote_key);
  const std::string& host_id() const { return host_id_; }
  void SetBackendOverride(BackendOverride o) { override_ = o; }
  BackendOverride backend_override() const { return override_; }
  // The backend a transfer between these memory locations and `remote_key`'s region
  // `remote_mem` uses, and why (for SHM: which copy, mapped memcpy or CMA); connects
  // (and probes CMA, asks for the region's mapping) if no transfer did yet. Throws
  // NotFoundError for an unregistered engine.
  BackendChoice BackendFor(MemoryLocationType local_loc, const std::string& remote_key,
                           uint64_t remote_mem, MemoryLocationType remote_loc);

  MemoryRegion RegisterMemory(uintptr_t addr, uint64_t size, int device_id, MemoryLocationType loc);
  void DeregisterMemory(uint64_t id);
  // Copy of the region, or throws NotFoundError.
  MemoryRegion LocalRegion(uint64_t id) const;

  // `secret`: the remote EngineDesc's (without it the remote refuses our connections).
  void RegisterRemoteEngine(const std::string& key, const std::string& host, uint16_t port,
                            const std::string& host_id = {}, int pid = 0, bool remote_shm = false,
                            bool remote_p2p = false, bool remote_rdma = false,
                            const std::string& secret = {});
  void DeregisterRemoteEngine(const std::string& key);
  bool HasRemoteEngine(const std::string& key) const;

  uint64_t AllocateTransferUid() { return next_uid_.fetch_add(1, std::memory_order_relaxed); }

  std::shared_ptr<TransferState> Transfer(Op op, uint64_t local_mem, const std::string& remote_key,
                                          uint64_t remote_mem, uint64_t remote_size,
                                          MemoryLocationType remote_loc, const TransferSpan* spans,
                                          size_t n, uint64_t uid);
  // Status of a transfer `remote_key` made into this engine with `uid`, once all its
  // parts' data is in place (or failed); removed when returned. nullptr if not (yet).
  std::shared_ptr<TransferState> PopInboundTransferStatus(const std::string& remote_key,
                                                          uint64_t uid);

  std::shared_ptr<Session> CreateSession(uint64_t local_mem, const std::string& remote_key,
                                         uint64_t remote_mem, uint64_t remote_size,
                                         MemoryLocationType remote_loc);

  SubmissionLedger& ledger() { return *ledger_; }
  // Inbound statuses held, and how many were dropped by the cap.
  size_t inbound_held();
  uint64_t inbound_evicted();
  uint64_t peer_epoch() const { return peer_epoch_.load(std::memory_order_acquire); }
  std::shared_ptr<Peer> FindPeer(const std::string& key) const;

  // Used by the reactors.
  struct Lookup {
    wire::WireStatus status;
    char* base;
    RegionUse* use = nullptr;  // entered (when `enter` and kOk): Leave once done with it
    int gpu_device = -1;       // >= 0: GPU memory of this device, moved through staging
  };
  // `allow_gpu`: a GPU region is served through staging buffers (TCP) where this build
  // can; otherwise (and for SHM) it is refused as kNotHostMemory.
  Lookup CheckTarget(uint64_t mem_id, uint64_t offset, uint64_t length, bool enter,
                     bool allow_gpu) const;
  static Lookup CheckRegion(const MemoryRegion& r, uint64_t offset, uint64_t length, bool enter,
                            bool allow_gpu);
  // Copies region `id` into *out; false if it is not registered.
  bool FindRegion(uint64_t id, MemoryRegion* out) const;
  // Moves on every register/deregister: a cached region is valid while it stays put.
  uint64_t memory_epoch() const { return memory_epoch_.load(std::memory_order_acquire); }
  // Accounts parts of one read pass under one lock (runs of one uid: one lookup).
  void RecordInboundParts(const std::string& remote_key, const InboundPart* parts, size_t n);
  void CompletePart(uint64_t record_id, StatusDetail code, const std::string& message);
  void AssignInbound(std::shared_ptr<Conn> conn);

  // The transfer path shared by engine calls and sessions; peer may be null.
  std::shared_ptr<TransferState> Submit(Op op, const MemoryRegion& local,
                                        const std::shared_ptr<Peer>& peer,
                                        const std::string& remote_key, uint64_t remote_mem,
                                        uint64_t remote_size, MemoryLocationType remote_loc,
                                        const TransferSpan* spans, size_t n, uint64_t uid);
  // The SHM probe's cookie: its address and value go to a peer that asks.
  const uint64_t* shm_cookie() const { return &shm_cookie_; }

 private:
  PeerConnections* Connect(const std::shared_ptr<Peer>& peer, std::string* error);
  // The first message on every connection this engine opens: a hello presenting the
  // peer's secret and naming our key.
  std::string HelloMessage(const Peer& peer) const;
  PeerConnections* Connected(const std::shared_ptr<Peer>& peer, std::string* error);
  BackendChoiceInput ChoiceInput(const Peer& peer, MemoryLocationType local_loc,
                                 MemoryLocationType remote_loc) const;
  // Asks the peer over `fd` (not yet in a reactor) for its cookie and reads it with
  // CMA; "" when that worked, else why not.
  std::string ProbeShmPeer(int fd, const Peer& peer);
  // One request and its answer on a connection of its own (P2P open, RDMA connect and
  // region keys: rare, blocking, bounded by peer_timeout_ms). False with *code/*error
  // when the peer refused or could not be reached.
  bool SideRequest(const Peer& peer, wire::MsgType type, wire::MsgType answer_type, uint64_t mem_id,
                   const std::string& payload, std::string* answer, StatusDetail* code,
                   std::string* error, wire::WireStatus* status_out = nullptr);
  bool UseRdma(const Peer& peer, MemoryLocationType local_loc, MemoryLocationType remote_loc) const;
  // The peer's region mapped here when it lies in its shared host memory; nullptr when
  // it does not (CMA then) or could not be mapped (logged; CMA then), with the reason
  // in *why_not when given.
  std::shared_ptr<ShmMapping> ShmMappingFor(const std::shared_ptr<Peer>& peer, uint64_t mem_id,
                                            std::string* why_not = nullptr);
  // The liveness of the peer that sent a grant naming `pid` and `live`; opened once per
  // peer (peer->p2p_mu held). nullptr with *error when the grant's pid is not the
  // peer's or its page cannot be mapped.
  std::shared_ptr<const TargetLiveness> LivenessOf(Peer& peer, int pid, const LivenessGrant& live,
                                                   std::string* error);
  // The CMA grant for the peer's host region `mem_id`, asked for on first use; nullptr
  // with *code/*error when refused or unreachable.
  std::shared_ptr<CmaRemote> CmaRemoteFor(const std::shared_ptr<Peer>& peer, uint64_t mem_id,
                                          StatusDetail* code, std::string* error);
  struct CmaJob;
  // Copies one share of a CMA transfer and completes its part (cma path, io_engine.cpp).
  void CopyCmaShare(CmaJob& job, const CmaSpan* spans, size_t n);
  // Marks the peer failed; the message of a transfer that met its target gone.
  std::string CmaLost(CmaJob& job);
  std::shared_ptr<TransferState> SubmitShmCma(Op op, const MemoryRegion& local,
                                              const std::shared_ptr<Peer>& peer,
                                              PeerConnections* pc, uint64_t remote_mem,
                                              std::shared_ptr<CmaRemote> remote,
                                              const TransferSpan* spans, size_t n, uint64_t uid);
  // Drops the record that `initiator_key` was granted `mem_id` (a grant refused after it
  // was recorded).
  void ForgetGrant(uint64_t mem_id, const std::string& initiator_key);
  // Checks registered host region `mem_id` (into *r), records its grant to
  // `initiator_key` and checks it again (see the definition).
  wire::WireStatus RecordCheckedGrant(uint64_t mem_id, const std::string& initiator_key,
                                      MemoryRegion* r);
  std::shared_ptr<TransferState> SubmitShmMapped(Op op, const MemoryRegion& local,
                                                 const std::shared_ptr<Peer>& peer,
                                                 PeerConnections* pc, uint64_t remote_mem,
                                                 std::shared_ptr<ShmMapping> remote,
                                                 const TransferSpan* spans, size_t n, uint64_t uid);
  bool HasP2pGrants(uint64_t id);
  void RecordGrant(uint64_t mem_id, const std::string& initiator_key);
  // Enters the local region and admits a ledger record of `parts` parts: on success
  // *rid names it and the state is in progress; otherwise *rid is kNoRecord and the
  // returned state is already finished with the reason.
  std::shared_ptr<TransferState> BeginTransfer(const MemoryRegion& local, uint32_t parts,
                                               bool long_spin, uint64_t* rid);
  // A finished ERR_OUT_OF_BOUNDS naming the first span past `limit` bytes of the target's
  // region, or nullptr when every span fits.
  static std::shared_ptr<TransferState> RemoteBoundsError(Op op, const TransferSpan* spans,
                                                          size_t n, uint64_t limit,
                                                          uint64_t remote_mem,
                                                          const std::string& peer_key);
  std::shared_ptr<TransferState> SubmitRdma(Op op, const MemoryRegion& local,
                                            const std::shared_ptr<Peer>& peer, uint64_t remote_mem,
                                            const TransferSpan* spans, size_t n, uint64_t uid);
  // Whether transfers between these locations and `peer` go through P2P.
  bool UseP2p(const Peer& peer, MemoryLocationType local_loc, MemoryLocationType remote_loc) const;
  // The mapping of the peer's region `mem_id` for copies by `device`, asking the peer
  // for its export on first use; nullptr with *code/*error set if refused or failed.
  std::shared_ptr<P2pMapping> P2pMappingFor(const std::shared_ptr<Peer>& peer, uint64_t mem_id,
                                            int device, StatusDetail* code, std::string* error);
  std::shared_ptr<TransferState> SubmitP2p(Op op, const MemoryRegion& local,
                                           const std::shared_ptr<Peer>& peer, PeerConnections* pc,
                                           uint64_t remote_mem, const TransferSpan* spans, size_t n,
                                           uint64_t uid);
  void Shutdown();

  std::string key_;
  std::string secret_;
  std::atomic<uint64_t> hellos_refused_{0};
  std::string host_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  HotPathOptions options_;
  TcpBackendConfig tcp_config_;
  bool shm_created_ = false;
  bool shm_self_ok_ = false;     // the local CMA probe passed at CreateShmBackend
  std::string shm_self_reason_;  // its reason
  std::string host_id_;
  BackendOverride override_ = BackendOverride::kAuto;
  uint64_t shm_cookie_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint32_t> next_worker_{0};

  mutable std::shared_mutex mem_mu_;
  std::unordered_map<uint64_t, MemoryRegion> memory_;
  std::unordered_map<uint64_t, std::string> rdma_keys_;  // region id -> its RDMA key blob

  // P2P grants: which initiators mapped which region, and the revokes awaited.
  std::mutex p2p_mu_;
  std::condition_variable p2p_cv_;
  std::unordered_map<uint64_t, std::vector<std::string>> p2p_granted_;
  std::vector<std::pair<std::string, uint64_t>> p2p_revoking_;  // (initiator, region)
  std::unordered_multimap<std::string, std::weak_ptr<Conn>> inbound_by_key_;
  // Revokes the region's P2P grants and waits (bounded) for every acknowledgement;
  // throws TimeoutError naming the initiators that did not confirm.
  void RevokeP2pGrants(uint64_t id);
  uint64_t next_mem_id_ = 1;
  std::atomic<uint64_t> memory_epoch_{0};

  mutable std::shared_mutex peer_mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::atomic<uint64_t> peer_epoch_{0};
  uint64_t next_peer_generation_ = 1;

  std::mutex inbound_mu_;
  std::unordered_map<std::string, std::unordered_map<uint64_t, InboundEntry>> inbound_;
  // Entries in insertion order (key, uid, seq); an item whose entry was popped or
  // replaced is stale and skipped. Compacted when stale items dominate.
  struct InboundOrder {
    // Shared with every other item of that initiator (inbound_keys_): a key is up to 4 KiB,
    // and a copy per held status made 65,536 statuses of one long key cost 256 MiB.
    std::shared_ptr<const std::string> key;
    uint64_t uid;
    uint64_t seq;
  };
  std::deque<InboundOrder> inbound_order_;
  std::unordered_map<std::string, std::shared_ptr<const std::string>> inbound_keys_;
  size_t inbound_count_ = 0;
  uint64_t inbound_seq_ = 0;
  uint64_t inbound_evicted_ = 0;
  bool InboundLive(const InboundOrder& o) const;
  void EvictInboundLocked(size_t cap);  // with inbound_mu_ held

  // Rings granted to same-host initiators for their write announcements, by their key;
  // drained into inbound_ (under notice_mu_, taken before inbound_mu_) when the
  // application asks for inbound statuses.
  struct GrantedRing {
    uintptr_t addr = 0;  // AllocateSharedHost'd
    uint32_t capacity = 0;
    uint64_t head = 0;  // the consumer's position: ours, not in shared memory
  };
  std::mutex notice_mu_;
  std::unordered_map<std::string, GrantedRing> notice_rings_;
  void DrainNoticesLocked(const std::string& key, GrantedRing& ring);  // notice_mu_ held
  // Whether `key` has an inbound connection that is not closed (an initiator without one
  // has failed its peer and announces nothing more until it registers us again).
  bool HasLiveInbound(const std::string& key);
  void FreeNoticeRings();

  std::atomic<uint64_t> next_uid_{1};
  std::unique_ptr<SubmissionLedger> ledger_;
  // Last: destroyed (its completion thread joined, finishing every copy) before the
  // ledger and connections its callbacks use; Shutdown resets it first.
  std::unique_ptr<P2pBackend> p2p_;
  std::unique_ptr<rdma::RdmaBackend> rdma_;
  // Held by reactor 0 while it runs; freed after the reactors are joined.
  std::unique_ptr<LivenessPage> liveness_;
};

}  // namespace mori::io
