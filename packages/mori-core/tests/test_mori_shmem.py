# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
"""mori.shmem, ROCm/mori's shmem names: real processes started as ROCm/mori's
examples start (a torch process group registered as "default") and through a
unique id without torch.distributed; on the host heap (every GPU hidden) and, where
a GPU is visible, on the CUDA heap mori.shmem then picks (2 pes may share a GPU)."""

import struct
from pathlib import Path

import pytest

import mori
import mori.core as mc
from mori.core.testing import new_seed, require_cuda, run_ranks

pytest.importorskip("torch")

WORKER = str(Path(__file__).parent / "workers" / "mori_shmem_worker.py")
ENV = {"MORI_SHMEM_HEAP_SIZE": "16M", "MORI_BOOTSTRAP_TIMEOUT_S": "60"}
# mori.shmem puts the heap on a GPU when torch sees one: the host-heap tests hide them.
CPU_ENV = {**ENV, "CUDA_VISIBLE_DEVICES": ""}


def _run(mode, world, *extra, env=CPU_ENV):
    run_ranks([WORKER, mode, str(new_seed()), *extra], world, timeout_s=180, env=env, who="pe")


@pytest.mark.parametrize("world", [2, 3])
def test_torch_process_group_init_default(world):
    _run("torch-pg", world)


def test_unique_id_init_without_torch_distributed(tmp_path):
    _run("uid", 2, str(tmp_path / "uid"))


@pytest.mark.parametrize("mode", ["torch-pg", "uid"])
def test_cuda_heap_when_a_gpu_is_visible(mode, tmp_path):
    require_cuda()
    extra = [str(tmp_path / "uid")] if mode == "uid" else []
    _run(mode, 2, *extra, env=ENV)


def test_unique_id_round_trip_on_one_pe(monkeypatch):
    monkeypatch.setenv("MORI_BOOTSTRAP_HOST", "127.0.0.1")
    uid = mori.shmem.shmem_get_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    host, port = mori.shmem.api._decode_unique_id(uid)
    assert host == "127.0.0.1" and 0 < port < 65536
    monkeypatch.setenv("MORI_SHMEM_HEAP_SIZE", "4M")
    assert mori.shmem.shmem_init_attr(mori.shmem.MORI_SHMEM_INIT_WITH_UNIQUEID, 0, 1, uid) == 0
    try:
        assert (mori.shmem.shmem_mype(), mori.shmem.shmem_npes()) == (0, 1)
    finally:
        assert mori.shmem.shmem_finalize() == 0


def test_bad_unique_ids_and_flags_name_the_problem():
    ms = mori.shmem
    with pytest.raises(mc.InvalidArgumentError, match="unique_id is 5 bytes, expected 128"):
        ms.shmem_init_attr(ms.MORI_SHMEM_INIT_WITH_UNIQUEID, 0, 1, b"12345")
    with pytest.raises(mc.InvalidArgumentError, match="does not come from mori"):
        ms.shmem_init_attr(ms.MORI_SHMEM_INIT_WITH_UNIQUEID, 0, 1, bytes(128))
    too_new = struct.pack("<7sBH", b"MORIUID", 2, 1234).ljust(128, b"\0")
    with pytest.raises(mc.InvalidArgumentError, match="does not come from mori"):
        ms.shmem_init_attr(ms.MORI_SHMEM_INIT_WITH_UNIQUEID, 0, 1, too_new)
    uid = ms.shmem_get_unique_id()
    with pytest.raises(mc.NotSupportedError, match="MORI_SHMEM_INIT_WITH_MPI_COMM"):
        ms.shmem_init_attr(ms.MORI_SHMEM_INIT_WITH_MPI_COMM, 0, 1, uid)
    with pytest.raises(mc.InvalidArgumentError, match="unknown flags 7"):
        ms.shmem_init_attr(7, 0, 1, uid)
    with pytest.raises(mc.NotSupportedError, match="no MPI bootstrap"):
        ms.shmem_mpi_init()
    with pytest.raises(mc.NotSupportedError, match="no RDMA queue pairs"):
        ms.shmem_num_qp_per_pe()
    assert not mc.shmem.initialized()


def test_process_group_init_needs_torch_distributed():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(mc.InvalidStateError, match="torch.distributed is not initialized"):
        mori.shmem.shmem_torch_process_group_init("default")


def test_names_match_rocm_mori():
    # ROCm/mori's host shmem functions and tensor helpers, by name.
    names = {
        "shmem_torch_process_group_init",
        "shmem_get_unique_id",
        "shmem_init_attr",
        "shmem_mpi_init",
        "shmem_finalize",
        "shmem_mype",
        "shmem_npes",
        "shmem_barrier_all",
        "shmem_barrier_on_stream",
        "shmem_malloc",
        "shmem_malloc_align",
        "shmem_free",
        "shmem_ptr_p2p",
        "shmem_num_qp_per_pe",
        "MORI_SHMEM_INIT_WITH_MPI_COMM",
        "MORI_SHMEM_INIT_WITH_UNIQUEID",
        "MoriShmemBuffer",
        "mori_shmem_create_tensor",
        "mori_shmem_free_tensor",
        "symm_mori_shmem_tensor",
        "mori_shmem_create_tensor_list_intra_node",
    }
    missing = {n for n in names if not hasattr(mori.shmem, n)}
    assert not missing
    assert (mori.shmem.MORI_SHMEM_INIT_WITH_MPI_COMM, mori.shmem.MORI_SHMEM_INIT_WITH_UNIQUEID) == (
        0,
        1,
    )
