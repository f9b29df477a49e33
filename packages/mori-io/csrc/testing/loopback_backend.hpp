// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// ============================================================================
//  TEST DOUBLE. NOT AN RDMA TRANSPORT. NEVER CHOSEN UNLESS ASKED FOR.
//
//  The loopback backend implements RdmaBackend with std::memmove between the
//  registered regions of backends that live in ONE process. It exists so that the
//  engine's RDMA wiring (registration, the connect handshake, submission,
//  completion, notifications, disconnects) can be tested end to end in CI on
//  machines without an RDMA NIC. It does not talk to a NIC, the network or
//  another process: a peer in another process is unreachable through it.
//
//  It is compiled only into test builds (MORI_IO_TESTING=ON, which `nox -s tests`
//  sets); no wheel carries it. There, RdmaBackend::Create returns it instead of
//  opening a NIC only when the environment variable MORI_IO_RDMA_LOOPBACK=1 is set
//  (InstallLoopbackBackend, LoopbackBackendRequested); nothing else selects it.
// ============================================================================
//
// What it mirrors of RdmaBackend's contract (rdma_backend.hpp), so the engine cannot
// tell the difference:
//  - RegisterRegion returns a real EncodeRegionKey blob; every registration gets a
//    process-unique rkey, so a key kept past DeregisterRegion (or one of another
//    backend) is detected. DeregisterRegion: NotFoundError for an unknown id,
//    InvalidStateError while InFlight(mem_id) > 0.
//  - The connect payloads are real EncodeEndpoints blobs of qp_per_transfer endpoints.
//    Each endpoint carries the backend's process-registry id as its QPN, the
//    connection's generation as its PSN and the GID "mori-io loopback"; a blob of a
//    real backend is refused with InvalidArgumentError (both engines must run with
//    the loopback).
//  - Submit validates as the real one does before anything moves (NotFoundError for an
//    unknown local region, InvalidStateError when not connected, InvalidArgumentError
//    from PlanTransfer for a span outside either region, InvalidStateError past 65536
//    transfers in flight), then plans the transfer with PlanTransfer under the limits
//    the real backend would use and executes that plan on the backend's worker thread:
//    the bytes of every WR's SGEs, one notification per WRITE_WITH_IMM (its immediate
//    data decoded, so uid24, parts and read are what the target would receive). `done`
//    runs exactly once, on the worker thread (inline only for an empty plan), or in
//    DisconnectPeer / the destructor when those fail the transfer, as in the real one.
//  - Slices go to the connection's QPs round robin. A remote access error (a RegionKey
//    whose rkey is not registered at the target, or whose addr/length differ from that
//    registration) fails the transfer with ERR_OUT_OF_BOUNDS and, as an RC QP does,
//    kills the QP it ran on: later slices on it fail with ERR_PEER_LOST until the peer is
//    reconnected. A target that was destroyed, or that dropped the connection
//    (DisconnectPeer, or the initiator re-opened), fails the slice with ERR_PEER_LOST
//    and kills the QP too. PeerReady stays true over dead QPs, as in the real backend.
//  - Notifications are delivered on the TARGET backend's worker thread (as the real
//    target's poll thread would), after the slice's bytes landed, with the peer key the
//    target gave AcceptInitiator.
//
// Where it differs (deliberately):
//  - One worker thread whatever num_worker_threads says; transfers of one backend run
//    in submission order.
//  - While a slice is copied into (or out of) a target region, that region's
//    InFlight() counts it, so the target cannot deregister memory that is being copied
//    (a NIC would fault the access; a memmove would touch freed memory).
//  - A destroyed backend waits for the copies into its regions that are in progress.
//  - DisconnectPeer waits for the copy of a transfer of that peer that is in progress
//    (never from the worker thread itself), so that no byte moves after it returned.
//  - An exception thrown by `done` or the inbound handler is logged, not fatal.
//  - Addresses are trusted: registering memory that is not mapped is not detected.

#include <memory>

#include "rdma/rdma_backend.hpp"

namespace mori::io::rdma {

inline constexpr const char* kLoopbackEnvVar = "MORI_IO_RDMA_LOOPBACK";

// Whether MORI_IO_RDMA_LOOPBACK is exactly "1".
bool LoopbackBackendRequested();

// A loopback backend (see above). Throws InvalidArgumentError for a bad config
// (ValidateRdmaBackendConfig); needs no NIC, no libibverbs and no ibverbs headers.
std::unique_ptr<RdmaBackend> CreateLoopbackBackend(const RdmaBackendConfig& config);

// Makes RdmaBackend::Create (and so the engine's create_backend(RDMA)) return a
// loopback backend whenever MORI_IO_RDMA_LOOPBACK=1 (read at each call).
void InstallLoopbackBackend();

}  // namespace mori::io::rdma
