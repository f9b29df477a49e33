// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// Every host launcher of mori-ep's dispatch/combine kernels, by mode (as DeepEP's
// kernels/api.cuh). One convention for every mode: a mode's host class
// (<mode>/cuda.cu) fills the kernel's parameter struct (<mode>/kernels/params.hpp)
// and calls a launcher declared here; the launcher is defined in the kernel file
// (<mode>/kernels/*.cu), picks the kernel instantiation and launches it on `stream`
// (a cudaStream_t as an integer), checking the launch. The host never holds a
// kernel pointer. Plain C++ (no CUDA types): the parameter structs are only
// declared here, so this header includes no mode's headers.

#include <cstdint>

#include "common/launch_shape.hpp"

namespace mori::ep {

namespace intranode {

struct Common;
struct DispatchParams;
struct DispatchScratch;
struct CombineParams;

// intranode/kernels/dispatch.cu. The dispatch kernel on launch.block_num blocks of
// launch.warp_per_block warps: up to kNarrowThreads threads a block, the 512-thread
// build moving kseg-word segments (4, else 8), beyond that the 1024-thread build (4);
// static or dynamic (work handed out by a counter), checking a receive cap (capped:
// MORI's max_total_recv_tokens below world x max tokens) or built without the check.
void LaunchDispatch(const DispatchParams& p, const DispatchScratch& scratch, int kseg, bool dynamic,
                    bool capped, LaunchShape launch, uintptr_t stream);
// How many blocks of `warps` warps of that kernel an SM keeps resident.
int DispatchBlocksPerSm(int warps, int kseg, bool dynamic, bool capped);
// One warp posts a rejected count row for the next epoch to every pe and advances
// the epoch (IntraNodeCuda::RejectDispatch).
void LaunchRejectDispatch(const Common& c, uintptr_t stream);

// intranode/kernels/combine.cu. The combine kernel of `path` (CombinePath) on
// launch.block_num blocks of launch.warp_per_block warps (the 512-thread build up to
// kNarrowThreads, else the 1024-thread one), its rows crossing as `wire`
// (CombineWire: the input's own dtype, fp8 e4m3 bytes for fp8 input or bf16 input
// with fp8_cast, or fp8_blockwise's blocks and scales).
void LaunchCombine(const CombineParams& p, int path, int wire, LaunchShape launch,
                   uintptr_t stream);
// How many blocks of `warps` warps of that kernel an SM keeps resident.
int CombineBlocksPerSm(int warps, int path, int wire);
// One warp posts a rejected combine word of epoch *epoch (device memory) to every pe,
// for every group (IntraNodeCuda::RejectCombine).
void LaunchRejectCombine(const Common& c, const uint64_t* epoch, uintptr_t stream);

}  // namespace intranode

namespace low_latency {

struct LlParams;

// low_latency/kernels/dispatch.cu. The dispatch kernel running p.phases (dispatch
// phases only: send, receive, reject) on `blocks` blocks of `threads` threads
// (at most kLlMaxWarps warps), with max_tokens words of dynamic shared memory when
// it sends.
void LaunchDispatch(const LlParams& p, int blocks, int threads, uintptr_t stream);
// low_latency/kernels/combine.cu. The combine kernel running p.phases (combine
// phases only: send, receive, reject).
void LaunchCombine(const LlParams& p, int blocks, int threads, uintptr_t stream);

}  // namespace low_latency

namespace balanced {

struct PlannerParams;
struct Common;
struct DevicePlan;
struct PoolArgs;

// balanced/kernels/planner.cu. The planner in one launch on `stream`: every block plans
// the tables (block 0 writes them) and computes dst for its range of tokens.
void LaunchPlanner(const PlannerParams& p, uintptr_t stream);

// balanced/kernels/data.cu: the data paths (BalancedCuda calls them; params in
// balanced/kernels/params.hpp, op and stage codes there too).
// Posts this rank's verdict on `call` (its CallKind; and, with tpe, its counts row) to
// every rank; unless post_only, waits for every rank's and traps naming a refusing rank
// or one whose call differs.
void LaunchEntry(const Common& c, uint64_t call, uint32_t kind, bool refused, bool post_only,
                 const int32_t* tpe, int op, uintptr_t stream);
// A barrier over every rank (barrier number n) at `stage` of `op`.
void LaunchBarrier(const Common& c, uint64_t n, uint64_t call, int op, int stage, uintptr_t stream);
// Traps, naming the code and values, when the planner's error record is set.
void LaunchPlannerCheck(const int32_t* error, int rank, uintptr_t stream);
// Every primary pair's row (and every pair's weight, and fresh: every duplicate's
// primary slot) into its rank's block.
void LaunchDispatchRows(const Common& c, const DevicePlan& p, const uint16_t* hidden,
                        int64_t row_stride, const float* weights, bool fresh, uintptr_t stream);
// This rank's duplicate groups from its dup_src (scratch: [2, NvS] int32).
void LaunchDupGroups(const Common& c, const DevicePlan& p, int32_t* scratch, uintptr_t stream);
// Copies each duplicate's primary row into it and zeroes the pad rows.
void LaunchExpandZero(const Common& c, const DevicePlan& p, uintptr_t stream);
// Duplicate sums, barrier n, then the gather into out [S, H] (and out_w [S, K]).
void LaunchCombine(const Common& c, const DevicePlan& p, uint16_t* out, float* out_w, uint64_t n,
                   uint64_t call, uintptr_t stream);
// The owners' pushes into the slots (then the caller's barrier).
void LaunchPrefetch(const Common& c, const int32_t* copy, const PoolArgs& a, uintptr_t stream);
// The owners' ascending sums, barrier n, then each rank zeroes its consumed slots.
void LaunchReduceGrad(const Common& c, const int32_t* copy, const PoolArgs& a, uint64_t n,
                      uint64_t call, uintptr_t stream);

}  // namespace balanced

}  // namespace mori::ep
