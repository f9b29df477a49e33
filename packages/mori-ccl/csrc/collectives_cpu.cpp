// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CPU implementation of the collectives' protocol (protocol.hpp), written with
// the host counterparts of the device API (mori/shmem/host_ops.hpp).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collectives.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/host_ops.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ccl {

namespace hs = mori::shmem::host;
using mori::shmem::Cmp;

namespace {

std::string Describe(const CallHeader& h) {
  std::string s = CollectiveKindName(static_cast<CollectiveKind>(h.kind));
  if (static_cast<CollectiveKind>(h.kind) == CollectiveKind::kBarrier) return s;
  s += StrCat(" of ", h.bytes, " bytes of ", DataTypeName(static_cast<DataType>(h.dtype)));
  if (h.op >= 0) s += StrCat(", op ", ReduceOpName(static_cast<ReduceOp>(h.op)));
  if (h.algorithm >= 0) {
    s += h.algorithm == static_cast<int32_t>(AllReduceAlgorithm::kTwoShot) ? ", two_shot"
                                                                           : ", one_shot";
  }
  if (h.root >= 0) s += StrCat(", src ", h.root);
  if (static_cast<CollectiveKind>(h.kind) == CollectiveKind::kAllToAll) {
    s += StrCat(", ", h.row_bytes, "-byte rows");
  }
  return s;
}

bool SameCall(const CallHeader& a, const CallHeader& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.algorithm == b.algorithm &&
         a.root == b.root && a.row_bytes == b.row_bytes &&
         (a.bytes == b.bytes || static_cast<CollectiveKind>(a.kind) == CollectiveKind::kAllToAll);
}

// The bit a rank sets in a signal word (beside the call number) to say that the call
// failed: in its own word for a peer it gave up waiting for, and in its words on every
// peer once it fails the call (protocol.hpp).
constexpr uint64_t kCallFailed = uint64_t{1} << 63;

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kBroadcast:
      return "broadcast";
  }
  return "unknown";
}

CommunicatorCpu::CommunicatorCpu(void* block, size_t max_bytes, std::chrono::milliseconds timeout,
                                 const std::vector<int>& pes, bool zero_copy)
    : ctx_(TeamContext(shmem::GetDeviceContext(), pes, team_bases_)),
      block_(static_cast<char*>(block)),
      max_bytes_(max_bytes),
      layout_(MakeBlockLayout(ctx_.n_pes, max_bytes)),
      timeout_(CheckedTimeout(timeout, "timeout")),
      zero_copy_(zero_copy),
      headers_(ctx_.n_pes),
      srcs_(ctx_.n_pes) {
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the communicator's buffer is not a symmetric block of ", layout_.total_bytes,
                 " bytes");
  for (int pe = 0; pe < ctx_.n_pes; ++pe) {
    if (hs::Ptr(ctx_, block_, pe) == nullptr) {
      MORI_THROW(NotSupportedError, "the CPU collectives need every pe on this node, but pe ", pe,
                 " is not load/store reachable from pe ", ctx_.my_pe);
    }
  }
  std::memset(block_, 0, SignalBytes(layout_));
  shmem::BarrierAll();
}

const char* CommunicatorCpu::PeerSource(int pe) const {
  return hs::Ptr(ctx_, ctx_.my_base + headers_[pe].src_offset, pe);
}

void CommunicatorCpu::Wait(uint64_t* words, int pe, uint64_t value, const char* what) {
  const uint64_t e = epoch_;  // the call in progress (`value` may be of the previous one)
  uint64_t seen = 0;
  try {
    seen = hs::WaitUntil(&words[pe], Cmp::kGe, value, timeout_);
  } catch (const TimeoutError&) {
    seen = __atomic_load_n(&words[pe], __ATOMIC_ACQUIRE);
    // Give up on pe, unless its signal lands first: the word is the one place where
    // its post and this verdict meet, so exactly one of them wins (PostAll).
    while (seen < value) {
      if (__atomic_compare_exchange_n(&words[pe], &seen, kCallFailed | e, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE)) {
        FailCall();
        MORI_THROW(TimeoutError, CollectiveKindName(kind_), " (call ", e, ") on rank ", ctx_.my_pe,
                   ": rank ", pe, " did not ", what, " within ", timeout_.count(),
                   " ms (its last signal is from call ", seen, ")");
      }
    }
  }
  // A peer's mark of the call in progress, seen while waiting for its word of the
  // previous call, is left to this call's own signals: they name what it waited for.
  const bool reported_later = value < e && seen == (kCallFailed | e);
  if ((seen & kCallFailed) != 0 && !reported_later) {
    FailCall();
    MORI_THROW(TimeoutError, CollectiveKindName(kind_), " (call ", e, ") on rank ", ctx_.my_pe,
               ": rank ", pe, " failed call ", seen & ~kCallFailed,
               " (a rank timed out in it: its error names which), so this call fails too");
  }
}

void CommunicatorCpu::PostAll(size_t words_offset, uint64_t epoch, const char* what) {
  uint64_t* words = At<uint64_t>(words_offset);
  int gave_up = -1;
  for (int pe = 0; pe < ctx_.n_pes; ++pe) {
    const uint64_t old =
        __atomic_exchange_n(hs::CheckedPtr(ctx_, &words[ctx_.my_pe], pe), epoch, __ATOMIC_ACQ_REL);
    if (old == (kCallFailed | epoch) && gave_up < 0) gave_up = pe;
  }
  if (gave_up >= 0) {
    FailCall();
    MORI_THROW(TimeoutError, CollectiveKindName(kind_), " (call ", epoch, ") on rank ", ctx_.my_pe,
               ": rank ", gave_up, " timed out waiting for this rank to ", what,
               " before it did; the call failed there, so it fails here too");
  }
}

void CommunicatorCpu::FailCall() {
  // Every signal word this rank posts now reads "call epoch_ failed": a peer still
  // waiting for it fails at once naming this rank, and one that has not yet come to
  // this call's waits fails there, instead of completing a call this rank abandoned.
  for (size_t offset : {layout_.arrive, layout_.ready, layout_.done}) {
    uint64_t* words = At<uint64_t>(offset);
    for (int pe = 0; pe < ctx_.n_pes; ++pe) {
      if (pe != ctx_.my_pe) hs::SignalSet(ctx_, &words[ctx_.my_pe], kCallFailed | epoch_, pe);
    }
  }
}

bool CommunicatorCpu::Begin(Call& call) {
  const int W = ctx_.n_pes;
  kind_ = static_cast<CollectiveKind>(call.header.kind);
  const uint64_t e = ++epoch_;
  if (e > 1) {
    uint64_t* done = At<uint64_t>(layout_.done);
    for (int s = 0; s < W; ++s) Wait(done, s, e - 1, "finish reading the previous call");
  }
  const size_t bytes = static_cast<size_t>(call.header.bytes);
  const bool in_place = zero_copy_ && call.src != nullptr && bytes > 0 &&
                        shmem::IsSymmetric(call.src, bytes) &&
                        !Overlaps(call.src, bytes, block_, layout_.total_bytes);
  const char* source = At<char>(layout_.staging);
  if (in_place) {
    source = static_cast<const char*>(call.src);
  } else if (bytes > 0 && call.src != nullptr) {
    std::memcpy(At<char>(layout_.staging), call.src, bytes);
  }
  if (call.in_rows != nullptr) {
    std::memcpy(At<int64_t>(layout_.in_rows), call.in_rows, W * sizeof(int64_t));
    std::memcpy(At<int64_t>(layout_.out_rows), call.out_rows, W * sizeof(int64_t));
  }
  call.header.epoch = e;
  call.header.src_offset = source - ctx_.my_base;
  *At<CallHeader>(layout_.header) = call.header;
  PostAll(layout_.arrive, e, "arrive");

  uint64_t* arrive = At<uint64_t>(layout_.arrive);
  for (int s = 0; s < W; ++s) Wait(arrive, s, e, "arrive");
  for (int s = 0; s < W; ++s) {
    hs::GetNbi(ctx_, &headers_[s], At<CallHeader>(layout_.header), sizeof(CallHeader), s);
    MORI_CHECK(headers_[s].epoch == e, "rank ", s, "'s header is from call ", headers_[s].epoch,
               ", expected ", e);
  }
  CheckAgreement(call);
  for (int s = 0; s < W; ++s) srcs_[s] = PeerSource(s);
  return in_place;
}

void CommunicatorCpu::CheckAgreement(const Call& call) {
  const int W = ctx_.n_pes;
  // Every rank reads the same headers, so every rank reaches the same verdict and
  // raises the same message.
  for (int s = 0; s < W; ++s) {
    if (headers_[s].rejected) {
      End(false);
      std::string reason(headers_[s].reason, strnlen(headers_[s].reason, kReasonBytes));
      MORI_THROW(InvalidArgumentError, CollectiveKindName(kind_), " (call ", epoch_,
                 ") rejected by rank ", s, ": ", reason, "; no data moved");
    }
  }
  for (int s = 1; s < W; ++s) {
    if (!SameCall(headers_[0], headers_[s])) {
      End(false);
      MORI_THROW(InvalidArgumentError, "ranks disagree on call ", epoch_, ": rank 0 calls ",
                 Describe(headers_[0]), ", rank ", s, " calls ", Describe(headers_[s]),
                 "; no data moved");
    }
  }
  if (static_cast<CollectiveKind>(call.header.kind) != CollectiveKind::kAllToAll) return;
  std::vector<int64_t> in(W * W), out(W * W);
  for (int s = 0; s < W; ++s) {
    hs::GetNbi(ctx_, &in[s * W], At<int64_t>(layout_.in_rows), W * sizeof(int64_t), s);
    hs::GetNbi(ctx_, &out[s * W], At<int64_t>(layout_.out_rows), W * sizeof(int64_t), s);
  }
  for (int s = 0; s < W; ++s) {
    for (int d = 0; d < W; ++d) {
      if (in[s * W + d] != out[d * W + s]) {
        End(false);
        MORI_THROW(InvalidArgumentError, "all_to_all (call ", epoch_, ") splits disagree: rank ", s,
                   " sends ", in[s * W + d], " rows to rank ", d, ", which expects ",
                   out[d * W + s], " rows from it; no data moved");
      }
    }
  }
}

void CommunicatorCpu::End(bool in_place_input) {
  PostAll(layout_.done, epoch_, "finish reading this call");
  if (!in_place_input) return;
  uint64_t* done = At<uint64_t>(layout_.done);
  for (int s = 0; s < ctx_.n_pes; ++s) Wait(done, s, epoch_, "finish reading this call");
}

void CommunicatorCpu::ReduceRange(DataType dtype, ReduceOp op, size_t src_offset, size_t first,
                                  size_t count, void* dst) {
  const size_t es = DataTypeSize(dtype);
  std::vector<const void*> srcs(ctx_.n_pes);
  for (int s = 0; s < ctx_.n_pes; ++s) {
    srcs[s] = static_cast<const char*>(srcs_[s]) + src_offset + first * es;
  }
  ReduceCpu(dtype, op, dst, srcs.data(), ctx_.n_pes, count);
}

void CommunicatorCpu::AllReduce(const void* src, void* dst, size_t count, DataType dtype,
                                ReduceOp op, AllReduceAlgorithm algorithm) {
  const int W = ctx_.n_pes, me = ctx_.my_pe;
  const size_t es = DataTypeSize(dtype), bytes = count * es;
  Call call;
  call.header.kind = static_cast<int32_t>(CollectiveKind::kAllReduce);
  call.header.dtype = static_cast<int32_t>(dtype);
  call.header.op = static_cast<int32_t>(op);
  call.header.algorithm = static_cast<int32_t>(algorithm);
  call.header.root = -1;
  call.header.bytes = static_cast<int64_t>(bytes);
  call.src = src;
  const bool in_place = Begin(call);
  // A symmetric input that is also the output is read by peers until End: reduce
  // into a private copy and write the output once every peer is done.
  const bool deferred = in_place && Overlaps(src, bytes, dst, bytes);
  std::vector<char> scratch(deferred ? bytes : 0);
  char* out = deferred ? scratch.data() : static_cast<char*>(dst);
  if (algorithm == AllReduceAlgorithm::kOneShot) {
    ReduceRange(dtype, op, 0, 0, count, out);
  } else {
    const size_t first = ShardBegin(count, W, me), last = ShardBegin(count, W, me + 1);
    char* reduced = At<char>(layout_.reduced);
    ReduceRange(dtype, op, 0, first, last - first, reduced + first * es);
    PostAll(layout_.ready, epoch_, "publish its reduced shard");
    uint64_t* ready = At<uint64_t>(layout_.ready);
    for (int s = 0; s < W; ++s) {
      Wait(ready, s, epoch_, "publish its reduced shard");
      const size_t b = ShardBegin(count, W, s), n = ShardBegin(count, W, s + 1) - b;
      if (n > 0) hs::GetNbi(ctx_, out + b * es, reduced + b * es, n * es, s);
    }
  }
  End(in_place);
  if (deferred) std::memcpy(dst, scratch.data(), bytes);
}

void CommunicatorCpu::AllGather(const void* src, void* dst, size_t bytes, DataType dtype) {
  Call call;
  call.header.kind = static_cast<int32_t>(CollectiveKind::kAllGather);
  call.header.dtype = static_cast<int32_t>(dtype);
  call.header.op = call.header.algorithm = call.header.root = -1;
  call.header.bytes = static_cast<int64_t>(bytes);
  call.src = src;
  const bool in_place = Begin(call);
  const int W = ctx_.n_pes;
  const bool deferred = in_place && Overlaps(src, bytes, dst, bytes * W);
  std::vector<char> scratch(deferred ? bytes * W : 0);
  char* out = deferred ? scratch.data() : static_cast<char*>(dst);
  for (int s = 0; s < W; ++s) std::memcpy(out + s * bytes, srcs_[s], bytes);
  End(in_place);
  if (deferred) std::memcpy(dst, scratch.data(), bytes * W);
}

void CommunicatorCpu::ReduceScatter(const void* src, void* dst, size_t count, DataType dtype,
                                    ReduceOp op) {
  const int W = ctx_.n_pes;
  const size_t es = DataTypeSize(dtype);
  Call call;
  call.header.kind = static_cast<int32_t>(CollectiveKind::kReduceScatter);
  call.header.dtype = static_cast<int32_t>(dtype);
  call.header.op = static_cast<int32_t>(op);
  call.header.algorithm = call.header.root = -1;
  call.header.bytes = static_cast<int64_t>(count * es * W);
  call.src = src;
  const bool in_place = Begin(call);
  const bool deferred = in_place && Overlaps(src, count * es * W, dst, count * es);
  std::vector<char> scratch(deferred ? count * es : 0);
  char* out = deferred ? scratch.data() : static_cast<char*>(dst);
  ReduceRange(dtype, op, 0, static_cast<size_t>(ctx_.my_pe) * count, count, out);
  End(in_place);
  if (deferred) std::memcpy(dst, scratch.data(), count * es);
}

void CommunicatorCpu::AllToAll(const void* src, void* dst, size_t row_bytes, const int64_t* in_rows,
                               const int64_t* out_rows, DataType dtype) {
  const int W = ctx_.n_pes, me = ctx_.my_pe;
  int64_t rows_in = 0, rows_out = 0;
  for (int d = 0; d < W; ++d) {
    MORI_CHECK_ARG(in_rows[d] >= 0 && out_rows[d] >= 0, "negative split for rank ", d);
    rows_in += in_rows[d];
    rows_out += out_rows[d];
  }
  Call call;
  call.header.kind = static_cast<int32_t>(CollectiveKind::kAllToAll);
  call.header.dtype = static_cast<int32_t>(dtype);
  call.header.op = call.header.algorithm = call.header.root = -1;
  call.header.bytes = rows_in * static_cast<int64_t>(row_bytes);
  call.header.row_bytes = static_cast<int64_t>(row_bytes);
  call.src = src;
  call.in_rows = in_rows;
  call.out_rows = out_rows;
  const bool in_place = Begin(call);
  const size_t out_bytes = static_cast<size_t>(rows_out) * row_bytes;
  const bool deferred =
      in_place && Overlaps(src, static_cast<size_t>(call.header.bytes), dst, out_bytes);
  std::vector<char> scratch(deferred ? out_bytes : 0);
  char* out = deferred ? scratch.data() : static_cast<char*>(dst);
  std::vector<int64_t> peer_in(W);
  for (int s = 0; s < W; ++s) {
    // Where rank s's rows for this rank start in its input: the rows it sends to
    // lower ranks come first.
    hs::GetNbi(ctx_, peer_in.data(), At<int64_t>(layout_.in_rows), W * sizeof(int64_t), s);
    int64_t before = 0;
    for (int d = 0; d < me; ++d) before += peer_in[d];
    const size_t n = static_cast<size_t>(out_rows[s]) * row_bytes;
    std::memcpy(out, static_cast<const char*>(srcs_[s]) + before * row_bytes, n);
    out += n;
  }
  End(in_place);
  if (deferred) std::memcpy(dst, scratch.data(), out_bytes);
}

void CommunicatorCpu::Broadcast(void* buf, size_t bytes, DataType dtype, int root) {
  MORI_CHECK_ARG(root >= 0 && root < ctx_.n_pes, "broadcast src ", root, " out of range [0, ",
                 ctx_.n_pes, ")");
  const bool is_root = root == ctx_.my_pe;
  Call call;
  call.header.kind = static_cast<int32_t>(CollectiveKind::kBroadcast);
  call.header.dtype = static_cast<int32_t>(dtype);
  call.header.op = call.header.algorithm = -1;
  call.header.root = root;
  call.header.bytes = static_cast<int64_t>(bytes);
  // Only the root's input is read; the others stage nothing.
  call.src = is_root ? buf : nullptr;
  const bool in_place = Begin(call);
  if (!is_root && bytes > 0) std::memcpy(buf, srcs_[root], bytes);
  End(in_place);
}

void CommunicatorCpu::Barrier() {
  Call call;
  call.header.kind = static_cast<int32_t>(CollectiveKind::kBarrier);
  call.header.dtype = call.header.op = call.header.algorithm = call.header.root = -1;
  Begin(call);
  End(false);
}

void CommunicatorCpu::Reject(CollectiveKind kind, const std::string& reason) {
  Call call;
  call.header.kind = static_cast<int32_t>(kind);
  call.header.dtype = call.header.op = call.header.algorithm = call.header.root = -1;
  call.header.rejected = 1;
  const size_t n = std::min(reason.size(), kReasonBytes - 1);
  std::memcpy(call.header.reason, reason.data(), n);
  call.header.reason[n] = '\0';
  try {
    Begin(call);
  } catch (const InvalidArgumentError&) {
    // Begin raised the rejection every rank sees (naming the lowest rejecting
    // rank); this rank raises its own reason instead.
  }
  throw InvalidArgumentError(reason);
}

}  // namespace mori::ccl
