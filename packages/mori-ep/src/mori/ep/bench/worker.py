# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""One rank of ``python -m mori.ep.bench``: the heap and the ops, the references, then
every (tokens, dtype, kernel type) case; rank 0 gathers the records and reports."""

from __future__ import annotations

import argparse
import os
import socket
from types import SimpleNamespace

from mori.core import bench as scaffold
from mori.core import env

from .baseline import PEER_COPY_BYTES, a2a_bus_bandwidth, peer_copy_gbps
from .floors import Floors
from .internode import INTERNODE, MoriIoTcp, RawMesh
from .measure import (
    OP_ENV,
    OP_KERNEL_TYPE,
    TOKEN_MAJOR,
    Case,
    measure_deepep,
    measure_overlap,
    measure_standard_moe,
    measure_token_major,
    progress_printer,
)
from .report import report
from .timing import Timer


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from mori.core import shmem
    from mori.ep import (
        _C,
        EpDispatchCombineConfig,
        EpDispatchCombineKernelType,
        EpDispatchCombineOp,
    )

    rank, world, local = scaffold.rank_env()
    # Inter-node kernel types: emulated nodes of --gpu-per-node ranks (the heap maps a
    # node's own ranks only, so other nodes are reached through the op's proxy).
    inter = any(kt in INTERNODE for kt in args.kernel_type)
    gpn = args.gpu_per_node or world
    # MORI_EP_INTERNODE_LINK=heap (the op's copies through a heap that maps every rank:
    # the protocol without the proxy, for comparison) keeps one heap local group.
    heap_link = env.get_str("MORI_EP_INTERNODE_LINK", "proxy") == "heap"
    split = inter and gpn < world and not heap_link  # nodes reached through the proxy
    if split:
        os.environ["MORI_SHMEM_NODE_ID"] = f"bench-node-{rank // gpn}"
        os.environ["MORI_PROXY_TRANSPORT"] = args.proxy_transport
    cuda, dev, _ = scaffold.pick_device(args.device, local, _C)
    device = torch.device("cuda", dev) if cuda else torch.device("cpu")
    dist.init_process_group("gloo", init_method="env://")
    # Ranks sharing a GPU (more processes than GPUs, e.g. emulated nodes on one GPU):
    # NCCL cannot put two ranks on one GPU, so no NCCL baseline runs there.
    places = [None] * world
    dist.all_gather_object(places, (socket.gethostname(), dev))
    shared_gpu = cuda and len(set(places)) < world
    a2a_group = dist.new_group(backend="nccl") if cuda and not shared_gpu else None

    epr = args.num_experts_per_rank or max(1, 256 // world)
    k, hidden, m = args.num_experts_per_token, args.hidden_dim, args.max_tokens
    fp8 = torch.float8_e4m3fn
    scale_dim = hidden // 128

    def shape(dt):
        sd = scale_dim if dt == "fp8" else 0
        return (world, rank, m, k, hidden, 2, sd * 4, epr)

    # (kernel type, combine quant) of every op: fp8_blockwise for token-major ones only.
    kinds = [(kt, cq) for kt in args.kernel_type for cq in args.combine_quant
             if cq == "none" or kt in TOKEN_MAJOR]  # fmt: skip
    heap = 0
    for kt, _ in kinds:
        if kt in INTERNODE:
            kind = int(EpDispatchCombineKernelType[kt])
            heap += sum(_C.internode_buffer_layout(*shape(dt), recv_capacity=world * m, kind=kind,
                                                   local_size=min(gpn, world),
                                                   device=cuda)["total_bytes"]
                        for dt in args.dtype)  # fmt: skip
            continue
        layout = _C.ep_buffer_layout if kt == "IntraNode" else _C.ll_buffer_layout
        heap += sum(layout(*shape(dt))["total_bytes"] for dt in args.dtype)
    # The peer-copy reference needs rank 1 in rank 0's heap (not on another node).
    peer_ref = cuda and world > 1 and not split
    heap += (PEER_COPY_BYTES if peer_ref else 0) + (64 << 20)
    shmem.init(device=dev if cuda else "cpu", heap_size=scaffold.heap_bytes(heap), timeout_s=120)

    def barrier():
        shmem.barrier_all()

    timer = Timer(cuda)
    ops = {}
    for kt, cq, dt in ((kt, cq, dt) for kt, cq in kinds for dt in args.dtype):
        cfg = EpDispatchCombineConfig(
            rank=rank,
            world_size=world,
            hidden_dim=hidden,
            scale_dim=scale_dim if dt == "fp8" else 0,
            scale_type_size=4,
            max_token_type_size=2,
            max_num_inp_token_per_rank=m,
            num_experts_per_rank=epr,
            num_experts_per_token=k,
            warp_num_per_block=args.warp_per_block,
            block_num=max(args.block_num),
            data_type=fp8 if dt == "fp8" else torch.bfloat16,
            kernel_type=EpDispatchCombineKernelType[OP_KERNEL_TYPE.get(kt, kt)],
            quant_type=cq,
            gpu_per_node=gpn,
        )
        saved = os.environ.copy()
        os.environ.update(OP_ENV.get(kt, {}))
        try:
            ops[kt, cq, dt] = EpDispatchCombineOp(cfg, timeout_s=args.op_timeout_s)
        finally:
            for v in OP_ENV.get(kt, {}):
                if v in saved:
                    os.environ[v] = saved[v]
                else:
                    os.environ.pop(v, None)

    peer_copy = None
    if peer_ref:
        peer_copy = peer_copy_gbps(rank, device, timer, barrier, max(5, args.iters // 2))

    a2a_ref = None
    if world > 1 and not args.no_baseline and not shared_gpu:
        a2a_ref = a2a_bus_bandwidth(args, world, device, timer, a2a_group, cuda)

    ctx = SimpleNamespace(
        rank=rank, world=world, epr=epr, k=k, hidden=hidden, m=m, cuda=cuda, device=device,
        timer=timer, barrier=barrier, scale_dim=scale_dim, a2a_group=a2a_group,
        # (tokens, dtype, quant[, "node partials"]) -> the first such kind's combine output
        reference={},
    )  # fmt: skip
    ctx.progress = progress_printer(rank, args.progress)
    ctx.floors = Floors(args, ctx)
    ctx.gpu_per_node = gpn
    ctx.node_of = lambda r: r // gpn
    ctx.shared_gpu = shared_gpu
    ctx.raw_mesh = RawMesh(rank, world, ctx.node_of) if inter and gpn < world else None
    ctx.mori_io = MoriIoTcp.create(ctx) if ctx.raw_mesh is not None else None
    gen = torch.Generator().manual_seed(args.seed * 7919 + rank)
    records, overlaps = [], []
    for n in args.tokens:
        x32 = torch.randn(n, hidden, generator=gen)
        w = torch.rand(n, k, generator=gen).to(device)
        idx = torch.rand(n, epr * world, generator=gen).topk(k, dim=1).indices
        idx = idx.to(torch.int32).to(device)
        sc = (torch.rand(n, scale_dim, generator=gen) + 0.5).to(device)
        for dt in args.dtype:
            x = (x32.to(fp8) if dt == "fp8" else x32.to(torch.bfloat16)).to(device)
            case = Case(n, dt, x, w, sc if dt == "fp8" else None, idx)
            for i, (kt, cq) in enumerate(kinds):
                op = ops[kt, cq, dt]
                if kt == "deepep-ll":
                    bf = x32.to(torch.bfloat16).to(device)
                    records += measure_deepep(args, ctx, op, case, bf)
                elif kt in ("standard-moe", "standard-moe-rows"):
                    records += measure_standard_moe(args, ctx, op, case, kt)
                else:
                    records += measure_token_major(
                        args, ctx, op, case, kt, baseline=i == 0 and cq == "none", quant=cq
                    )
                if kt in ("AsyncLL", "AsyncLL-ce") and args.overlap and cq == "none":
                    overlaps += measure_overlap(args, ctx, op, case, kt)

    gathered, gathered_overlaps = [None] * world, [None] * world
    dist.all_gather_object(gathered, records)
    dist.all_gather_object(gathered_overlaps, overlaps)
    if rank == 0:
        meta = {
            "world_size": world,
            "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "timing": (
                "CUDA events over CUDA graph replays (mori), CUDA events eager (a2a"
                + ("; the inter-node kinds: eager calls, each synchronized)" if inter else ")")
            )
            if cuda
            else "wall clock, CPU implementation (checks the bench, not product numbers)",
            "shared_gpu": shared_gpu,
            "gpus": len(set(places)) if cuda else 0,
            "hidden_dim": hidden,
            "num_experts_per_token": k,
            "num_experts_per_rank": epr,
            "max_tokens": m,
            "warp_per_block": args.warp_per_block,
            "iters": args.iters,
            "reps": args.reps,
            "peer_copy_gbps": peer_copy,
            "floor_empty_us": ctx.floors.empty_us,
            "a2a_reference": a2a_ref,
            "torch": torch.__version__,
            "gpu_per_node": gpn,
            "proxy_transport": (
                ("none (MORI_EP_INTERNODE_LINK=heap)" if heap_link else args.proxy_transport)
                if inter and gpn < world
                else None
            ),
        }
        meta["overlap"] = [r for rs in gathered_overlaps for r in rs]
        report(args, meta, [r for rs in gathered for r in rs])
    if cuda:
        torch.cuda.synchronize()
    barrier()
    if ctx.raw_mesh is not None:
        ctx.raw_mesh.close()
    if ctx.mori_io is not None:
        ctx.mori_io.close()
    for op in ops.values():
        op.close()
    ops.clear()
    import gc

    gc.collect()
    shmem.finalize()
    dist.destroy_process_group()
