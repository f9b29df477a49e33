// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// one_shot_ll, the all-reduce whose packets carry their own flag (protocol_cuda.hpp):
// each rank stores its input as 8-byte packets into its slot of every peer's packet
// buffer and reduces the peers' packets in rank order as their flags turn.
#include "collectives_device.cuh"
#include "mori/core/error.hpp"

namespace mori::ccl {

namespace kernels {

// ------------------------------------------------------------------ one_shot_ll

__device__ __forceinline__ void StoreRelaxed(uint64_t* addr, uint64_t value) {
  asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(addr), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t LoadRelaxed(const uint64_t* addr) {
  uint64_t value;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(value) : "l"(addr) : "memory");
  return value;
}

// Spins until packet `*addr` carries `flag` (bounded); returns it.
__device__ __forceinline__ uint64_t WaitPacket(const Params& p, const uint64_t* addr, uint32_t flag,
                                               int from, uint64_t e) {
  uint64_t v = LoadRelaxed(addr);
  if (static_cast<uint32_t>(v >> 32) == flag) return v;
  const uint64_t t0 = dev::GlobalTimerNs();
  while (static_cast<uint32_t>((v = LoadRelaxed(addr)) >> 32) != flag) {
    if (dev::GlobalTimerNs() - t0 > p.timeout_ns) {
      TrapTimeout(p, from, e, MakeWord(v >> 32, 0), "send its packets");
    }
  }
  return v;
}

// 32-bit word i of the input as elements of T (zero past `bytes`); element loads, so
// any T-aligned input works.
template <typename T>
__device__ __forceinline__ uint32_t LoadWord(const char* src, int64_t bytes, int64_t i) {
  if constexpr (sizeof(T) == 4) {
    return reinterpret_cast<const uint32_t*>(src)[i];
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
    const uint32_t lo = h[2 * i];
    const uint32_t hi = 4 * i + 2 < bytes ? h[2 * i + 1] : 0u;
    return lo | (hi << 16);
  }
}

template <typename T>
__device__ __forceinline__ T WordElem(uint32_t w, int k) {
  if constexpr (sizeof(T) == 4) {
    T v;
    memcpy(&v, &w, 4);
    return v;
  } else {
    const uint16_t bits = static_cast<uint16_t>(w >> (16 * k));
    T v;
    memcpy(&v, &bits, 2);
    return v;
  }
}

// One kernel: push this rank's words to every pe, check every pe's header, reduce the
// block's words as the peers' packets arrive (rank order, fp32, one rounding).
template <typename T, int Op>
__global__ void __launch_bounds__(kThreadsPerBlock) AllReduceLLKernel(Params p) {
  using E = Elem<T>;
  using Acc = typename E::Acc;
  constexpr int kPer = 4 / sizeof(T);
  const uint64_t e = CallEpoch(p);
  const int par = static_cast<int>(e & 1), W = p.world;
  const uint32_t flag = static_cast<uint32_t>(e);
  const int64_t nw = (p.bytes + 3) / 4;
  const int64_t per = (nw + gridDim.x - 1) / gridDim.x;
  const int64_t wlo = min(nw, per * blockIdx.x), whi = min(nw, wlo + per);
  const size_t mine = LLSlotOffset(p, par, p.me);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *At<CallDesc>(p, DescOffset(p, par)) = p.desc;
    dev::Fence();
    for (int s = 0; s < W; ++s) {
      dev::StoreRelease(PeerAt<uint64_t>(p, mine, s),
                        (static_cast<uint64_t>(flag) << 32) | p.desc.hash);
    }
  }
  for (int64_t i = wlo + threadIdx.x; i < whi; i += blockDim.x) {
    const uint64_t pkt = (static_cast<uint64_t>(flag) << 32) | LoadWord<T>(p.src, p.bytes, i);
    for (int k = 0; k < W; ++k) {
      const int s = (p.me + k) % W;
      StoreRelaxed(PeerAt<uint64_t>(p, mine + 8 * (1 + i), s), pkt);
    }
  }
  // Every block checks every header before it writes a byte: calls that differ never mix.
  for (int s = threadIdx.x; s < W; s += blockDim.x) {
    const uint64_t* header = At<const uint64_t>(p, LLSlotOffset(p, par, s));
    uint64_t h = dev::LoadAcquire(header);
    if (static_cast<uint32_t>(h >> 32) != flag) {
      const uint64_t t0 = dev::GlobalTimerNs();
      while (static_cast<uint32_t>((h = dev::LoadAcquire(header)) >> 32) != flag) {
        if (dev::GlobalTimerNs() - t0 > p.timeout_ns) {
          TrapTimeout(p, s, e, MakeWord(h >> 32, 0), "arrive");
        }
      }
    }
    const uint32_t hash = static_cast<uint32_t>(h) & kHashMask;
    if (hash != p.desc.hash) TrapMismatch(p, s, e, par, MakeWord(e, hash));
  }
  __syncthreads();
  for (int64_t i = wlo + threadIdx.x; i < whi; i += blockDim.x) {
    Acc acc[kPer];
    for (int s = 0; s < W; ++s) {
      const uint64_t* pkt = At<const uint64_t>(p, LLSlotOffset(p, par, s) + 8 * (1 + i));
      const uint32_t w = static_cast<uint32_t>(WaitPacket(p, pkt, flag, s, e));
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const Acc v = E::Load(WordElem<T>(w, k));
        acc[k] = s == 0 ? First<Op, Acc>(v) : Combine<Op, Acc>(acc[k], v);
      }
    }
    T* out = reinterpret_cast<T*>(p.dst);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t el = i * kPer + k;
      if (el * static_cast<int64_t>(sizeof(T)) < p.bytes) out[el] = E::Store(acc[k]);
    }
  }
  Finish(p, e);
}

template <typename T>
const void* LLKernelByOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return reinterpret_cast<const void*>(&AllReduceLLKernel<T, 0>);
    case ReduceOp::kMax:
      return reinterpret_cast<const void*>(&AllReduceLLKernel<T, 1>);
    case ReduceOp::kMin:
      return reinterpret_cast<const void*>(&AllReduceLLKernel<T, 2>);
  }
  MORI_THROW(InvalidArgumentError, "unknown reduce op code ", static_cast<int>(op));
}

}  // namespace kernels

const void* LLKernelFor(DataType dtype, ReduceOp op) {
  using namespace kernels;
  switch (dtype) {
    case DataType::kFloat32:
      return LLKernelByOp<float>(op);
    case DataType::kBFloat16:
      return LLKernelByOp<__nv_bfloat16>(op);
    case DataType::kFloat16:
      return LLKernelByOp<__half>(op);
    case DataType::kInt32:
      return LLKernelByOp<int32_t>(op);
    default:
      break;
  }
  MORI_THROW(InvalidArgumentError, "the CUDA collectives reduce float32, bfloat16, float16 and ",
             "int32, not ", DataTypeName(dtype));
}

}  // namespace mori::ccl
