// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The CUDA kernels of the collectives (protocol_cuda.hpp) and CommunicatorCuda's
// launches. One kernel per call; block b of every rank copies and reads the same
// byte ranges, so it signals and waits only for block b of its peers. Reductions
// run over the ranks in ascending order, bf16/fp16 accumulating in fp32 and
// rounding once (the CPU implementation's order: every rank gets the same bits).
// Peers' memory is reached through mori-core's device API (peer bases of the
// symmetric heap, SignalSet, LoadAcquire, Trap).
#include <algorithm>

#include "collectives_device.cuh"
#include "mori/core/cuda_runtime.hpp"
#include "mori/core/error.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/shmem.hpp"

namespace mori::ccl {

namespace kernels {

// ------------------------------------------------------------------ kernels

// A zero-copy call's end: this block has read its ranges of every peer's input; waits
// until every peer's block has read this rank's (protocol_cuda.hpp).
__device__ void DoneReading(const Params& p, uint64_t e, int par, bool wait = true) {
  uint64_t* ready = Words(p, p.layout.ready, par, blockIdx.x);
  Post(p, ready, e, par);
  if (wait) WaitAll(p, ready, e, par, "finish reading this rank's input");
}

// Step 1 of a staged call: this block's range of the input into staging (a zero-copy
// call skips it; PushSource publishes where the input lies instead).
__device__ __forceinline__ void Stage(const Params& p, char* staging, int64_t lo, int64_t hi) {
  if (!p.desc.zero_copy) Copy(staging + lo, p.src + lo, hi - lo);
}

// All-reduce (one-shot / two-shot) and reduce-scatter.
template <int Kind, typename T, int Op>
__global__ void __launch_bounds__(kThreadsPerBlock) ReduceKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x, nb = gridDim.x, W = p.world;
  const bool zc = p.desc.zero_copy != 0;
  char* staging = At<char>(p, StagingOffset(p, par));
  const char* srcs[kMaxCudaWorld];
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  if (zc) PushSource(p, par);
  int64_t lo, hi;
  if constexpr (Kind == kOneShotKernel) {
    SplitRange(0, p.bytes, nb, b, &lo, &hi);
    Stage(p, staging, lo, hi);
    Post(p, arrive, e, par);
    WaitAll(p, arrive, e, par, "arrive");
    for (int s = 0; s < W; ++s) srcs[s] = PeerInput(p, par, s);
    // A deferred output goes through staging, which no peer reads in a zero-copy call.
    char* out = p.defer_output ? staging + lo : p.dst + lo;
    ReduceRange<T, Op>(srcs, W, lo, hi, out, nullptr);
    if (zc) {
      DoneReading(p, e, par);
      if (p.defer_output) Copy(p.dst + lo, staging + lo, hi - lo);
    }
  } else if constexpr (Kind == kTwoShotKernel) {
    // Shard s (16-byte aligned) is reduced by rank s; block b handles piece b of each.
    for (int s = 0; s < W; ++s) {
      int64_t slo, shi;
      SplitRange(0, p.bytes, W, s, &slo, &shi);
      SplitRange(slo, shi, nb, b, &lo, &hi);
      Stage(p, staging, lo, hi);
    }
    Post(p, arrive, e, par);
    WaitAll(p, arrive, e, par, "arrive");
    for (int s = 0; s < W; ++s) srcs[s] = PeerInput(p, par, s);
    {
      int64_t slo, shi;
      SplitRange(0, p.bytes, W, p.me, &slo, &shi);
      SplitRange(slo, shi, nb, b, &lo, &hi);
      char* reduced = At<char>(p, ReducedOffset(p, par));
      ReduceRange<T, Op>(srcs, W, lo, hi, reduced + lo, p.dst + lo);
    }
    // Zero-copy: the ready words also say every peer has read this piece of each of
    // this rank's shards, which the gather below overwrites when the call is in place.
    uint64_t* ready = Words(p, p.layout.ready, par, b);
    Post(p, ready, e, par);
    WaitAll(p, ready, e, par, "publish its reduced shard");
    for (int k = 1; k < W; ++k) {
      const int s = (p.me + k) % W;
      int64_t slo, shi;
      SplitRange(0, p.bytes, W, s, &slo, &shi);
      SplitRange(slo, shi, nb, b, &lo, &hi);
      Copy(p.dst + lo, PeerAt<const char>(p, ReducedOffset(p, par), s) + lo, hi - lo);
    }
  } else {  // reduce-scatter: segment s of the input (bytes / W) goes to rank s
    const int64_t seg = p.bytes / W;
    for (int s = 0; s < W; ++s) {
      SplitRange(s * seg, (s + 1) * seg, nb, b, &lo, &hi);
      Stage(p, staging, lo, hi);
    }
    Post(p, arrive, e, par);
    WaitAll(p, arrive, e, par, "arrive");
    for (int s = 0; s < W; ++s) srcs[s] = PeerInput(p, par, s);
    SplitRange(p.me * seg, (p.me + 1) * seg, nb, b, &lo, &hi);
    char* out = p.defer_output ? staging + lo : p.dst + (lo - p.me * seg);
    ReduceRange<T, Op>(srcs, W, lo, hi, out, nullptr);
    if (zc) {
      DoneReading(p, e, par);
      if (p.defer_output) Copy(p.dst + (lo - p.me * seg), staging + lo, hi - lo);
    }
  }
  Finish(p, e);
}

__global__ void __launch_bounds__(kThreadsPerBlock) AllGatherKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x;
  const bool zc = p.desc.zero_copy != 0;
  char* staging = At<char>(p, StagingOffset(p, par));
  int64_t lo, hi;
  SplitRange(0, p.bytes, gridDim.x, b, &lo, &hi);
  if (zc) PushSource(p, par);
  Stage(p, staging, lo, hi);
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  for (int k = 0; k < p.world; ++k) {
    const int s = (p.me + k) % p.world;
    const char* from = (zc && s == p.me ? p.src : PeerInput(p, par, s)) + lo;
    // x in another rank's slot of out: that slot waits in staging for the end.
    char* to = (s == p.deferred_slot ? staging : p.dst + s * p.bytes) + lo;
    if (to != from) Copy(to, from, hi - lo);  // equal: x is this rank's slot of out
  }
  if (zc) {
    DoneReading(p, e, par);
    if (p.deferred_slot >= 0) Copy(p.dst + p.deferred_slot * p.bytes + lo, staging + lo, hi - lo);
  }
  Finish(p, e);
}

__global__ void __launch_bounds__(kThreadsPerBlock) BroadcastKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x;
  const bool zc = p.desc.zero_copy != 0;
  int64_t lo, hi;
  SplitRange(0, p.bytes, gridDim.x, b, &lo, &hi);
  if (p.me == p.root) {
    if (zc) PushSource(p, par);
    Stage(p, At<char>(p, StagingOffset(p, par)), lo, hi);
  }
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  if (p.me != p.root) Copy(p.dst + lo, PeerInput(p, par, p.root) + lo, hi - lo);
  // Only the root's input is read: only the root waits for the others to finish.
  if (zc) DoneReading(p, e, par, p.me == p.root);
  Finish(p, e);
}

__device__ __forceinline__ int64_t* Rows(const Params& p, int parity, int pe) {
  return PeerAt<int64_t>(p, p.layout.rows + static_cast<size_t>(parity) * 2 * p.world * 8, pe);
}

__global__ void __launch_bounds__(kThreadsPerBlock) AllToAllKernel(Params p) {
  __shared__ int64_t src_off[kMaxCudaWorld], dst_off[kMaxCudaWorld], cnt[kMaxCudaWorld];
  __shared__ int bad;
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), b = blockIdx.x, W = p.world;
  uint64_t* arrive = Words(p, p.layout.arrive, par, b);
  if (threadIdx.x == 0) {
    // This rank's splits into rows[par] (every block writes the same values before
    // its own signal, which is what its peers' block acquires), checked here.
    int64_t* mine = Rows(p, par, p.me);
    int64_t in_sum = 0, out_sum = 0;
    bad = 0;
    for (int d = 0; d < W; ++d) {
      const int64_t in = p.in_splits ? p.in_splits[d] : p.src_rows / W;
      const int64_t out = p.out_splits ? p.out_splits[d] : p.dst_rows / W;
      mine[d] = in;
      mine[W + d] = out;
      if (in < 0 || out < 0) bad = 1;
      in_sum += in;
      out_sum += out;
    }
    if (!bad && in_sum > p.src_rows) bad = 2;
    if (!bad && out_sum > p.dst_rows) bad = 3;
    if (bad && FirstToReport(p)) {
      printf(
          "mori.ccl all_to_all (call %llu) on rank %d: %s (in_splits sum to %lld for %lld input "
          "rows; out_splits sum to %lld for %lld output rows)\n",
          static_cast<unsigned long long>(e), p.me,
          bad == 1   ? "a negative split"
          : bad == 2 ? "in_splits exceed the input's rows"
                     : "out_splits exceed the output's rows",
          static_cast<long long>(in_sum), static_cast<long long>(p.src_rows),
          static_cast<long long>(out_sum), static_cast<long long>(p.dst_rows));
    }
  }
  __syncthreads();
  if (bad) {
    // Peers trap naming this rank instead of timing out.
    Post(p, arrive, e, par, kRejectedHash);
    dev::Trap();
  }
  int64_t lo, hi;
  SplitRange(0, p.src_rows * p.row_bytes, gridDim.x, b, &lo, &hi);
  if (p.desc.zero_copy) PushSource(p, par);
  Stage(p, At<char>(p, StagingOffset(p, par)), lo, hi);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  if (threadIdx.x == 0) {
    // Every rank checks every pair (sends of s to d == what d expects from s), so
    // a disagreement traps on every rank with the same message.
    for (int s = 0; s < W; ++s) {
      const int64_t* in_s = Rows(p, par, s);
      for (int d = 0; d < W; ++d) {
        const int64_t expect = Rows(p, par, d)[W + s];
        if (in_s[d] != expect) {
          if (FirstToReport(p)) {
            printf(
                "mori.ccl all_to_all (call %llu) on rank %d: splits disagree: rank %d sends %lld "
                "rows to rank %d, which expects %lld rows from it\n",
                static_cast<unsigned long long>(e), p.me, s, static_cast<long long>(in_s[d]), d,
                static_cast<long long>(expect));
          }
          StaggeredTrap(p);
        }
      }
    }
    int64_t out_prefix = 0;
    for (int s = 0; s < W; ++s) {
      const int64_t* in_s = Rows(p, par, s);
      int64_t before = 0;
      for (int d = 0; d < p.me; ++d) before += in_s[d];
      src_off[s] = before;
      cnt[s] = in_s[p.me];
      dst_off[s] = out_prefix;
      out_prefix += cnt[s];
    }
  }
  __syncthreads();
  for (int k = 0; k < W; ++k) {
    const int s = (p.me + k) % W;
    SplitRange(0, cnt[s] * p.row_bytes, gridDim.x, b, &lo, &hi);
    Copy(p.dst + dst_off[s] * p.row_bytes + lo,
         PeerInput(p, par, s) + src_off[s] * p.row_bytes + lo, hi - lo);
  }
  if (p.desc.zero_copy) DoneReading(p, e, par);
  Finish(p, e);
}

// Barrier, and the copy engine's first step: block 0's arrive words only.
__global__ void EnterKernel(Params p, int finish) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1);
  uint64_t* arrive = Words(p, p.layout.arrive, par, 0);
  Post(p, arrive, e, par);
  WaitAll(p, arrive, e, par, "arrive");
  if (finish) Finish(p, e);
}

// The copy engine's second step: this rank's input is in ce_staging.
__global__ void StagedKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1);
  uint64_t* staged = At<uint64_t>(p, p.layout.ce_staged);
  Post(p, staged, e, par);
  WaitAll(p, staged, e, par, "stage its input");
  Finish(p, e);
}

// A rejection of the next call, into every block's arrive words on every pe.
__global__ void RejectKernel(Params p) {
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1);
  dev::Fence();
  const uint64_t w = MakeWord(e, kRejectedHash);
  for (int i = threadIdx.x; i < kMaxBlocks * p.world; i += blockDim.x) {
    uint64_t* words = Words(p, p.layout.arrive, par, i / p.world);
    dev::SignalSet(p.ctx, &words[p.me], w, i % p.world);
  }
  uint64_t* staged = At<uint64_t>(p, p.layout.ce_staged);
  const uint64_t header = (static_cast<uint64_t>(static_cast<uint32_t>(e)) << 32) | kRejectedHash;
  for (int s = threadIdx.x; s < p.world; s += blockDim.x) {
    dev::SignalSet(p.ctx, &staged[p.me], w, s);
    dev::SignalSet(p.ctx, At<uint64_t>(p, LLSlotOffset(p, par, p.me)), header, s);
  }
  Finish(p, e);
}

template <int Kind, typename T>
const void* ReduceKernelByOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return reinterpret_cast<const void*>(&ReduceKernel<Kind, T, 0>);
    case ReduceOp::kMax:
      return reinterpret_cast<const void*>(&ReduceKernel<Kind, T, 1>);
    case ReduceOp::kMin:
      return reinterpret_cast<const void*>(&ReduceKernel<Kind, T, 2>);
  }
  MORI_THROW(InvalidArgumentError, "unknown reduce op code ", static_cast<int>(op));
}

template <int Kind>
const void* ReduceKernelFor(DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kFloat32:
      return ReduceKernelByOp<Kind, float>(op);
    case DataType::kBFloat16:
      return ReduceKernelByOp<Kind, __nv_bfloat16>(op);
    case DataType::kFloat16:
      return ReduceKernelByOp<Kind, __half>(op);
    case DataType::kInt32:
      return ReduceKernelByOp<Kind, int32_t>(op);
    default:
      break;
  }
  MORI_THROW(InvalidArgumentError, "the CUDA collectives reduce float32, bfloat16, float16 and ",
             "int32, not ", DataTypeName(dtype));
}

}  // namespace kernels

using namespace kernels;

struct CommunicatorCuda::Launch {
  const void* kernel;
  int blocks;
  int threads;
  Params params;
};

CommunicatorCuda::CommunicatorCuda(void* block, size_t max_bytes, int device,
                                   std::chrono::milliseconds timeout, int max_blocks,
                                   const std::vector<int>& pes, bool zero_copy)
    : block_(static_cast<char*>(block)),
      max_bytes_(max_bytes),
      device_(device),
      timeout_ns_(KernelTimeoutNs(timeout, "timeout")),
      max_blocks_(max_blocks),
      zero_copy_(zero_copy) {
  const shmem::DeviceContext heap = shmem::GetDeviceContext();
  std::vector<char*> bases;
  ctx_ = TeamContext(heap, pes, bases);
  world_ = ctx_.n_pes;
  me_ = ctx_.my_pe;
  for (int r = 0; r < world_; ++r) pes_.push_back(pes.empty() ? r : pes[r]);
  layout_ = MakeCudaLayout(world_, max_bytes);
  if (world_ > kMaxCudaWorld) {
    MORI_THROW(NotSupportedError, "the CUDA collectives take world sizes up to ", kMaxCudaWorld,
               ", got ", world_);
  }
  MORI_CHECK_ARG(max_blocks >= 1 && max_blocks <= kMaxBlocks, "max_blocks ", max_blocks,
                 " must be in [1, ", kMaxBlocks, "]");
  MORI_CHECK_ARG(shmem::IsSymmetric(block, layout_.total_bytes),
                 "the communicator's buffer is not a symmetric block of ", layout_.total_bytes,
                 " bytes");
  for (int pe = 0; pe < world_; ++pe) {
    if (shmem::Ptr(block, pes_[pe]) == nullptr) {
      MORI_THROW(NotSupportedError, "the CUDA collectives need every pe on this node, but pe ",
                 pes_[pe], " is not load/store reachable from pe ", heap.my_pe);
    }
  }
  mori::cuda::ScopedDevice guard(device_);
  if (!bases.empty()) {
    MORI_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&team_bases_dev_), bases.size() * sizeof(char*)));
    MORI_CUDA_CHECK(cudaMemcpy(team_bases_dev_, bases.data(), bases.size() * sizeof(char*),
                               cudaMemcpyHostToDevice));
    ctx_.peer_bases = team_bases_dev_;
  }
  MORI_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  MORI_CUDA_CHECK(cudaMemset(block_, 0, CudaSignalBytes(layout_)));
  // Packets of flag 0 never match a call (calls count from 1).
  MORI_CUDA_CHECK(cudaMemset(block_ + layout_.ll, 0, layout_.total_bytes - layout_.ll));
  MORI_CUDA_CHECK(cudaDeviceSynchronize());
  shmem::BarrierAll();
}

CommunicatorCuda::~CommunicatorCuda() {
  // Unchecked: a destructor must not throw (after a trap the context is gone), and
  // cudaFree needs no current device under unified addressing.
  if (team_bases_dev_ != nullptr) (void)cudaFree(team_bases_dev_);
}

int CommunicatorCuda::BlocksFor(int64_t bytes, int max_blocks) const {
  int cap = max_blocks > 0 ? std::min(max_blocks, kMaxBlocks) : max_blocks_;
  cap = std::max(1, std::min(cap, sm_count_ > 0 ? sm_count_ : cap));
  const int64_t want = (bytes + kBytesPerBlock - 1) / kBytesPerBlock;
  return static_cast<int>(std::clamp<int64_t>(want, 1, cap));
}

CallDesc CommunicatorCuda::Describe(CollectiveKind kind, DataType dtype, int op,
                                    CudaAlgorithm algorithm, int root, int blocks, int64_t bytes,
                                    int64_t row_bytes, bool zero_copy) const {
  CallDesc d{};
  d.kind = static_cast<int32_t>(kind);
  d.dtype = kind == CollectiveKind::kBarrier ? -1 : static_cast<int32_t>(dtype);
  d.op = op;
  d.algorithm = kind == CollectiveKind::kBarrier ? -1 : static_cast<int32_t>(algorithm);
  d.root = root;
  d.blocks = blocks;
  d.bytes = bytes;
  d.row_bytes = row_bytes;
  d.zero_copy = zero_copy ? 1 : 0;
  d.hash = DescHash(d);
  return d;
}

namespace {
bool Overlaps(const void* a, size_t na, const void* b, size_t nb) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}
}  // namespace

bool CommunicatorCuda::ZeroCopy(const void* src, size_t bytes, Launch& l) {
  // The heap is the same size on every pe, so an offset inside it is valid on every
  // pe; which allocation it is does not matter (each rank reads the others' inputs
  // at the offsets they publish).
  const size_t n = bytes > 0 ? bytes : 1;
  if (!zero_copy_ || src == nullptr || !shmem::IsSymmetric(src, n) ||
      Overlaps(src, n, block_, layout_.total_bytes)) {
    return false;
  }
  l.params.src_offset = static_cast<const char*>(src) - ctx_.my_base;
  ++zero_copy_calls_;
  return true;
}

void CommunicatorCuda::Enqueue(Launch& l, uintptr_t stream) {
  l.params.ctx = ctx_;
  l.params.block = block_;
  l.params.layout = layout_;
  l.params.world = world_;
  l.params.me = me_;
  l.params.timeout_ns = timeout_ns_;
  void* args[] = {&l.params};
  MORI_CUDA_CHECK(cudaLaunchKernel(l.kernel, dim3(l.blocks), dim3(l.threads), args, 0,
                                   reinterpret_cast<cudaStream_t>(stream)));
  MORI_CUDA_CHECK(cudaGetLastError());
  ++calls_;
}

void CommunicatorCuda::AllReduce(const void* src, void* dst, size_t count, DataType dtype,
                                 ReduceOp op, CudaAlgorithm algorithm, int max_blocks,
                                 uintptr_t stream) {
  const int64_t bytes = static_cast<int64_t>(count * DataTypeSize(dtype));
  if (static_cast<size_t>(bytes) > max_bytes_) {
    Reject(StrCat("all_reduce of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  MORI_CHECK_ARG(algorithm == CudaAlgorithm::kOneShot || algorithm == CudaAlgorithm::kTwoShot ||
                     algorithm == CudaAlgorithm::kOneShotLL,
                 "all_reduce algorithm code ", static_cast<int>(algorithm));
  if (algorithm == CudaAlgorithm::kOneShotLL && static_cast<size_t>(bytes) > ll_max_bytes()) {
    Reject(StrCat("one_shot_ll all_reduce of ", bytes, " bytes exceeds its ", ll_max_bytes()),
           stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  Launch l{};
  l.blocks = BlocksFor(bytes, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = algorithm == CudaAlgorithm::kOneShot   ? ReduceKernelFor<kOneShotKernel>(dtype, op)
             : algorithm == CudaAlgorithm::kTwoShot ? ReduceKernelFor<kTwoShotKernel>(dtype, op)
                                                    : LLKernelFor(dtype, op);
  const bool zc = algorithm != CudaAlgorithm::kOneShotLL && ZeroCopy(src, bytes, l);
  l.params.desc = Describe(CollectiveKind::kAllReduce, dtype, static_cast<int>(op), algorithm, -1,
                           l.blocks, bytes, 0, zc);
  // In place (the only overlap the caller allows): one-shot overwrites what peers
  // read; two-shot's own exchange orders it (protocol_cuda.hpp).
  l.params.defer_output =
      zc && algorithm == CudaAlgorithm::kOneShot &&
      Overlaps(src, static_cast<size_t>(bytes), dst, static_cast<size_t>(bytes));
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = bytes;
  Enqueue(l, stream);
}

void CommunicatorCuda::ReduceScatter(const void* src, void* dst, size_t count, DataType dtype,
                                     ReduceOp op, int max_blocks, uintptr_t stream) {
  const int64_t bytes = static_cast<int64_t>(count * DataTypeSize(dtype)) * world_;
  if (static_cast<size_t>(bytes) > max_bytes_) {
    Reject(StrCat("reduce_scatter of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  Launch l{};
  l.blocks = BlocksFor(bytes / world_, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = ReduceKernelFor<kReduceScatterKernel>(dtype, op);
  const bool zc = ZeroCopy(src, bytes, l);
  l.params.desc = Describe(CollectiveKind::kReduceScatter, dtype, static_cast<int>(op),
                           CudaAlgorithm::kSm, -1, l.blocks, bytes, 0, zc);
  // Only this rank reads its own segment, and only where it writes it: an output that
  // is exactly that segment need not wait.
  const size_t seg = static_cast<size_t>(bytes) / world_;
  l.params.defer_output = zc && Overlaps(src, static_cast<size_t>(bytes), dst, seg) &&
                          dst != static_cast<const char*>(src) + me_ * seg;
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = bytes;
  Enqueue(l, stream);
}

void CommunicatorCuda::CopyEngineCall(const CallDesc& desc, const void* src, size_t bytes,
                                      void* dst, size_t chunk_bytes, bool all_to_all,
                                      uintptr_t stream) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  Launch enter{};
  enter.kernel = reinterpret_cast<const void*>(&EnterKernel);
  enter.blocks = 1;
  enter.threads = 32;
  enter.params.desc = desc;
  enter.params.ctx = ctx_;
  enter.params.block = block_;
  enter.params.layout = layout_;
  enter.params.world = world_;
  enter.params.me = me_;
  enter.params.timeout_ns = timeout_ns_;
  int finish = 0;
  void* enter_args[] = {&enter.params, &finish};
  MORI_CUDA_CHECK(cudaLaunchKernel(enter.kernel, dim3(1), dim3(32), enter_args, 0, s));
  MORI_CUDA_CHECK(cudaGetLastError());
  char* staging = block_ + layout_.ce_staging;
  if (bytes > 0) {
    MORI_CUDA_CHECK(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToDevice, s));
  }
  void* staged_args[] = {&enter.params};
  MORI_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&StagedKernel), dim3(1), dim3(32),
                                   staged_args, 0, s));
  MORI_CUDA_CHECK(cudaGetLastError());
  char* out = static_cast<char*>(dst);
  for (int k = 0; k < world_; ++k) {
    const int pe = (me_ + k) % world_;
    const char* peer = static_cast<const char*>(shmem::Ptr(staging, pes_[pe]));
    const size_t from = all_to_all ? static_cast<size_t>(me_) * chunk_bytes : 0;
    if (chunk_bytes > 0) {
      MORI_CUDA_CHECK(cudaMemcpyAsync(out + static_cast<size_t>(pe) * chunk_bytes, peer + from,
                                      chunk_bytes, cudaMemcpyDefault, s));
    }
  }
  ++calls_;
}

void CommunicatorCuda::AllGather(const void* src, void* dst, size_t bytes, DataType dtype,
                                 CudaAlgorithm algorithm, int max_blocks, uintptr_t stream) {
  if (bytes > max_bytes_) {
    Reject(StrCat("all_gather of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  const int64_t b = static_cast<int64_t>(bytes);
  if (algorithm == CudaAlgorithm::kCopyEngine) {
    const CallDesc d = Describe(CollectiveKind::kAllGather, dtype, -1, algorithm, -1, 1, b, 0);
    CopyEngineCall(d, src, bytes, dst, bytes, false, stream);
    return;
  }
  Launch l{};
  l.blocks = BlocksFor(b, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = reinterpret_cast<const void*>(&AllGatherKernel);
  const bool zc = ZeroCopy(src, bytes, l);
  l.params.desc =
      Describe(CollectiveKind::kAllGather, dtype, -1, CudaAlgorithm::kSm, -1, l.blocks, b, 0, zc);
  if (zc && bytes > 0 && Overlaps(src, bytes, dst, bytes * world_)) {
    // x is a whole slot of out (the caller checked); its own slot needs no copy.
    const int slot = static_cast<int>((static_cast<const char*>(src) - static_cast<char*>(dst)) /
                                      static_cast<int64_t>(bytes));
    l.params.deferred_slot = slot == me_ ? -1 : slot;
  }
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = b;
  Enqueue(l, stream);
}

void CommunicatorCuda::AllToAll(const void* src, void* dst, size_t row_bytes, int64_t src_rows,
                                int64_t dst_rows, const int64_t* in_splits,
                                const int64_t* out_splits, DataType dtype, CudaAlgorithm algorithm,
                                int max_blocks, uintptr_t stream) {
  const size_t bytes = static_cast<size_t>(src_rows) * row_bytes;
  if (bytes > max_bytes_) {
    Reject(StrCat("all_to_all of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  const int64_t rb = static_cast<int64_t>(row_bytes);
  if (algorithm == CudaAlgorithm::kCopyEngine) {
    MORI_CHECK_ARG(in_splits == nullptr && out_splits == nullptr && src_rows % world_ == 0 &&
                       dst_rows == src_rows,
                   "the copy-engine all_to_all takes equal splits only");
    const CallDesc d = Describe(CollectiveKind::kAllToAll, dtype, -1, algorithm, -1, 1,
                                static_cast<int64_t>(bytes), rb);
    CopyEngineCall(d, src, bytes, dst, bytes / world_, true, stream);
    return;
  }
  Launch l{};
  // Ranks of an all-to-all-v move different byte counts: the grid comes from the
  // bound alone, so that every rank launches the same one.
  l.blocks = BlocksFor(static_cast<int64_t>(kMaxBlocks) * kBytesPerBlock, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = reinterpret_cast<const void*>(&AllToAllKernel);
  // out never overlaps x (the caller checked).
  const bool zc = ZeroCopy(src, bytes, l);
  l.params.desc =
      Describe(CollectiveKind::kAllToAll, dtype, -1, CudaAlgorithm::kSm, -1, l.blocks, -1, rb, zc);
  l.params.src = static_cast<const char*>(src);
  l.params.dst = static_cast<char*>(dst);
  l.params.bytes = static_cast<int64_t>(bytes);
  l.params.row_bytes = rb;
  l.params.src_rows = src_rows;
  l.params.dst_rows = dst_rows;
  l.params.in_splits = in_splits;
  l.params.out_splits = out_splits;
  Enqueue(l, stream);
}

void CommunicatorCuda::Broadcast(void* buf, size_t bytes, DataType dtype, int root, int max_blocks,
                                 uintptr_t stream) {
  if (bytes > max_bytes_) {
    Reject(StrCat("broadcast of ", bytes, " bytes exceeds max_bytes ", max_bytes_), stream);
  }
  if (root < 0 || root >= world_) {
    Reject(StrCat("broadcast src ", root, " out of range [0, ", world_, ")"), stream);
  }
  mori::cuda::ScopedDevice guard(device_);
  Launch l{};
  const int64_t b = static_cast<int64_t>(bytes);
  l.blocks = BlocksFor(b, max_blocks);
  l.threads = kThreadsPerBlock;
  l.kernel = reinterpret_cast<const void*>(&BroadcastKernel);
  const bool zc = ZeroCopy(buf, bytes, l);
  l.params.desc =
      Describe(CollectiveKind::kBroadcast, dtype, -1, CudaAlgorithm::kSm, root, l.blocks, b, 0, zc);
  l.params.src = static_cast<const char*>(buf);
  l.params.dst = static_cast<char*>(buf);
  l.params.bytes = b;
  l.params.root = root;
  Enqueue(l, stream);
}

void CommunicatorCuda::Barrier(uintptr_t stream) {
  mori::cuda::ScopedDevice guard(device_);
  Params p{};
  p.desc =
      Describe(CollectiveKind::kBarrier, DataType::kFloat32, -1, CudaAlgorithm::kSm, -1, 1, 0, 0);
  p.ctx = ctx_;
  p.block = block_;
  p.layout = layout_;
  p.world = world_;
  p.me = me_;
  p.timeout_ns = timeout_ns_;
  int finish = 1;
  void* args[] = {&p, &finish};
  MORI_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&EnterKernel), dim3(1), dim3(32),
                                   args, 0, reinterpret_cast<cudaStream_t>(stream)));
  MORI_CUDA_CHECK(cudaGetLastError());
  ++calls_;
}

void CommunicatorCuda::Reject(const std::string& reason, uintptr_t stream) {
  {
    mori::cuda::ScopedDevice guard(device_);
    Launch l{};
    l.kernel = reinterpret_cast<const void*>(&RejectKernel);
    l.blocks = 1;
    l.threads = 256;
    Enqueue(l, stream);
  }
  throw InvalidArgumentError(reason);
}

}  // namespace mori::ccl
