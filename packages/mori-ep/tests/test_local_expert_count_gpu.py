# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""ROCm/mori's raw local expert count (``launch_local_expert_count``) on device
addresses: the kernel's counts equal the host reference for random routings (other
ranks' experts, -1, ids past the last expert), whatever the output held before, for
total_recv_token_num below the rows, for launch shapes from one warp to a full grid and
both of its paths (shared-memory histogram, global atomics); it runs on the caller's
stream without a host synchronisation; pinned host memory runs the kernel, pageable
host memory the host count, and a mix of device and pageable addresses is refused.
The host-memory behaviour is in test_local_expert_count.py.

Skipped without a CUDA GPU or a mori build without CUDA.
"""

import random
import time

import pytest
import torch

import mori
import mori.core as mc
from mori.ops.local_expert_count import launch_local_expert_count


def _reference(rank, epr, idx, total):
    lo = rank * epr
    rows = idx[: max(total, 0)].flatten().to(torch.int64)
    local = rows[(rows >= lo) & (rows < lo + epr)] - lo
    return torch.bincount(local, minlength=epr).to(torch.int32)


def _config(rank, world, epr, k, warps=2, blocks=4):
    return mori.cpp.EpDispatchCombineConfig(
        rank=rank, world_size=world, num_experts_per_rank=epr, num_experts_per_token=k,
        warp_num_per_block=warps, block_num=blocks,
    )  # fmt: skip


# (block_num, warp_per_block) of the call; -1: the config's (2 warps x 4 blocks).
SHAPES = [(-1, -1), (1, 1), (3, 2), (1024, 32), (7, -1)]


@pytest.mark.parametrize("epr", [3, 64, 5000])  # 5000: more experts than the shared histogram
def test_device_counts_equal_the_reference(epr, cuda_gpus):
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    gen = torch.Generator().manual_seed(seed)
    stream = torch.cuda.Stream()
    for trial in range(30):
        world = int(torch.randint(1, 9, (1,), generator=gen))
        k = int(torch.randint(1, 10, (1,), generator=gen))
        rank = int(torch.randint(0, world, (1,), generator=gen))
        rows = int(torch.randint(1, 2000, (1,), generator=gen))
        idx = torch.randint(-1, world * epr + 3, (rows, k), generator=gen, dtype=torch.int32)
        total = int(torch.randint(-1, rows + 1, (1,), generator=gen))
        blocks, warps = SHAPES[trial % len(SHAPES)]
        garbage = torch.randint(-(2**31), 2**31 - 1, (epr,), generator=gen, dtype=torch.int32)
        with torch.cuda.stream(stream):
            d_idx, d_tot = idx.cuda(), torch.tensor([total], dtype=torch.int32).cuda()
            out = garbage.cuda()
            launch_local_expert_count(
                _config(rank, world, epr, k), d_idx.data_ptr(), d_tot.data_ptr(), out.data_ptr(),
                block_num=blocks, warp_per_block=warps, stream=stream.cuda_stream,
            )  # fmt: skip
        stream.synchronize()
        want = _reference(rank, epr, idx, total)
        assert torch.equal(out.cpu(), want), (trial, world, k, rank, rows, total, blocks, warps)


def test_runs_on_the_given_stream_without_a_host_synchronisation(cuda_gpus):
    """The count is enqueued after a long sleep on a non-default stream that then writes
    the indices: the call returns while the sleep runs, and its result sees the
    indices (a count on another stream, or before the writes, would see -1s)."""
    stream = torch.cuda.Stream()
    cfg = _config(1, 4, 3, 2)
    with torch.cuda.stream(stream):
        d_idx = torch.full((4, 2), -1, dtype=torch.int32, device="cuda")
        d_tot = torch.zeros(1, dtype=torch.int32, device="cuda")
        out = torch.full((3,), 77, dtype=torch.int32, device="cuda")
        src = torch.tensor([[3, 0], [5, 4], [3, 5], [1, 5]], dtype=torch.int32, device="cuda")
    stream.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000_000)  # about half a second
        d_idx.copy_(src)
        d_tot.fill_(4)
        t0 = time.monotonic()
        launch_local_expert_count(cfg, d_idx.data_ptr(), d_tot.data_ptr(), out.data_ptr(),
                                  stream=stream.cuda_stream)  # fmt: skip
        elapsed = time.monotonic() - t0
        busy = not stream.query()
    stream.synchronize()
    assert busy and elapsed < 0.1, (busy, elapsed)
    assert out.cpu().tolist() == [2, 1, 3]


def test_pinned_host_memory_runs_the_kernel_and_pageable_memory_the_host_count(cuda_gpus):
    cfg = _config(1, 4, 3, 2)
    idx = torch.tensor([[3, 0], [5, 4], [3, 5], [1, 5]], dtype=torch.int32)
    for pin in (True, False):
        h_idx = idx.pin_memory() if pin else idx.clone()
        h_tot = torch.tensor([4], dtype=torch.int32)
        h_out = torch.full((3,), -1, dtype=torch.int32)
        if pin:
            h_tot, h_out = h_tot.pin_memory(), h_out.pin_memory()
        stream = torch.cuda.current_stream().cuda_stream
        launch_local_expert_count(cfg, h_idx.data_ptr(), h_tot.data_ptr(), h_out.data_ptr(),
                                  stream=stream)  # fmt: skip
        torch.cuda.synchronize()
        assert h_out.tolist() == [2, 1, 3], pin
    d_idx = idx.cuda()
    h_tot, h_out = torch.tensor([4], dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    with pytest.raises(mc.InvalidArgumentError, match="indices_ptr is device memory but"):
        launch_local_expert_count(cfg, d_idx.data_ptr(), h_tot.data_ptr(), h_out.data_ptr())


def test_moris_launch_setting_errors_on_device_addresses(cuda_gpus):
    cfg = _config(1, 4, 3, 2, warps=0, blocks=0)
    d_idx = torch.tensor([[3, 4]], dtype=torch.int32, device="cuda")
    d_tot = torch.tensor([1], dtype=torch.int32, device="cuda")
    out = torch.full((3,), -1, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="positive block and warp settings"):
        launch_local_expert_count(cfg, d_idx.data_ptr(), d_tot.data_ptr(), out.data_ptr(),
                                  stream=torch.cuda.current_stream().cuda_stream)  # fmt: skip
    launch_local_expert_count(cfg, d_idx.data_ptr(), d_tot.data_ptr(), out.data_ptr(),
                              block_num=2, warp_per_block=1)  # fmt: skip
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [1, 1, 0]
