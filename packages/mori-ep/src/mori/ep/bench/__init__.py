# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""Benchmark of EpDispatchCombineOp (intra-node) beside a naive all_to_all baseline.

    python -m mori.ep.bench [--world-size 2] [--tokens 128,512,4096] [--dtype bf16,fp8]
                            [--block-num 24,96] [--warp-per-block 16] [--iters 20]
                            [--kernel-type IntraNode,IntraNodeLL,AsyncLL,standard-moe,deepep-ll]
                            [--combine-quant none,fp8_blockwise]
                            [--overlap] [--json PATH] [--plot PATH]

Starts ``--world-size`` local processes (or runs as one rank under torchrun), one per
GPU. Per token count, dtype and block count it times mori's dispatch and combine,
each captured in its own CUDA graph and replayed back to back (``--iters`` trials of
``--reps`` dispatch+combine pairs, CUDA events around every replay, median over all
pairs but the first of each trial, which absorbs the ranks' launch skew); those
per-call figures include the gap between graph replays. A further ``--reps`` pairs
run under the profiler for each kernel's own GPU time (``kern us``, median of the
CUDA activity records, the way DeepEP measures its kernels). Baseline, in the same
run: the same dispatch and combine written with
``torch.distributed.all_to_all_single`` over NCCL (permute rows by destination rank,
exchange counts, all_to_all the rows and their metadata; combine sends the rows back
and sums them per token in fp32), timed with CUDA events, eagerly (its split sizes
need the counts on the host, so it cannot be graph-captured). Both run on the same
random top-k routing, and their combine outputs are compared.

Bandwidth, per rank (GB/s = 1e9 bytes/s), in two definitions:
  * incl. local: bytes this rank receives in dispatch, counting the copy to itself
    (MORI's and DeepEP's definition): ``recv rows x (hidden x elem + scale bytes)``;
    combine: the bytes it sends back, ``recv rows x hidden x 2`` (bf16).
  * cross-GPU: the same, counting only rows from (dispatch) / to (combine) other ranks.
Weights and indices (8 bytes per top-k slot) move too but are not counted, as in MORI.
``--combine-quant none,fp8_blockwise`` adds, for the token-major kernel types, an op
built with ``quant_type="fp8_blockwise"`` (MORI's blockwise fp8 combine; its dispatch is
the bf16 op's): its rows are labelled ``<impl> fp8_blockwise``, its combine GB/s count
the bytes that cross (``recv rows x (align4(hidden) + 4 x MORI_FP8_COMBINE_SCALE_DIM)``,
7392 of bf16's 14336 per row at hidden 7168), and a table puts its bytes sent and
times beside the bf16 combine of the same case, with the largest difference of its
output from the bf16 combine's relative to the largest bf16 value.
A peer-copy reference (rank 0's copy engine into rank 1's heap) is measured in the
same run. Beside every mori row, the floors of the same case (``--no-floors`` skips
them; mori.ep.bench.floors): an empty kernel's graph replay, one device copy of the
call's bytes, and the same call written in plain torch on this GPU, each as GPU time
per call, with mori's kernel time as a multiple of them.

Inter-node kernel types (InterNode, InterNodeV1, InterNodeV1LL; host heaps, or CUDA
heaps where the build has the kernels): ``--gpu-per-node L`` makes emulated nodes of L
ranks and forces the proxy to TCP (``--proxy-transport``); a further table gives per
phase the time, the algo, physical and link bytes and the bytes the proxy moved
(``op._mode.bytes``) with their GB/s, beside a raw TCP stream of the same bytes between
the same processes (on CUDA staged through pinned host memory, as the proxy stages),
mori-io's TCP batch of them and one copy of them in this rank's memory (the floor)
(mori.ep.bench.internode). On CUDA these calls run eagerly, each followed by a stream
synchronisation (nothing may hold the CUDA context while their kernels wait for the
proxy; their graph replays are checked in the tests, not timed here). Processes sharing one GPU (``--world-size`` above
the GPUs; every rank on GPU ``local rank % GPUs``) measure the proxy's overhead and the
kernels' correctness, not a NIC, and run no all_to_all baseline (NCCL cannot put two
ranks on one GPU); with a GPU per process the NCCL baseline runs as for IntraNode.

Without a GPU (or with ``--device cpu``) the CPU implementation runs on a host heap,
the baseline is all_to_all_single over gloo, and times are wall-clock medians of
single calls: that mode checks the bench end to end (CI), its numbers are not the
product's.
"""

from __future__ import annotations

import argparse
import sys

from mori.core import bench as scaffold

from .internode import INTERNODE
from .measure import KERNEL_TYPES
from .report import plot
from .worker import worker

# The package: baseline.py (the all_to_all baseline and the references), floors.py
# (the empty-kernel, copy and plain-torch floors of every row), timing.py
# (events, graphs, profiler), measure.py (one case on one rank), worker.py (one rank),
# report.py (rank 0's tables, JSON and plot); this file is the command line.


def _int_list(text: str) -> list[int]:
    return [int(v) for v in scaffold.comma_list(text)]


def _str_list(text: str) -> list[str]:
    vals = scaffold.comma_list(text)
    for v in vals:
        if v not in ("bf16", "fp8"):
            raise argparse.ArgumentTypeError(f"dtype {v!r} must be bf16 or fp8")
    return vals


COMBINE_QUANTS = ("none", "fp8_blockwise")


def _quant_list(text: str) -> list[str]:
    vals = scaffold.comma_list(text)
    for v in vals:
        if v not in COMBINE_QUANTS:
            raise argparse.ArgumentTypeError(f"combine quant {v!r} must be one of {COMBINE_QUANTS}")
    return vals


def _kernel_list(text: str) -> list[str]:
    vals = scaffold.comma_list(text)
    for v in vals:
        if v not in KERNEL_TYPES:
            raise argparse.ArgumentTypeError(f"kernel type {v!r} must be one of {KERNEL_TYPES}")
    return vals


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mori.ep.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="ranks to spawn (default: visible GPUs, at least 2; 2 on CPU)",
    )
    p.add_argument("--max-tokens", type=int, default=4096, help="max_num_inp_token_per_rank")
    p.add_argument(
        "--tokens",
        type=_int_list,
        default=None,
        help="tokens per rank to sweep, comma separated (default: --max-tokens)",
    )
    p.add_argument("--hidden-dim", type=int, default=7168)
    p.add_argument("--num-experts-per-token", type=int, default=8)
    p.add_argument(
        "--num-experts-per-rank", type=int, default=None, help="default 256 // world size"
    )
    p.add_argument(
        "--dtype",
        type=_str_list,
        default=["bf16", "fp8"],
        help="dispatch dtype(s): bf16, fp8 (e4m3 + fp32 scales per 128 columns); combine is bf16",
    )
    p.add_argument(
        "--block-num",
        type=_int_list,
        default=[24, 96],
        help="CUDA blocks (SMs), one or a comma list",
    )
    p.add_argument("--warp-per-block", type=int, default=16)
    p.add_argument("--iters", type=int, default=20, help="timed trials (median)")
    p.add_argument("--reps", type=int, default=10, help="dispatch+combine pairs per trial")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--no-baseline", action="store_true", help="skip the all_to_all baseline")
    p.add_argument(
        "--no-floors", dest="floors", action="store_false",
        help="skip the floors measured beside every row (empty kernel, a copy of the "
        "call's bytes, the same call in plain torch: see mori.ep.bench.floors)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    scaffold.add_output_args(p, plot_help="PNG of bandwidth vs tokens per rank (needs matplotlib)")
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument(
        "--op-timeout-s", type=float, default=120.0,
        help="the ops' timeout_s: every wait of a call is bounded by it (a lost peer, a "
        "stuck proxy: an error naming it)",
    )  # fmt: skip
    p.add_argument(
        "--kernel-type", type=_kernel_list, default=["IntraNode"],
        help="comma-separated: IntraNode, IntraNodeLL, AsyncLL (MORI's token-major calls; "
        "AsyncLL as send + recv; AsyncLL-ce: its dispatch's rows moved by the copy engines, "
        "MORI_EP_LL_COPY_ENGINE=1), standard-moe (MORI's dispatch_standard_moe / "
        "combine_standard_moe on an IntraNodeLL op, per-rank partials where the op decides "
        "so), standard-moe-rows (the same with one row per (token, expert) sent back: "
        "MORI_EP_LL_PRE_REDUCE=0), deepep-ll (low_latency_dispatch/combine "
        "on an IntraNodeLL op; fp8 = the cast inside dispatch), InterNode, InterNodeV1, "
        "InterNodeV1LL (with --gpu-per-node; on CUDA eager, synchronized calls)",
    )  # fmt: skip
    p.add_argument(
        "--combine-quant", type=_quant_list, default=["none"],
        help="combine quant types, comma separated: none (bf16 rows), fp8_blockwise "
        "(MORI's blockwise fp8 combine; token-major kernel types only)",
    )  # fmt: skip
    p.add_argument(
        "--overlap", action="store_true",
        help="with AsyncLL: also time send + a GEMM + recv against the GEMM alone and the "
        "transfer alone (GEMM sized to --overlap-ratio x the transfer's time)",
    )  # fmt: skip
    p.add_argument("--overlap-ratio", type=float, default=2.0)
    p.add_argument(
        "--gpu-per-node", type=int, default=None,
        help="inter-node kernel types: ranks per emulated node (rank r on node r // this, "
        "MORI_SHMEM_NODE_ID; default: the world, one node); other kernel types need one node",
    )  # fmt: skip
    p.add_argument(
        "--progress", action="store_true",
        help="each rank prints each measuring step of a row with its elapsed seconds to "
        "stderr as it ends (a run cut off by --timeout-s then shows where it was)",
    )  # fmt: skip
    p.add_argument(
        "--proxy-transport", choices=("tcp", "auto"), default="tcp",
        help="inter-node kernel types on emulated nodes: the proxy's transport to other "
        "nodes (MORI_PROXY_TRANSPORT; tcp: the same transport as the raw stream beside it)",
    )  # fmt: skip
    args = p.parse_args(argv)
    args.tokens = args.tokens or [args.max_tokens]
    if args.gpu_per_node is not None:
        if args.gpu_per_node < 1:
            p.error(f"--gpu-per-node {args.gpu_per_node} must be positive")
        intra = [kt for kt in args.kernel_type if kt not in INTERNODE]
        if intra and args.world_size and args.gpu_per_node < args.world_size:
            p.error(f"--gpu-per-node {args.gpu_per_node} splits the ranks into nodes: kernel "
                    f"types {intra} need one node")  # fmt: skip
    if max(args.tokens) > args.max_tokens or min(args.tokens) < 0:
        p.error(f"--tokens {args.tokens} must lie in [0, --max-tokens {args.max_tokens}]")
    return args


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if scaffold.replot(args, lambda doc, path: plot(path, doc["meta"], doc["records"])):
        return
    if scaffold.run_or_launch("mori.ep.bench", argv, args, worker):
        raise SystemExit(1)
