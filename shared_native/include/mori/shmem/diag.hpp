// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Diagnostic and benchmark kernels of the CUDA symmetric heap (they exercise the
// device API of mori/shmem/device.cuh). Host-only declarations: streams travel as
// integers (a cudaStream_t), so no CUDA header leaks into the includer. Every
// launcher checks its arguments, launches on `stream` (on the heap's device) and
// checks the launch; none synchronizes. Without CUDA they throw NotSupportedError.

#include <cstddef>
#include <cstdint>
#include <string>

#include "mori/core/macros.hpp"
#include "mori/shmem/context.hpp"

namespace mori::shmem::diag {

// Which device-API form moves the bytes: each thread, each warp or each block
// takes a contiguous chunk; the _nbi forms are followed by Quiet().
enum class Scope : int { kThread = 0, kWarp = 1, kBlock = 2 };

struct CopyLaunch {
  Scope scope = Scope::kBlock;
  bool nbi = false;
  int blocks = 1;  // the bytes are split evenly (16-byte multiples) across blocks
  int threads_per_block = 512;
  uintptr_t stream = 0;  // cudaStream_t
};

// Parses "thread", "warp", "block", optionally suffixed "_nbi".
MORI_API CopyLaunch ParseScope(const std::string& scope);

// Kernel put: local `src` (device memory of the heap's GPU) -> pe's copy of dst_sym.
MORI_API void PutKernel(const DeviceContext& ctx, void* dst_sym, const void* src, size_t nbytes,
                        int pe, const CopyLaunch& launch);
// Kernel get: pe's copy of src_sym -> local `dst`.
MORI_API void GetKernel(const DeviceContext& ctx, void* dst, const void* src_sym, size_t nbytes,
                        int pe, const CopyLaunch& launch);

struct SignalStressArgs {
  void* buf_sym = nullptr;         // symmetric, >= slots * slot_bytes bytes
  uint64_t* flags_sym = nullptr;   // symmetric, 2 words, zero on both pes before the run
  uint64_t* mismatches = nullptr;  // local device word; the receiver adds mismatching words
  size_t slot_bytes = 4096;        // multiple of 8
  int slots = 4;                   // payload ring depth
  int64_t rounds = 10000;
  int peer = 1;
  bool sender = true;
  int threads_per_block = 256;
  uint64_t timeout_ns = 0;  // per wait; 0 waits forever
  uintptr_t stream = 0;
};

// Data-then-flag ordering stress between this pe and args.peer, one block each.
// For round r = 1..rounds the sender fills ring slot (r-1) % slots of its own
// buffer with a pattern of r, PutBlock's it to the peer, then SignalSet(flags[0],
// r) on the peer; the receiver waits flags[0] >= r, checks the slot word by word
// (counting mismatches) and acks with SignalSet(flags[1], r) on the sender, which
// waits for that ack before it reuses the slot.
MORI_API void SignalStressKernel(const DeviceContext& ctx, const SignalStressArgs& args);

// `iters` back-to-back BarrierAllBlock in one block (latency benchmark).
MORI_API void BarrierLoopKernel(const DeviceContext& ctx, int iters, uint64_t timeout_ns,
                                uintptr_t stream);

// The GPU's global timer (ns; %globaltimer, one clock for every context on the GPU),
// read by a kernel on `device`. Synchronizes that launch.
MORI_API uint64_t GlobalTimerNs(int device);

// A kernel of `blocks` x `threads` on `device` that spins until the global timer
// reaches at_ns (at most max_wait_ns after it starts), then fails its launch the way
// mori's kernels do: thread 0 of block 0 prints "mori trap probe <tag>: trapping at
// <ns>" and traps (TrapReported + Trap), every other thread traps after it
// (TrapAfterReport). Processes that launch it with one at_ns trap at the same moment:
// the probe of how a host sees simultaneous traps on one GPU. Does not synchronize.
MORI_API void TrapProbeKernel(int device, uint64_t at_ns, uint64_t max_wait_ns, int tag, int blocks,
                              int threads, uintptr_t stream);

}  // namespace mori::shmem::diag
