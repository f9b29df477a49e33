// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "control/control_host.hpp"

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/macros.hpp"
#include "wire/secret.hpp"

namespace mori::io {

ControlHost::ControlHost(std::string key, HotPathOptions options, size_t ledger_limit)
    : key_(std::move(key)),
      options_(options),
      memory_(key_),
      inbound_(key_),
      ledger_(std::make_unique<SubmissionLedger>(ledger_limit)) {
  MORI_CHECK_ARG(!key_.empty(), "engine key must not be empty");
  MORI_CHECK_ARG(key_.size() <= 4096, "engine key of ", key_.size(), " bytes exceeds 4096");
  secret_ = RandomSecret(wire::kSecretBytes);
}

ControlHost::~ControlHost() = default;

void ControlHost::CompletePart(uint64_t record_id, StatusDetail code, const std::string& message) {
  TransferRecord* rec = ledger_->Lookup(record_id);
  if (rec == nullptr) {
    MORI_LOG_ERROR(kIo, "engine '", key_, "': completion for record ", record_id,
                   " that is not live");
    return;
  }
  if (code != StatusDetail::SUCCESS) {
    uint32_t none = 0;
    if (rec->error_code.compare_exchange_strong(none, static_cast<uint32_t>(code),
                                                std::memory_order_acq_rel)) {
      rec->error_message = message;
    }
  }
  if (rec->parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::shared_ptr<TransferState> state = std::move(rec->state);
  auto err = static_cast<StatusDetail>(rec->error_code.load(std::memory_order_acquire));
  std::string msg = err != StatusDetail::SUCCESS ? std::move(rec->error_message) : std::string();
  RegionUse* use = rec->local_use;
  rec->local_use = nullptr;
  ledger_->Release(record_id);
  // Before Finish: a caller that saw the transfer finish may deregister its memory.
  if (use != nullptr) use->Leave();
  if (state) state->Finish(err, std::move(msg));
}

std::shared_ptr<TransferState> ControlHost::Finished(StatusDetail code, std::string message) {
  return std::make_shared<TransferState>(code, std::move(message));
}

std::shared_ptr<TransferState> ControlHost::RemoteBoundsError(const TransferRequest& req,
                                                              uint64_t limit) {
  for (size_t i = 0; i < req.n; ++i) {
    const TransferSpan& s = req.spans[i];
    if (s.size > limit || s.remote_offset > limit - s.size) {
      return Finished(StatusDetail::ERR_OUT_OF_BOUNDS,
                      StrCat(req.op == Op::kWrite ? "write " : "read ", i, ": remote range [",
                             s.remote_offset, ", +", s.size, ") exceeds memory ", req.remote.mem_id,
                             " as registered with '", req.peer->key, "' (", limit, " bytes)"));
    }
  }
  return nullptr;
}

std::shared_ptr<TransferState> ControlHost::BeginTransfer(const MemoryRegion& local, uint32_t parts,
                                                          bool long_spin, uint64_t* rid) {
  *rid = SubmissionLedger::kNoRecord;
  if (auto refused = EnterLocal(local)) return refused;
  RegionUse* use = local.use.get();
  uint64_t id = ledger_->Admit();
  if (id == SubmissionLedger::kNoRecord) {
    if (use != nullptr) use->Leave();
    return Finished(StatusDetail::ERR_BAD_STATE,
                    StrCat("too many transfers in flight: ", ledger_->live(),
                           " live records reach the submission ledger's admission limit of ",
                           ledger_->admission_limit(), "; wait for earlier transfers"));
  }
  auto state = std::make_shared<TransferState>();
  if (long_spin) state->SetLongSpin();
  state->SetInProgress();
  TransferRecord* rec = ledger_->Lookup(id);
  rec->state = state;
  rec->local_use = use;
  rec->parts_left.store(parts, std::memory_order_release);
  *rid = id;
  return state;
}

std::shared_ptr<TransferState> ControlHost::EnterLocal(const MemoryRegion& local) {
  RegionUse* use = local.use.get();
  if (use == nullptr || MORI_LIKELY(use->Enter())) return nullptr;
  return Finished(StatusDetail::ERR_NOT_FOUND,
                  StrCat("local memory ", local.id, " was deregistered from engine '", key_, "'"));
}

bool ControlHost::SecretMatches(const char* data, size_t n) const {
  return SecretEqual(secret_, data, n);
}

}  // namespace mori::io
