// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// How fast can a kernel push bytes into a peer GPU over NVLink, and by which
// mechanism? Measures, between GPU 0 and GPU 1 of one host, one direction alone and
// both directions at once (what dispatch and combine do: every rank sends while it
// receives):
//   sm    : each thread loads 8 x 16 B from local memory, then stores them to the peer
//   tma   : one thread per block moves 32 KiB chunks local -> shared (cp.async.bulk,
//           mbarrier) -> peer (cp.async.bulk.global.shared::cta), 4 stages in flight
//   ce    : cudaMemcpyPeerAsync (the copy engines), the reference
// at several block counts. It decides whether mori-ep's bulk rows should leave through
// TMA instead of SM stores (BENCHMARKS.md, "SM store ceiling").
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/pwc packages/mori-ep/tools/peer_write_ceiling.cu
//   /tmp/pwc [MiB per direction, default 256]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;
constexpr uint32_t kChunk = 32 * 1024;
constexpr int kStages = 4;

__global__ void __launch_bounds__(kThreads)
    SmCopy(const int4* __restrict__ src, int4* __restrict__ dst, size_t n16) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads * kUnroll;
  for (size_t base = static_cast<size_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < n16;
       base += stride) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      size_t i = base + static_cast<size_t>(u) * kThreads;
      if (i < n16) v[u] = __ldg(src + i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      size_t i = base + static_cast<size_t>(u) * kThreads;
      if (i < n16) dst[i] = v[u];
    }
  }
}

__device__ __forceinline__ uint32_t Smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__global__ void TmaCopy(const char* __restrict__ src, char* __restrict__ dst, size_t bytes) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bar[kStages];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < kStages; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(Smem(&bar[s])));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  uint32_t k = 0;
  for (size_t c = blockIdx.x; c < chunks; c += gridDim.x, ++k) {
    const uint32_t st = k % kStages;
    const uint32_t len =
        static_cast<uint32_t>(bytes - c * kChunk < kChunk ? bytes - c * kChunk : kChunk);
    char* buf = smem + st * kChunk;
    // The store that used this stage kStages chunks ago must have read its smem.
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kStages - 1) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(Smem(&bar[st])),
                 "r"(len)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(Smem(buf)),
        "l"(src + c * kChunk), "r"(len), "r"(Smem(&bar[st]))
        : "memory");
    const uint32_t parity = (k / kStages) & 1;
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra WAIT_%=;\n}" ::"r"(Smem(&bar[st])),
        "r"(parity)
        : "memory");
    asm volatile(
        "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + c * kChunk),
        "r"(Smem(buf)), "r"(len)
        : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

struct Dir {
  int dev, peer;
  char* src;  // on dev
  char* dst;  // on peer
  cudaStream_t s;
  cudaEvent_t a, b;
};

void Launch(const char* kind, int blocks, Dir& d, size_t bytes) {
  CK(cudaSetDevice(d.dev));
  if (kind[0] == 's') {
    SmCopy<<<blocks, kThreads, 0, d.s>>>(reinterpret_cast<const int4*>(d.src),
                                         reinterpret_cast<int4*>(d.dst), bytes / 16);
  } else if (kind[0] == 't') {
    TmaCopy<<<blocks, 32, kStages * kChunk, d.s>>>(d.src, d.dst, bytes);
  } else {
    CK(cudaMemcpyPeerAsync(d.dst, d.peer, d.src, d.dev, bytes, d.s));
  }
  CK(cudaGetLastError());
}

// Median GB/s per direction over reps; both directions run at once when dirs has two.
std::vector<double> Measure(const char* kind, int blocks, std::vector<Dir>& dirs, size_t bytes) {
  const int reps = 9;
  std::vector<std::vector<double>> gbs(dirs.size());
  for (int r = -2; r < reps; ++r) {
    for (Dir& d : dirs) {
      CK(cudaSetDevice(d.dev));
      CK(cudaEventRecord(d.a, d.s));
      Launch(kind, blocks, d, bytes);
      CK(cudaEventRecord(d.b, d.s));
    }
    for (size_t i = 0; i < dirs.size(); ++i) {
      CK(cudaEventSynchronize(dirs[i].b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, dirs[i].a, dirs[i].b));
      if (r >= 0) gbs[i].push_back(bytes / (ms * 1e-3) / 1e9);
    }
  }
  std::vector<double> med;
  for (auto& v : gbs) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const size_t bytes = mib << 20;
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("peer_write_ceiling: needs 2 GPUs, found %d\n", n);
    return 0;
  }
  std::vector<Dir> both(2);
  for (int i = 0; i < 2; ++i) {
    Dir& d = both[i];
    d.dev = i;
    d.peer = 1 - i;
    CK(cudaSetDevice(d.dev));
    cudaError_t e = cudaDeviceEnablePeerAccess(d.peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();
    else
      CK(e);
    CK(cudaFuncSetAttribute(TmaCopy, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            kStages * kChunk));
    CK(cudaMalloc(&d.src, bytes));
    CK(cudaMemset(d.src, 0x5a + i, bytes));
    CK(cudaStreamCreateWithFlags(&d.s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&d.a));
    CK(cudaEventCreate(&d.b));
  }
  for (int i = 0; i < 2; ++i) {
    CK(cudaSetDevice(both[i].peer));
    CK(cudaMalloc(&both[i].dst, bytes));
  }
  std::printf("peer_write_ceiling: %zu MiB per direction, median of 9, GB/s per direction\n", mib);
  std::printf(
      "| mechanism | blocks | one way | both ways, 0->1 | both ways, 1->0 "
      "|\n|---|---:|---:|---:|---:|\n");
  const char* kinds[] = {"ce", "sm", "tma"};
  for (const char* kind : kinds) {
    std::vector<int> grid = {24, 48, 96, 132};
    if (kind[0] == 'c') grid = {0};
    for (int blocks : grid) {
      std::vector<Dir> one = {both[0]};
      double uni = Measure(kind, blocks, one, bytes)[0];
      std::vector<double> bi = Measure(kind, blocks, both, bytes);
      std::printf("| %s | %d | %.1f | %.1f | %.1f |\n", kind, blocks, uni, bi[0], bi[1]);
    }
  }
  // The bytes arrived intact (last writes were TMA, both ways).
  for (int i = 0; i < 2; ++i) {
    std::vector<unsigned char> h(4096);
    CK(cudaSetDevice(both[i].peer));
    CK(cudaMemcpy(h.data(), both[i].dst + bytes - 4096, 4096, cudaMemcpyDeviceToHost));
    for (unsigned char c : h) {
      if (c != static_cast<unsigned char>(0x5a + i)) {
        std::printf("MISMATCH in direction %d->%d\n", i, 1 - i);
        return 1;
      }
    }
  }
  std::printf("bytes verified\n");
  return 0;
}
