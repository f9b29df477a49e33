# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""What ``python -m mori.ep.bench`` measures beside mori in the same run: dispatch and
combine written with ``torch.distributed.all_to_all_single`` (``a2a_dispatch``,
``a2a_combine``), the bus bandwidth of ``all_to_all_single`` itself, and a copy-engine
peer copy."""

from __future__ import annotations

import statistics

PEER_COPY_BYTES = 256 << 20
# all_to_all_single reference: bytes each rank sends in one call (an equal share to
# every rank), on GPUs over NCCL; on CPU over gloo, smaller (a check, not a number).
A2A_BYTES_CUDA = 256 << 20
A2A_BYTES_CPU = 8 << 20


def a2a_dispatch(x, weights, scales, indices, experts_per_rank, world, group):
    """Naive dispatch with all_to_all_single: one copy of each token per distinct
    destination rank, rows grouped by destination (then token). Returns
    ``(recv_x, recv_meta, state)``; ``state`` is what combine needs."""
    import torch
    import torch.distributed as dist

    n, k = indices.shape
    dest = torch.where(indices >= 0, indices // experts_per_rank, world)
    mask = torch.zeros(n, world + 1, dtype=torch.bool, device=x.device)
    mask.scatter_(1, dest.long(), True)
    mask = mask[:, :world]
    d_of_row, t_of_row = mask.t().nonzero(as_tuple=True)  # ordered by destination rank
    send_counts = mask.sum(0).to(torch.int64)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
    # Tokens as raw bytes (fp8 and bf16 alike), metadata packed into int32 columns.
    row = x.view(torch.uint8).reshape(n, x.size(1) * x.element_size())[t_of_row]
    meta = [indices, weights.view(torch.int32)]
    if scales is not None:
        meta.append(scales.contiguous().view(torch.int32))
    meta = torch.cat(meta, dim=1)[t_of_row]
    recv_x = row.new_empty((sum(recv_split), row.size(1)))
    recv_meta = meta.new_empty((sum(recv_split), meta.size(1)))
    dist.all_to_all_single(recv_x, row, recv_split, send_split, group=group)
    dist.all_to_all_single(recv_meta, meta, recv_split, send_split, group=group)
    recv_x = recv_x.view(x.dtype).reshape(recv_x.size(0), x.size(1))
    return recv_x, recv_meta, (t_of_row, send_split, recv_split, n, k)


def a2a_combine(y, y_weights, state, group):
    """Naive combine: send each row back to its source and sum per token in fp32."""
    import torch
    import torch.distributed as dist

    t_of_row, send_split, recv_split, n, k = state
    # Rows as bytes (gloo has no bf16/int16 all_to_all); NCCL moves them the same.
    row_bytes = y.size(1) * y.element_size()
    back = torch.empty((sum(send_split), row_bytes), dtype=torch.uint8, device=y.device)
    src = y.contiguous().view(torch.uint8).reshape(y.size(0), row_bytes)
    dist.all_to_all_single(back, src, send_split, recv_split, group=group)
    back = back.view(y.dtype).reshape(back.size(0), y.size(1))
    back_w = y_weights.new_empty((sum(send_split), k))
    dist.all_to_all_single(back_w, y_weights, send_split, recv_split, group=group)
    out = torch.zeros(n, y.size(1), dtype=torch.float32, device=y.device)
    out.index_add_(0, t_of_row, back.float())
    out_w = torch.zeros(n, k, dtype=torch.float32, device=y.device)
    out_w.index_add_(0, t_of_row, back_w)
    return out.to(y.dtype), out_w


def a2a_bus_bandwidth(args, world, device, timer, group, cuda) -> dict:
    """all_to_all_single of equal shares, timed like the rest (median over trials,
    slowest rank): algbw = bytes sent per rank / time, busbw = algbw x (W - 1) / W."""
    import torch
    import torch.distributed as dist

    nbytes = (A2A_BYTES_CUDA if cuda else A2A_BYTES_CPU) // world * world
    send = torch.ones(nbytes, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)
    times = []
    for i in range(max(5, args.iters // 2) + 2):
        dist.barrier()
        e0 = timer.mark()
        dist.all_to_all_single(recv, send, group=group)
        e1 = timer.mark()
        timer.sync()
        if i >= 2:  # two warm-up calls (connection set-up)
            times.append(timer.elapsed_us(e0, e1))
    mine = statistics.median(times)
    every = [None] * world
    dist.all_gather_object(every, mine)
    us = max(every)
    algbw = nbytes / us / 1e3
    return {
        "backend": "nccl" if cuda else "gloo",
        "bytes": nbytes,
        "us": us,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * (world - 1) / world,
    }


def peer_copy_gbps(rank, device, timer, barrier, trials: int) -> float | None:
    """Rank 0's copy engine writing ``PEER_COPY_BYTES`` into rank 1's heap through its
    peer view: GB/s, median of ``trials`` (None on the other ranks). Collective: every
    rank allocates the buffer and meets at the barrier."""
    import torch

    from mori.core import shmem

    gbps = None
    buf = shmem.empty((PEER_COPY_BYTES,), torch.uint8)
    if rank == 0:
        view = shmem.peer_view(buf, 1)
        src = torch.ones(PEER_COPY_BYTES, dtype=torch.uint8, device=device)
        view.copy_(src)
        times = []
        for _ in range(trials):
            e0 = timer.mark()
            view.copy_(src)
            e1 = timer.mark()
            timer.sync()
            times.append(timer.elapsed_us(e0, e1))
        gbps = PEER_COPY_BYTES / statistics.median(times) / 1e3
        del view, src
    torch.cuda.synchronize()
    barrier()
    del buf
    return gbps
